"""The root of the client's errors (``serveclient.errors`` builds its hierarchy on it), the one
error the shared key file can raise, so launchers and ``tsctl`` catch the same class, and how
Triton says a model's process is down, read alike by ``tsctl`` and the transformer."""

from __future__ import annotations


class ServeError(Exception):
    """Base error: ``message`` says what went wrong, ``hint`` how to fix it, ``exit_code`` is
    what ``tsctl`` exits with."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message + (f"\nhint: {hint}" if hint else ""))
        self.message = message
        self.hint = hint


class KeyFileError(ServeError):
    """``key_file.json`` is missing or unreadable (or holds no API key to rotate with)."""

    exit_code = 4


# Triton 2.51 while a model's Python-backend stub is dead (500, until tritonrepo/watchdog.py
# notices, within a second) and while the watchdog loads the model again (404): it has no 503
# and no Retry-After for either.
TRITON_RELOADING = "has no available versions"  # "Request for unknown model: 'M' has no ..."
TRITON_STUB_DEAD = "is not healthy"  # "Stub process 'M_0_0' is not healthy."


def triton_model_down(status: int, message: str) -> bool:
    """Whether Triton's answer ``status``/``message`` says the model's process is down or
    being started again: retry in seconds, as a 503."""
    return (status == 404 and TRITON_RELOADING in message) or (
        status == 500 and "Stub process" in message and TRITON_STUB_DEAD in message
    )
