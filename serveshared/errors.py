"""The root of the client's errors (``tsclient.errors`` builds its hierarchy on it) and the one
error the shared key file can raise, so launchers and ``tsctl`` catch the same class."""

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
