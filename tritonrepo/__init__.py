"""The same models on Triton Inference Server: the Python-backend adapter (``model.py``), the
model repository generated from the archives' sources (``generate``), the server from the
``nvidia-pytriton`` wheel laid out to run (``install``) and started on loopback (``server``)."""
