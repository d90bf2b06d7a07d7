"""The same models on Triton Inference Server: the Python-backend adapter (``model.py``), the
model repository generated from the archives' sources (``generate``), the server from the
``nvidia-pytriton`` wheel laid out to run (``install``) and started on loopback (``server``).

    model.py       the Python-backend adapter: Triton's requests into the core and back
    generate.py    the model repository (config.pbtxt, model files) from the archives' sources
    install.py     the server from the pinned wheel, laid out to run on its own
    server.py      Triton started on loopback, stopped cleanly
    watchdog.py    a model whose stub died loaded again (Triton 2.51 does not)
    metrics.py     the model's metrics through the Python backend's custom metrics API
"""
