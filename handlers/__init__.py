"""TorchServe handler for ResNet50 image embeddings and tags (ImageNet's classes or your own).

resnet_handler.py  the BaseHandler subclass TorchServe loads: one ImageModel.run a batch
routing.py         TorchServe's requests as the core's Incoming; a describe batch
ts_metrics.py      the model's metrics through TorchServe's metrics cache
"""
