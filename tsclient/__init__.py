"""Client side of a running TorchServe: its keys and its management API."""
