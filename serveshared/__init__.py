"""What the servers' launchers and the client share: where a local server listens (``ports``)
and the key file both sides read (``keys``, its one error in ``errors``). Small on purpose: the
Triton runtime image and the client image each copy it whole, and it imports neither side."""
