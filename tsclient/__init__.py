"""Clients for a running TorchServe: start/stop a local server, call its management API."""
