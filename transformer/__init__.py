"""The preprocessing server: KServe's transformer in front of either runtime (issue #44).

Uploads (KServe v1 ``instances`` or v2 ``BYTES`` images) are opened, decoded and cropped here
by the core's own ``servecore.preprocessor.Preprocessor`` with the model's handler limits, and
sent on to the predictor as the v2 ``crops`` input (``servecore.crops``: ``UINT8 [n, 224, 224,
3]``, binary over REST or gRPC), so the predictor never decodes. A bad upload fails here,
with the status and body the single server gives it.

    python -m transformer --model_name resnet50-tagger --predictor_host HOST:PORT \
        [--predictor_protocol v2|grpc-v2] [--http_port 8080] [--model_config YAML]

convert.py: requests in, crops and v1 answers out (pure, no KServe); model.py: the
``kserve.Model``; guard.py: the server's own limits and its error bodies; __main__.py: the
command.
"""
