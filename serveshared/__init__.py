"""What the servers and the client share: where a local server listens (``ports``), the key
file both sides read (``keys``, its one error in ``errors``), how Triton says a model is down
(``errors``) and the v2 binary tensor extension's layout (``v2binary``). Small on purpose, and
it imports neither side: the runtime image, the client image, every model archive and every
Triton model folder copy it whole.

    ports.py       where a local TorchServe listens by default
    keys.py        TorchServe's token keys (key_file.json)
    errors.py      the client's root error and the one the key file raises
    v2binary.py    the v2 binary tensor extension, as written and read
    quote.py       how an error message quotes a client's value (cut short, both sides)
    wire.py        the header names and priority classes both sides write and read
"""
