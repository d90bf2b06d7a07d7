"""TorchServe 0.12 token authorization: the keys it writes to ``key_file.json``.

The file (mode 0600, in the folder ``torchserve`` was started from) holds the inference key
(``/predictions``, ``/ping``, KServe routes), the management key, each with an
``expiration time`` (``token_expiration_min`` in config.properties), and the API key, which
never expires and is the only key that can rotate the other two (``/token`` on the
management port). TorchServe rewrites the whole file on every rotation.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from serveshared.errors import KeyFileError

KINDS = ("inference", "management")
KEY_FILE = "key_file.json"  # where torchserve writes it: the folder it was started from
# Where tritonrepo.server keeps Triton's keys, from the repository root (Triton has no key file
# of its own; not ./key_file.json, which TorchServe rewrites when it starts in the same folder).
TRITON_KEY_FILE = "build/triton-key_file.json"


@dataclass(frozen=True)
class Keys:
    """The inference and management keys, with their expiry (UTC) and the API key when read
    from a key file."""

    inference: str
    management: str
    api: str | None = None
    inference_expires: datetime | None = None
    management_expires: datetime | None = None

    @classmethod
    def read(cls, path: Path | str = KEY_FILE, settle_s: float = 1.0) -> Keys:
        """Parse a TorchServe key file; ``KeyFileError`` (with a fix) when it is unusable.

        TorchServe rewrites the file in place on a rotation (truncate, then write), so a read
        can meet it empty or half-written: a file that is not JSON is re-read for up to
        ``settle_s`` seconds before it counts as broken (other faults are raised at once)."""
        path = Path(path)
        deadline = time.monotonic() + settle_s
        while True:
            try:
                data = json.loads(path.read_text())
                return cls(
                    inference=data["inference"]["key"],
                    management=data["management"]["key"],
                    api=data.get("API", {}).get("key"),
                    inference_expires=_expiry(data["inference"]),
                    management_expires=_expiry(data["management"]),
                )
            except FileNotFoundError:
                raise KeyFileError(
                    f"no key file at {path.resolve()}",
                    "TorchServe writes key_file.json into the folder it was started from (the "
                    "repository root for `make serve`): run there, or pass --key-file",
                ) from None
            except json.JSONDecodeError as exc:  # empty or cut off: caught mid-rewrite?
                if time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                raise _unreadable(path, exc) from None
            except (OSError, ValueError, KeyError, TypeError) as exc:  # waiting will not help
                raise _unreadable(path, exc) from None

    def key(self, kind: str) -> str:
        return self.inference if kind == "inference" else self.management

    def expires(self, kind: str) -> datetime | None:
        return self.inference_expires if kind == "inference" else self.management_expires

    def expired(self, kind: str, margin_s: float = 0.0, now: datetime | None = None) -> bool:
        """Whether the key expires within ``margin_s`` seconds (False when the expiry is
        unknown)."""
        expires = self.expires(kind)
        now = now or datetime.now(timezone.utc)
        return expires is not None and (expires - now).total_seconds() <= margin_s

    def inference_headers(self) -> dict[str, str]:
        return bearer(self.inference)

    def management_headers(self) -> dict[str, str]:
        return bearer(self.management)


def bearer(key: str | None) -> dict[str, str]:
    """The header TorchServe's token authorization reads (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def _unreadable(path: Path, exc: Exception) -> KeyFileError:
    return KeyFileError(
        f"cannot read the key file {path}: {exc!r}",
        "is the server running with token authorization?",
    )


def _expiry(entry: dict) -> datetime | None:
    """TorchServe writes ``"expiration time": "2026-11-22T10:44:48.123Z"`` (ISO, UTC)."""
    text = entry.get("expiration time")
    if not text:
        return None
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
