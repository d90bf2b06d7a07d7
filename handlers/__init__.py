"""TorchServe handler for ResNet50 image embeddings and ImageNet tags."""
