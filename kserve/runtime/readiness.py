"""Readiness of TorchServe in our KServe runtime: exit 0 only when every registered model has
at least its minWorkers workers READY, i.e. with the model loaded.

    python /mnt/models/config/readiness.py /mnt/models/config/config.properties

The runtime's exec readinessProbe (``clusterservingruntime.yaml``); ``make kserve-bundle``
packs this file as ``config/readiness.py``. Why not an httpGet probe: in TorchServe 0.12
``/ping`` counts a worker as healthy from the moment it starts, before its model is loaded, and
``/v2/health/ready`` is always true. The management API's describe call reports ``READY`` only
for a worker whose model is loaded; it listens on loopback (``management_address``), reachable
from a probe run inside the container and from nowhere else. Standard library only: it runs
with the image's Python, next to nothing but TorchServe.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

TIMEOUT = 3.0  # seconds per call; the probe's timeoutSeconds bounds the whole run


def management_url(config_path: str) -> str:
    """``management_address`` of a config.properties (0.0.0.0 reached as 127.0.0.1)."""
    with open(config_path, encoding="utf-8") as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep and key.strip() == "management_address":
                return value.strip().rstrip("/").replace("//0.0.0.0:", "//127.0.0.1:")
    return "http://127.0.0.1:8081"  # TorchServe's default


def _get(url: str):
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        return json.load(response)


def not_ready(base: str) -> str | None:
    """Why the server is not ready, or None when every model has its workers loaded."""
    models = _get(f"{base}/models")["models"]
    if not models:
        return "no model registered yet"
    for model in models:
        name = model["modelName"]
        described = _get(f"{base}/models/{name}")[0]  # the default version
        loaded = sum(w["status"] == "READY" for w in described.get("workers", []))
        needed = max(described["minWorkers"], 1)
        if loaded < needed:
            return f"{name}: {loaded} of {needed} workers loaded"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} /mnt/models/config/config.properties", file=sys.stderr)
        return 2
    try:
        reason = not_ready(management_url(argv[1]))
    except (OSError, urllib.error.URLError, ValueError, KeyError, IndexError) as exc:
        reason = f"management API not answering: {exc}"
    if reason:
        print(f"not ready: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
