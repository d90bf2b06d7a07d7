"""Ask a running TorchServe where the model looked, and save the heatmap.

    python -m tsclient.explain photo.jpg --out heatmap.png
    python -m tsclient.explain photo.jpg --target tabby --method ig --n-steps 16 --out ig.png

The inference key is read from ``key_file.json`` unless ``--key-file`` says otherwise. The
answer (target label, index, probability, grid) is printed as JSON, without the PNG.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

import requests

from tsclient.keys import Keys


class ExplainError(RuntimeError):
    """The server refused the explanation; ``status`` and its error body."""

    def __init__(self, status: int, body: dict | str) -> None:
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body


def explain(url: str, key: str, model: str, image_path: str | Path, *,
            target: int | str | None = None, topk: int | None = None,
            method: str | None = None, n_steps: int | None = None,
            out_png: str | Path | None = None, timeout: float = 300.0) -> dict:
    """``POST {url}/explanations/{model}`` with one image; returns the answer
    (``{"method", "explanations": [{"label", "index", "probability", "rank", "grid", ...}]}``).
    With ``out_png``, asks for the heatmap and writes the first explanation's PNG there."""
    fields = {"target": target, "topk": topk, "method": method, "n_steps": n_steps,
              "png": "true" if out_png else None}
    image = Path(image_path).read_bytes()
    response = requests.post(
        f"{url.rstrip('/')}/explanations/{model}",
        files={"data": (Path(image_path).name, image)},
        data={k: str(v) for k, v in fields.items() if v is not None},
        headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if response.status_code != 200:
        raise ExplainError(response.status_code, body)
    if out_png:
        Path(out_png).write_bytes(base64.b64decode(body["explanations"][0]["png"]))
    return body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Explain one image: where the model looked")
    parser.add_argument("image")
    parser.add_argument("--out", help="write the heatmap PNG here")
    parser.add_argument("--model", default="resnet50-tagger")
    parser.add_argument("--target", help="class index or label (default: the top-1 class)")
    parser.add_argument("--topk", type=int, help="explain the k most probable classes")
    parser.add_argument("--method", choices=("gradcam", "ig", "occlusion"))
    parser.add_argument("--n-steps", type=int, help="Integrated Gradients steps")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--key-file", default="key_file.json")
    args = parser.parse_args(argv)
    try:
        answer = explain(args.url, Keys.read(args.key_file).inference, args.model, args.image,
                         target=args.target, topk=args.topk, method=args.method,
                         n_steps=args.n_steps, out_png=args.out)
    except ExplainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for item in answer["explanations"]:
        item.pop("png", None)
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
