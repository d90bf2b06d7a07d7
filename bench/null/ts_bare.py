"""TorchServe's engine alone: a module-level ``handle`` that answers every request with a
text made once (``fixed``'s embedding as our handler encodes it), reading nothing of the
request but whether it is a KServe v2 body (the frontend hands it over parsed) and how many
images it holds."""

from __future__ import annotations

import json

from bench.null import fixed

_VECTOR = [float(x) for x in fixed.embedding()]
_TEXTS: dict[int, str] = {}


def _answer(images: int | None) -> str:
    """``{"embedding": [...]}`` for a raw body (None), a v2 answer of ``images`` rows else."""
    if images not in _TEXTS:
        if images is None:
            body: dict = {"embedding": _VECTOR}
        else:
            body = {
                "model_name": "null",
                "outputs": [
                    {
                        "name": "embedding",
                        "datatype": "FP32",
                        "shape": [images, fixed.EMBEDDING_SIZE],
                        "data": _VECTOR * images,
                    }
                ],
            }
        _TEXTS[images] = json.dumps(body)
    return _TEXTS[images]


def handle(data, context):
    """One fixed answer per request of the batch."""
    answers = []
    for idx, row in enumerate(data or []):
        body = row.get("body") if isinstance(row, dict) else None
        images = len(body["inputs"][0]["data"]) if isinstance(body, dict) else None
        context.set_response_content_type(idx, "application/json")
        context.set_response_header(idx, "X-Batch-Size", str(len(data)))
        answers.append(_answer(images))
    return answers
