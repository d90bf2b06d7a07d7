"""The core's edges: a request as an engine hands it over, in, and a ``Reply`` as the engine
sends it, out. Outside this package only the engines' adapters import it (handlers/,
tritonrepo/, the transformer) and what drives the core as they do (bench/, tests/): the layout
test checks.

    http.py        the HTTP edge (TorchServe's, the transformer's): HttpRequest and its parser
                   (plain body, form fields, KServe v1 and v2 JSON or binary), HttpEdge, HttpReply
    tensor.py      the tensor edge (Triton's): TensorRequest and its parser (images or crops),
                   TensorEdge, output arrays, each error kind's Triton code
    bodies.py      the JSON bodies both write: answers, explanations, errors with each kind's HTTP
                   status (the one table) and Retry-After
    jsonguard.py   a JSON body read within the depth and size limits (JsonDocument)
"""
