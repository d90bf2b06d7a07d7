"""The wire formats: request parsing and response encoding, pure functions testable without
TorchServe.

One TorchServe request arrives as a dict of named inputs. The forms we accept:

- raw body (``curl -T img.jpg`` / ``--data-binary``): ``{"body": <bytes>}``;
- multipart field ``data`` (``curl -F data=@img.jpg``): ``{"data": <bytes>}``;
- JSON ``{"data": "<base64>", "topk": 3}`` (TorchServe has already parsed JSON bodies);
- KServe v1 ``{"instances": [...], "parameters": {...}}``;
- KServe v2 / Open Inference Protocol ``{"id", "inputs": [BYTES tensor], "outputs", "parameters"}``.

``topk`` may also come as a multipart field or an ``X-Top-K`` header. (TorchServe 0.12 drops
query strings on ``/predictions``, so ``?topk=3`` never reaches a handler.)

Each request is answered in the protocol it came in: ``encode_response`` turns the batch's
model outputs (``BatchOutputs``, computed once per batch) into one request's JSON document.

Explanation requests: ``parse_explain`` checks their parameters into an ``ExplainSpec``;
``encode_explanations`` turns the ``Explanation`` results of ``handlers.explain`` into the
answer.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from handlers.errors import InvalidParameter, InvalidRequest, PayloadTooLarge

MAX_TOP_K = 1000
BODY_KEYS = ("body", "data")
PARAM_KEYS = ("topk",)
# Explanation parameters (``/explanations``, KServe v1 ``:explain``), checked by
# ``parse_explain``; a form field, a JSON field or a v1 ``parameters`` key.
EXPLAIN_KEYS = ("target", "method", "n_steps", "internal_batch_size", "png")
EXPLAIN_METHODS = ("gradcam", "ig", "occlusion")  # computed in handlers/explain.py
EMBEDDING_TARGET = "embedding"  # explain the embedding's own direction, not a class


class Protocol(enum.Enum):
    """The wire format a request came in, and so the one its answer goes out in."""

    PLAIN = "plain"  # raw body, multipart field, or {"data": b64}: one image, bare answer
    V1 = "v1"  # KServe v1: {"predictions": [...]}
    V2 = "v2"  # KServe v2 / Open Inference Protocol: named output tensors


class Output(enum.Enum):
    """What a model can answer; both come from the same forward pass. A model's ``task``
    (``handler.task``) is its default output."""

    EMBEDDING = "embedding"
    TAGS = "tags"


@dataclass(frozen=True)
class OutputSpec:
    """One KServe v2 output the client asked for; ``top_k`` only for ``tags``."""

    output: Output
    top_k: int | None = None


@dataclass(frozen=True)
class ParseLimits:
    """Bounds on what one request may make the parser do (``handler.max_*`` settings, read
    by ``HandlerConfig.parse_limits``; these defaults equal that config's)."""

    max_images: int = 64
    max_json_depth: int = 16
    max_json_bytes: int = 32 * 1024 * 1024


@dataclass(frozen=True)
class ParsedRequest:
    """What one request asks for: its encoded images and how to answer."""

    protocol: Protocol
    images: list[bytes]
    top_k: int | None = None
    request_id: str | None = None
    outputs: tuple[OutputSpec, ...] = field(default_factory=tuple)
    options: dict[str, Any] = field(default_factory=dict)  # EXPLAIN_KEYS given, as sent

    def tags_top_k(self, default: int) -> int:
        """How many tags to answer: a v2 ``tags`` output's own ``topk``, else the request's,
        else the model's ``default``."""
        own = next((o.top_k for o in self.outputs if o.output is Output.TAGS and o.top_k), None)
        return own or self.top_k or default

    def wants(self, output: Output, task: Output) -> bool:
        """Whether the answer carries ``output``: the v2 outputs asked for, else the task's."""
        if self.outputs:
            return any(o.output is output for o in self.outputs)
        return output is task


def parse_request(row: dict[str, Any], *, header_top_k: Any = None,
                  limits: ParseLimits = ParseLimits()) -> ParsedRequest:
    """Turn one TorchServe input dict into a ``ParsedRequest`` or raise a ``RequestError``.

    ``header_top_k`` is the request's ``X-Top-K`` header, if any; any ``topk`` in the request
    itself wins over it, and the header is only read (and checked) when it is used.
    ``limits``: how many images, how deep and how large a JSON body (4xx above).
    """
    parsed = _parse(row, limits)
    if len(parsed.images) > limits.max_images:
        raise PayloadTooLarge(
            f"request carries {len(parsed.images)} images, more than the limit of "
            f"{limits.max_images} (handler.max_images_per_request); split it into several "
            "requests"
        )
    if parsed.top_k is None and header_top_k is not None:
        return dataclasses.replace(parsed, top_k=parse_top_k(header_top_k))
    return parsed


def _parse(row: dict[str, Any], limits: ParseLimits) -> ParsedRequest:
    body_keys = [k for k in BODY_KEYS if k in row]
    unknown = sorted(set(row) - set(BODY_KEYS) - set(PARAM_KEYS) - set(EXPLAIN_KEYS))
    if unknown:
        raise InvalidParameter(
            f"unknown request parameter(s) {unknown}; accepted: the image as the body or "
            f"form field 'data', 'topk', and for explanations {list(EXPLAIN_KEYS)}"
        )
    options = {k: row[k] for k in EXPLAIN_KEYS if k in row}
    if not body_keys:
        raise InvalidRequest("empty request: send an image as the body or as form field 'data'")
    if len(body_keys) > 1:
        raise InvalidRequest("send the image once: as the body or as form field 'data', not both")
    query_top_k = parse_top_k(row["topk"]) if "topk" in row else None
    payload = _as_json_if_json(row[body_keys[0]], limits)
    if isinstance(payload, (bytes, bytearray)):
        return ParsedRequest(Protocol.PLAIN, [bytes(payload)], top_k=query_top_k,
                             options=options)
    if not isinstance(payload, dict):
        raise InvalidRequest(
            f"JSON body must be an object such as {{\"data\": \"<base64 image>\"}}, "
            f"got {type(payload).__name__}"
        )
    if "inputs" in payload:
        return _parse_v2(payload, query_top_k)
    if "instances" in payload:
        return _parse_v1(payload, query_top_k, options)
    if "data" in payload:
        extra = sorted(set(payload) - {"data", "topk", *EXPLAIN_KEYS})
        if extra:
            raise InvalidRequest(f"unknown JSON field(s) {extra}; expected 'data', 'topk' and "
                                 f"for explanations {list(EXPLAIN_KEYS)}")
        top_k = parse_top_k(payload["topk"]) if "topk" in payload else query_top_k
        options.update((k, payload[k]) for k in EXPLAIN_KEYS if k in payload)
        return ParsedRequest(Protocol.PLAIN, [decode_base64(payload["data"], "data")], top_k=top_k,
                             options=options)
    raise InvalidRequest(
        "JSON body must have 'data' (base64 image), 'instances' (KServe v1) or 'inputs' "
        f"(KServe v2); got keys {sorted(payload)[:10]}"
    )


def parse_top_k(value: Any) -> int:
    """``topk`` from a form field, header or JSON value: an integer in 1..1000."""
    given = value
    if isinstance(value, (bytes, bytearray)):
        given = value = value.decode("utf-8", "replace")
    if isinstance(value, str) and re.fullmatch(r"\s*\+?[0-9]{1,7}\s*", value):
        value = int(value)
    if type(value) is not int or not 1 <= value <= MAX_TOP_K:
        raise InvalidParameter(f"topk must be an integer from 1 to {MAX_TOP_K}, got {given!r}")
    return value


def decode_base64(value: Any, where: str) -> bytes:
    """Strict base64 (standard or URL-safe alphabet, optional ``data:...;base64,`` prefix)."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be a base64 string, got {type(value).__name__}")
    text = value.strip()
    if text.startswith("data:") and ";base64," in text[:100]:
        text = text.split(",", 1)[1]
    text = "".join(text.split())  # line-wrapped base64 (e.g. `base64` without -w0)
    if "-" in text or "_" in text:
        text = text.replace("-", "+").replace("_", "/")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"{where} is not valid base64 ({exc})") from None
    if not data:
        raise InvalidRequest(f"{where} is empty: expected a base64-encoded image")
    return data


def _as_json_if_json(value: Any, limits: ParseLimits) -> Any:
    """TorchServe parses ``application/json`` bodies; parse JSON sent under other types too.

    Invalid JSON (and JSON too deep for TorchServe's own parser) reaches us as the raw bytes.
    Image formats never start with ``{``, so a body that does is JSON or a client error. Size
    and nesting depth are checked before ``json.loads`` runs, so no body can make it recurse
    deeply; a body TorchServe already parsed is checked for depth too.
    """
    if isinstance(value, str):
        value = value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        if bytes(value[:64]).lstrip()[:1] not in (b"{", b"["):
            return value
        if len(value) > limits.max_json_bytes:
            raise PayloadTooLarge(
                f"JSON body is {len(value)} bytes, more than the limit of "
                f"{limits.max_json_bytes} (handler.max_json_bytes)")
        _check_depth(json_depth(bytes(value), limits.max_json_depth), limits)
        try:
            return json.loads(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"malformed JSON body: {exc}") from None
    if isinstance(value, (dict, list)):
        _check_depth(parsed_depth(value, limits.max_json_depth + 1), limits)
    return value


def _check_depth(depth: int, limits: ParseLimits) -> None:
    if depth > limits.max_json_depth:
        raise InvalidRequest(
            f"JSON body is nested more than {limits.max_json_depth} levels deep "
            "(handler.max_json_depth); a KServe v2 request needs 4")


_STEP = np.zeros(256, dtype=np.int32)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def json_depth(text: bytes, at_most: int | None = None) -> int:
    """The deepest bracket nesting of a JSON text, brackets inside strings not counted; linear
    time, vectorised, no recursion, whatever the text (malformed text gives a number too, and is
    left for ``json.loads`` to refuse). With ``at_most``, a text with no more opening brackets
    than that is not scanned (its depth cannot exceed it): the common case costs two counts."""
    opening = text.count(b"[") + text.count(b"{")
    if at_most is not None and opening <= at_most:
        return opening
    # Escapes only occur inside strings; blank them out pairwise, left to right, so that every
    # remaining quote opens or closes a string.
    text = text.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    codes = np.frombuffer(text, dtype=np.uint8)
    in_string = (np.cumsum(codes == ord('"'), dtype=np.int32) & 1).astype(bool)
    steps = np.where(in_string, 0, _STEP[codes])
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def parsed_depth(value: Any, stop: int) -> int:
    """The nesting depth of parsed JSON (a scalar is 0), found without recursion; stops
    looking once ``stop`` is reached."""
    deepest = 0
    pending = [(value, 1)] if isinstance(value, (dict, list)) else []
    while pending and deepest < stop:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, depth + 1) for child in children
                       if isinstance(child, (dict, list)))
    return deepest


def _require(mapping: dict, key: str, kind: type, where: str) -> Any:
    value = mapping.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidRequest(
            f"{where}.{key} must be a {kind.__name__}, "
            f"got {type(value).__name__ if key in mapping else 'nothing'}"
        )
    return value


def _parameters_top_k(parameters: Any, where: str, default: int | None) -> int | None:
    if parameters is None:
        return default
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"{where} must be an object, got {type(parameters).__name__}")
    return parse_top_k(parameters["topk"]) if "topk" in parameters else default


def _parse_v1(payload: dict, query_top_k: int | None, options: dict) -> ParsedRequest:
    instances = _require(payload, "instances", list, "body")
    if not instances:
        raise InvalidRequest("body.instances is empty: send at least one image")
    parameters = payload.get("parameters")
    top_k = _parameters_top_k(parameters, "body.parameters", query_top_k)
    options.update((k, parameters[k]) for k in EXPLAIN_KEYS if k in (parameters or {}))
    images = [_v1_instance(item, f"instances[{i}]") for i, item in enumerate(instances)]
    return ParsedRequest(Protocol.V1, images, top_k=top_k, options=options)


def _v1_instance(item: Any, where: str) -> bytes:
    if isinstance(item, str):
        return decode_base64(item, where)
    if isinstance(item, dict):
        for key in ("data", "b64", "image_bytes", "image"):
            if key in item:
                value = item[key]
                if isinstance(value, dict) and "b64" in value:
                    return decode_base64(value["b64"], f"{where}.{key}.b64")
                return decode_base64(value, f"{where}.{key}")
    raise InvalidRequest(
        f"{where} must be {{\"data\": \"<base64>\"}} or {{\"image\": {{\"b64\": \"<base64>\"}}}}"
    )


def _parse_v2(payload: dict, query_top_k: int | None) -> ParsedRequest:
    request_id = payload.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"body.id must be a string, got {type(request_id).__name__}")
    inputs = _require(payload, "inputs", list, "body")
    if len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidRequest(
            f"body.inputs must hold exactly one input tensor of base64 images, got {len(inputs)}"
        )
    tensor = inputs[0]
    name = tensor.get("name", "input-0")
    where = f"inputs[0] ({name!r})" if isinstance(name, str) else "inputs[0]"
    if tensor.get("datatype") != "BYTES":
        raise InvalidRequest(
            f"{where}.datatype must be \"BYTES\" (base64-encoded images), "
            f"got {tensor.get('datatype')!r}"
        )
    data = _require(tensor, "data", list, where)
    shape = tensor.get("shape")
    if shape not in ([len(data)], [len(data), 1]) or not data:
        raise InvalidRequest(
            f"{where}.shape must be [n] with n = number of images >= 1 (data holds "
            f"{len(data)}), got {shape!r}"
        )
    top_k = _parameters_top_k(payload.get("parameters"), "body.parameters", query_top_k)
    top_k = _parameters_top_k(tensor.get("parameters"), f"{where}.parameters", top_k)
    outputs = _v2_outputs(payload.get("outputs"), top_k)
    images = [decode_base64(item, f"{where}.data[{i}]") for i, item in enumerate(data)]
    return ParsedRequest(Protocol.V2, images, top_k=top_k, request_id=request_id,
                         outputs=outputs)


def _v2_outputs(outputs: Any, top_k: int | None) -> tuple[OutputSpec, ...]:
    if outputs is None:
        return ()
    if not isinstance(outputs, list) or not outputs:
        raise InvalidRequest("body.outputs must be a non-empty list of {\"name\": ...}")
    specs = []
    for i, item in enumerate(outputs):
        name = item.get("name") if isinstance(item, dict) else None
        names = [o.value for o in Output]
        if name not in names:
            raise InvalidRequest(f"outputs[{i}].name must be one of {names}, got {name!r}")
        output = Output(name)
        k = _parameters_top_k(item.get("parameters"), f"outputs[{i}].parameters", top_k)
        specs.append(OutputSpec(output, k if output is Output.TAGS else None))
    return tuple(specs)


# ---------------------------------------------------------------------------- responses


@dataclass(frozen=True)
class AnswerSpec:
    """How a model answers, fixed when it loads: its name and version (v2 echoes them), its
    task (the default output), the class labels, the default ``topk`` and whether embeddings
    are L2-normalised."""

    model_name: str
    model_version: str
    task: Output
    labels: Sequence[str]
    default_top_k: int
    normalize_embedding: bool


@dataclass(frozen=True)
class TopK:
    """The ``k`` most probable classes of every image row of a batch, most probable first."""

    indices: list[list[int]]
    probabilities: list[list[float]]

    @classmethod
    def of(cls, logits: torch.Tensor, k: int) -> "TopK":
        top = torch.softmax(logits, dim=1).topk(k, dim=1)
        return cls(top.indices.tolist(), top.values.tolist())

    def tags(self, row: int, k: int, labels: Sequence[str]) -> list[dict]:
        """``[{"label", "index", "probability"}, ...]`` of one row, its ``k`` first."""
        return [{"label": labels[i], "index": i, "probability": p}
                for i, p in zip(self.indices[row][:k], self.probabilities[row][:k])]


@dataclass(frozen=True)
class BatchOutputs:
    """The model's answers for every image row of a batch as Python lists, computed once per
    batch: embeddings only when some request wants them, tags up to the largest ``topk``."""

    embeddings: list[list[float]]
    top: TopK

    @classmethod
    def of(cls, embedding: torch.Tensor, logits: torch.Tensor,
           requests: Sequence[ParsedRequest], spec: AnswerSpec) -> "BatchOutputs":
        embeddings: list[list[float]] = []
        if any(r.wants(Output.EMBEDDING, spec.task) for r in requests):
            if spec.normalize_embedding:
                embedding = torch.nn.functional.normalize(embedding, dim=1)
            embeddings = embedding.tolist()
        k = max((r.tags_top_k(spec.default_top_k) for r in requests), default=1)
        return cls(embeddings, TopK.of(logits, k))


def encode_response(request: ParsedRequest, rows: range, outputs: BatchOutputs,
                    spec: AnswerSpec) -> dict | list:
    """One request's JSON answer, in its own protocol, from its image ``rows`` of the batch."""
    k = request.tags_top_k(spec.default_top_k)
    embeddings = ([outputs.embeddings[r] for r in rows]
                  if request.wants(Output.EMBEDDING, spec.task) else None)
    tags = ([outputs.top.tags(r, k, spec.labels) for r in rows]
            if request.wants(Output.TAGS, spec.task) else None)
    if request.protocol is Protocol.V2:
        return _v2_response(spec, request.request_id, embeddings, tags)
    answers = tags if embeddings is None else [{"embedding": e} for e in embeddings]
    return {"predictions": answers} if request.protocol is Protocol.V1 else answers[0]


def _v2_response(spec: AnswerSpec, request_id: str | None,
                 embeddings: list[list[float]] | None, tags: list[list[dict]] | None) -> dict:
    """An Open Inference Protocol response; ``tags`` elements are JSON-encoded strings."""
    outputs = []
    if embeddings is not None:
        outputs.append({
            "name": Output.EMBEDDING.value,
            "datatype": "FP32",
            "shape": [len(embeddings), len(embeddings[0])],
            "data": [x for row in embeddings for x in row],
        })
    if tags is not None:
        outputs.append({
            "name": Output.TAGS.value,
            "datatype": "BYTES",
            "shape": [len(tags), len(tags[0])],
            "data": [json.dumps(t) for row in tags for t in row],
        })
    response = {"model_name": spec.model_name, "model_version": spec.model_version,
                "outputs": outputs}
    if request_id is not None:
        response["id"] = request_id
    return response


# ---------------------------------------------------------------------------- explanations


@dataclass(frozen=True)
class ExplainLimits:
    """The model's explanation defaults and bounds (``handler.explain_*`` settings, read by
    ``HandlerConfig.explain_limits``; these defaults equal that config's)."""

    method: str = "gradcam"
    n_steps: int = 32
    max_n_steps: int = 64
    internal_batch_size: int = 8
    max_targets: int = 5


@dataclass(frozen=True)
class ExplainSpec:
    """What one explanation request asks for. ``classes``: the named classes (indices, or
    ``-1`` for the embedding target); empty means the top ``top_k`` of each image."""

    method: str
    classes: tuple[int, ...]
    top_k: int
    n_steps: int
    internal_batch_size: int
    png: bool


def parse_explain(options: dict[str, Any], top_k: int | None, labels: Sequence[str],
                  limits: ExplainLimits = ExplainLimits(),
                  embedding_default: bool = False) -> ExplainSpec:
    """Check one request's explain parameters (multipart fields arrive as bytes, JSON and
    KServe v1 ``parameters`` as JSON values) against ``limits``; raise ``InvalidParameter``
    (400) otherwise. ``embedding_default``: with no ``target``, explain the embedding (the
    embedding model) rather than the top class."""
    options = {k: _text(v) for k, v in options.items()}
    method = options.get("method", limits.method)
    if method not in EXPLAIN_METHODS:
        raise InvalidParameter(f"method must be one of {list(EXPLAIN_METHODS)}, got {method!r}")
    n_steps = _int_option(options, "n_steps", limits.n_steps, 1, limits.max_n_steps)
    batch = _int_option(options, "internal_batch_size", limits.internal_batch_size, 1, 64)
    png = _bool_option(options.get("png", False))
    classes = _classes(options.get("target"), labels, embedding_default)
    k = top_k or 1
    if len(classes) > limits.max_targets or k > limits.max_targets:
        raise InvalidParameter(
            f"at most {limits.max_targets} targets per image (handler.explain_max_targets), "
            f"got {max(len(classes), k)}; send several requests")
    if classes and top_k:
        raise InvalidParameter("give either 'target' (the classes to explain) or 'topk' "
                               "(explain the k most probable classes), not both")
    return ExplainSpec(method, classes, k, n_steps, batch, png)


def _text(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace").strip()
    return value


def _int_option(options: dict, name: str, default: int, low: int, high: int) -> int:
    value = options.get(name, default)
    if isinstance(value, str) and re.fullmatch(r"\+?[0-9]{1,9}", value.strip()):
        value = int(value)
    if type(value) is not int or not low <= value <= high:
        raise InvalidParameter(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def _bool_option(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise InvalidParameter(f"png must be true or false, got {value!r}")


def _classes(target: Any, labels: Sequence[str], embedding_default: bool) -> tuple[int, ...]:
    if target is None:
        return (-1,) if embedding_default else ()
    items = target if isinstance(target, list) else [target]
    if not items:
        raise InvalidParameter("target must name at least one class (index or label)")
    by_label = {name.lower(): i for i, name in enumerate(labels)}
    classes = []
    for item in items:
        if isinstance(item, str) and re.fullmatch(r"[0-9]{1,4}", item.strip()):
            item = int(item)
        if isinstance(item, str) and item.strip().lower() == EMBEDDING_TARGET:
            classes.append(-1)
        elif type(item) is int and 0 <= item < len(labels):
            classes.append(item)
        elif isinstance(item, str) and item.strip().lower() in by_label:
            classes.append(by_label[item.strip().lower()])
        else:
            raise InvalidParameter(
                f"unknown target class {item!r}: give an ImageNet class index 0..{len(labels) - 1}"
                f", a label such as {labels[281]!r}, or {EMBEDDING_TARGET!r}")
    return tuple(classes)


@dataclass(frozen=True)
class Explanation:
    """One heatmap: for class ``target`` (-1: the embedding), its probability and rank in the
    image's prediction (None for the embedding), ``grid`` [h, w] in [0, 1], ``empty`` when
    nothing supported the target, and the PNG when one was asked for."""

    target: int
    probability: float | None
    rank: int | None
    grid: torch.Tensor
    empty: bool
    png: bytes | None = None


def encode_explanations(protocol: Protocol, method: str,
                        images: Sequence[Sequence[Explanation]], labels: Sequence[str]) -> dict:
    """One request's answer: per image ``{"method", "explanations": [...]}``; the image's
    document itself (plain), or KServe v1's ``{"explanations": [one per instance]}``."""
    answers = [{"method": method, "explanations": [_explanation(e, labels) for e in image]}
               for image in images]
    return {"explanations": answers} if protocol is Protocol.V1 else answers[0]


def _explanation(e: Explanation, labels: Sequence[str]) -> dict:
    if e.target < 0:
        item = {"target": EMBEDDING_TARGET, "label": None, "index": None, "probability": None}
    else:
        item = {"target": "class", "label": labels[e.target], "index": e.target,
                "probability": e.probability, "rank": e.rank}
    item.update(grid=[[round(float(v), 4) for v in line] for line in e.grid], empty=e.empty)
    if e.png is not None:
        item["png"] = base64.b64encode(e.png).decode("ascii")
    return item
