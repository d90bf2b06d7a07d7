"""TorchServe 0.12 token authorization: the keys it writes to ``key_file.json``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Keys:
    """The inference key (``/predictions``, ``/ping``, KServe routes) and management key."""

    inference: str
    management: str

    @classmethod
    def read(cls, path: Path | str = "key_file.json") -> "Keys":
        data = json.loads(Path(path).read_text())
        return cls(inference=data["inference"]["key"], management=data["management"]["key"])

    def inference_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.inference}"}

    def management_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.management}"}
