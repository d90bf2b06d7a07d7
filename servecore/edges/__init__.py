"""The core's edges: a request as an engine hands it over, in, and a ``Reply`` as the engine
sends it, out. Only the adapters import this package (tests/test_layout.py checks).

    http.py        the HTTP edge (TorchServe's): HttpEdge; httperrors.py: each error kind's
                   HTTP status, headers and body; jsonguard.py: JSON bodies read within bounds
    bodies.py      the JSON documents of the answers
    tensor.py      the tensor edge (Triton's): TensorEdge; tensorinput.py: TensorRequest and its
                   parsing; tensoroutput.py: output arrays, Triton's error codes
"""
