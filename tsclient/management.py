"""A small client for TorchServe's management API (register, scale, describe, unregister).

    python -m tsclient.management list
    python -m tsclient.management describe resnet50-tagger
    python -m tsclient.management scale resnet50-tagger --min 2 --max 2
    python -m tsclient.management register resnet50-tagger.mar
    python -m tsclient.management unregister resnet50-tagger

The management key is read from ``key_file.json`` (written by TorchServe in the directory it
was started from) unless ``--key-file`` says otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import requests

from tsclient.keys import Keys


class ManagementError(RuntimeError):
    """The management API answered with an error status; ``status`` and the server message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class ManagementClient:
    """Calls ``http://host:8081`` with the management token. Methods return parsed JSON."""

    def __init__(self, url: str, key: str, timeout: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"
        self.timeout = timeout

    def _call(self, method: str, path: str, **params: Any) -> Any:
        params = {k: v for k, v in params.items() if v is not None}
        response = self.session.request(method, self.url + path, params=params,
                                        timeout=self.timeout)
        try:
            body = response.json()
        except ValueError:
            body = {"message": response.text}
        if response.status_code >= 400:
            message = body.get("message", response.text) if isinstance(body, dict) else body
            raise ManagementError(response.status_code, str(message))
        return body

    def list_models(self) -> list[dict]:
        return self._call("GET", "/models", limit=1000)["models"]

    def describe(self, model: str, version: str | None = None,
                 customized: bool = False) -> list[dict]:
        """One entry per version; with ``customized``, the handler's ``customizedMetadata``
        (our handler's weights, settings, backend) is parsed when it is JSON."""
        path = f"/models/{model}" + (f"/{version}" if version else "")
        entries = self._call("GET", path, customized="true" if customized else None)
        for entry in entries:
            meta = entry.get("customizedMetadata")
            if isinstance(meta, str):
                try:
                    entry["customizedMetadata"] = json.loads(meta)
                except ValueError:
                    pass
        return entries

    def register(self, archive: str, *, initial_workers: int = 1, batch_size: int | None = None,
                 max_batch_delay: int | None = None, response_timeout: int | None = None) -> dict:
        """Register ``archive`` (a file name in the model store, or a URL) and start workers,
        waiting until they are up (``synchronous=true``).

        TorchServe 0.12 ignores ``batch_size``/``max_batch_delay`` when the archive's
        model-config.yaml sets them (ours do): check with ``describe`` what applies."""
        return self._call("POST", "/models", url=archive, initial_workers=initial_workers,
                          batch_size=batch_size, max_batch_delay=max_batch_delay,
                          response_timeout=response_timeout, synchronous="true")

    def scale(self, model: str, min_worker: int, max_worker: int | None = None) -> dict:
        """Set the worker count and wait until it is reached."""
        return self._call("PUT", f"/models/{model}", min_worker=min_worker,
                          max_worker=max_worker if max_worker is not None else min_worker,
                          synchronous="true")

    def unregister(self, model: str, version: str | None = None) -> dict:
        path = f"/models/{model}" + (f"/{version}" if version else "")
        return self._call("DELETE", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="TorchServe management API client")
    parser.add_argument("--url", default="http://127.0.0.1:8081")
    parser.add_argument("--key-file", default="key_file.json")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    describe = sub.add_parser("describe")
    describe.add_argument("model")
    register = sub.add_parser("register")
    register.add_argument("archive")
    register.add_argument("--workers", type=int, default=1)
    register.add_argument("--batch-size", type=int,
                          help="ignored by TorchServe 0.12 if the archive's YAML sets it")
    register.add_argument("--max-batch-delay", type=int,
                          help="ignored by TorchServe 0.12 if the archive's YAML sets it")
    scale = sub.add_parser("scale")
    scale.add_argument("model")
    scale.add_argument("--min", type=int, required=True)
    scale.add_argument("--max", type=int)
    unregister = sub.add_parser("unregister")
    unregister.add_argument("model")
    args = parser.parse_args(argv)

    client = ManagementClient(args.url, Keys.read(args.key_file).management)
    try:
        if args.command == "list":
            result = client.list_models()
        elif args.command == "describe":
            result = client.describe(args.model, customized=True)
        elif args.command == "register":
            result = client.register(args.archive, initial_workers=args.workers,
                                     batch_size=args.batch_size,
                                     max_batch_delay=args.max_batch_delay)
        elif args.command == "scale":
            result = client.scale(args.model, args.min, args.max)
        else:
            result = client.unregister(args.model)
    except ManagementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
