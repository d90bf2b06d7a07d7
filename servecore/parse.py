"""The wire formats a request may come in, parsed into a ``ParsedRequest``: pure functions of
the values an engine's adapter hands over.

An HTTP request (``HttpRequest``: a raw body, or form fields; ``parse_http``) in one of the forms
we accept:

- raw body (``curl -T img.jpg`` / ``--data-binary``): the image bytes;
- multipart field ``data`` (``curl -F data=@img.jpg``), beside optional fields;
- JSON ``{"data": "<base64>", "topk": 3}`` (as text, or as a ``JsonDocument`` an engine parsed);
- KServe v1 ``{"instances": [...], "parameters": {...}}``;
- KServe v2 / Open Inference Protocol ``{"id", "inputs": [BYTES tensor], "outputs", "parameters"}``,
  the tensor as JSON or after the JSON header (the binary tensor extension: the
  ``Inference-Header-Content-Length`` header), its input encoded images (``BYTES``) or crops
  (``UINT8 [n, 224, 224, 3]``, ``servecore.crops``).

Or a KServe v2 request an engine has already read into tensors (``parse_tensor``: the elements
of its BYTES input and its parameters; ``parse_crops``: its UINT8 crops).

``topk`` may also come as a multipart field or an ``X-Top-K`` header. Explanation parameters are
collected as sent (``ParsedRequest.options``); ``servecore.explain`` reads them. A v1/v2 body's
``parameters.priority`` is the request's class (``servecore.priority``); its ``parameters.timeout``
is refused here (a relative timeout needs an arrival time no engine hands this path).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from servecore.config import HandlerConfig, Output
from servecore.crops import crop_count, crops_of
from servecore.edges.jsonguard import JsonDocument, is_json, load_json
from servecore.errors import InvalidParameter, InvalidRequest, PayloadTooLarge, echo, echo_all
from servecore.priority import PRIORITY_KEY, Priority, parse_priority
from serveshared.v2binary import (
    BINARY_DATA,
    BINARY_OUTPUT,
    HEADER_LENGTH,
    MalformedBinary,
    elements_of,
    fill_inputs,
    split_body,
)
from serveshared.wire import DEADLINE_HEADER

MAX_ID_CHARS = 256  # a v2 request id, echoed in the answer
IMAGE_FIELD = "data"  # the multipart field, or JSON field, that carries the image
PARAM_KEYS = ("topk",)
# Explanation parameters (``/explanations``, KServe v1 ``:explain``): a form field, a JSON
# field or a v1 ``parameters`` key, passed on unread to servecore.explain.
EXPLAIN_KEYS = ("target", "method", "n_steps", "internal_batch_size", "png")


class Protocol(enum.Enum):
    """The wire format a request came in, and so the one its answer goes out in."""

    PLAIN = "plain"  # raw body, multipart field, or {"data": b64}: one image, bare answer
    V1 = "v1"  # KServe v1: {"predictions": [...]}
    V2 = "v2"  # KServe v2 / Open Inference Protocol: named output tensors


@dataclass(frozen=True)
class OutputSpec:
    """One KServe v2 output the client asked for; ``top_k`` only for ``tags``; ``binary``: its
    ``parameters.binary_data`` (None: not said, the request's ``binary_data_output`` decides)."""

    output: Output
    top_k: int | None = None
    binary: bool | None = None


@dataclass(frozen=True)
class ParsedRequest:
    """What one request asks for: its encoded images (or, ``crops``, each image's crop as
    ``servecore.crops`` lays it out) and how to answer."""

    protocol: Protocol
    images: list[bytes]
    top_k: int | None = None
    request_id: str | None = None
    outputs: tuple[OutputSpec, ...] = field(default_factory=tuple)
    options: dict[str, Any] = field(default_factory=dict)  # EXPLAIN_KEYS given, as sent
    priority: Priority | None = None  # the body's parameters.priority; None: not given
    crops: bool = False  # images are preprocessed crops, not encoded images
    binary_output: bool = False  # v2 parameters.binary_data_output: outputs as raw bytes

    def binary(self, output: Output) -> bool:
        """Whether ``output`` goes back in the v2 binary tensor extension: its own
        ``binary_data``, else the request's ``binary_data_output``."""
        own = next((o.binary for o in self.outputs if o.output is output), None)
        return self.binary_output if own is None else own

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


Payload = bytes | bytearray | str | JsonDocument


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request as an engine hands it over: its raw ``body`` (None when it came as form
    fields), its ``form`` fields by name (``data``: the image, ``topk``, the explanation
    parameters) and its ``X-Top-K`` header, if any. A body or ``data`` field is bytes or text,
    or a ``JsonDocument`` when the engine parsed the JSON itself. ``header_length``: the
    ``Inference-Header-Content-Length`` header of a v2 body in the binary tensor extension
    (its JSON header, then the tensors' bytes), None when not sent."""

    body: Payload | None = None
    form: Mapping[str, Any] = field(default_factory=dict)
    top_k_header: Any = None
    header_length: Any = None

    def parse(self, config: HandlerConfig) -> ParsedRequest:
        """This request as the core's ``ParsedRequest`` (``parse_http``)."""
        return parse_http(self, config)


def parse_http(request: HttpRequest, config: HandlerConfig) -> ParsedRequest:
    """Turn one HTTP request into a ``ParsedRequest`` or raise a ``RequestError``.

    Any ``topk`` in the request itself wins over its ``X-Top-K`` header, which is only read
    (and checked) when it is used. ``config``: how many images, how deep and how large a JSON
    body (4xx above).
    """
    parsed = _parse(request, config)
    if parsed.top_k is None and request.top_k_header is not None:
        return dataclasses.replace(parsed, top_k=parse_top_k(request.top_k_header))
    return parsed


def parse_tensor(
    elements: Sequence[bytes],
    *,
    top_k: Any = None,
    request_id: str | None = None,
    config: HandlerConfig,
) -> ParsedRequest:
    """A KServe v2 request an engine has already read (Triton's Python backend): the elements
    of its BYTES input tensor and its ``topk`` request parameter, as a ``ParsedRequest`` or a
    ``RequestError``. An element is an encoded image (the binary tensor extension) or, as a JSON
    body carries it, the image's base64 text; the answer goes out as v2 named tensors."""
    _count_images(len(elements), config)
    if not elements:
        raise InvalidRequest("input 'images' is empty: send at least one image")
    images = [_tensor_image(bytes(item), f"images[{i}]") for i, item in enumerate(elements)]
    return ParsedRequest(
        Protocol.V2,
        images,
        top_k=None if top_k is None else parse_top_k(top_k),
        request_id=request_id,
    )


def parse_crops(
    crops: Any, *, top_k: Any = None, request_id: str | None = None, config: HandlerConfig
) -> ParsedRequest:
    """A KServe v2 request an engine has already read whose input is the ``crops`` tensor
    (an array, ``servecore.crops``), as a ``ParsedRequest`` or a ``RequestError``."""
    count = crop_count(list(getattr(crops, "shape", ())), "input 'crops'")
    _count_images(count, config)
    return ParsedRequest(
        Protocol.V2,
        crops_of(crops, count, "input 'crops'"),
        top_k=None if top_k is None else parse_top_k(top_k),
        request_id=request_id,
        crops=True,
    )


def _tensor_image(item: bytes, where: str) -> bytes:
    """Raw image bytes as they are; base64 text (only ASCII base64 characters, an optional
    ``data:`` prefix) decoded. No image format starts that way: JPEG, PNG, GIF, WebP and TIFF
    headers all hold bytes outside it."""
    if _BASE64_TEXT.fullmatch(item):
        return decode_base64(item.decode("ascii"), where)
    return item


_BASE64_TEXT = re.compile(rb"(data:[\w/+.-]*;base64,)?[A-Za-z0-9+/=_\s-]+")


def _parse(request: HttpRequest, config: HandlerConfig) -> ParsedRequest:
    form = request.form
    unknown = sorted(set(form) - {IMAGE_FIELD} - set(PARAM_KEYS) - set(EXPLAIN_KEYS))
    if unknown:
        raise InvalidParameter(
            f"unknown request parameter(s) {echo_all(unknown)}; accepted: the image as the body or "
            f"form field 'data', 'topk', and for explanations {list(EXPLAIN_KEYS)}"
        )
    options = {k: form[k] for k in EXPLAIN_KEYS if k in form}
    if request.body is None and IMAGE_FIELD not in form:
        raise InvalidRequest("empty request: send an image as the body or as form field 'data'")
    if request.body is not None and IMAGE_FIELD in form:
        raise InvalidRequest("send the image once: as the body or as form field 'data', not both")
    query_top_k = parse_top_k(form["topk"]) if "topk" in form else None
    payload = request.body if request.body is not None else form[IMAGE_FIELD]
    if request.header_length is not None and isinstance(payload, (bytes, bytearray)):
        return _parse_binary(payload, request.header_length, query_top_k, config)
    if isinstance(payload, JsonDocument):
        payload = payload.checked(config)
    elif not is_json(payload):
        data = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
        return ParsedRequest(Protocol.PLAIN, [data], top_k=query_top_k, options=options)
    else:
        payload = load_json(payload, config)
    if not isinstance(payload, dict):
        raise InvalidRequest(
            f'JSON body must be an object such as {{"data": "<base64 image>"}}, '
            f"got {type(payload).__name__}"
        )
    if "inputs" in payload:
        return _parse_v2(payload, query_top_k, config)
    if "instances" in payload:
        return _parse_v1(payload, query_top_k, options, config)
    if "data" in payload:
        extra = sorted(set(payload) - {"data", "topk", *EXPLAIN_KEYS})
        if extra:
            raise InvalidRequest(
                f"unknown JSON field(s) {echo_all(extra)}; expected 'data', "
                f"'topk' and for explanations {list(EXPLAIN_KEYS)}"
            )
        top_k = parse_top_k(payload["topk"]) if "topk" in payload else query_top_k
        options.update((k, payload[k]) for k in EXPLAIN_KEYS if k in payload)
        return ParsedRequest(
            Protocol.PLAIN, [decode_base64(payload["data"], "data")], top_k=top_k, options=options
        )
    raise InvalidRequest(
        "JSON body must have 'data' (base64 image), 'instances' (KServe v1) or 'inputs' "
        f"(KServe v2); got keys {echo_all(sorted(payload))}"
    )


def _parse_binary(
    body: bytes | bytearray, header_length: Any, query_top_k: int | None, config: HandlerConfig
) -> ParsedRequest:
    """A v2 body in the binary tensor extension: its JSON header, its tensors' bytes after."""
    with _as_invalid_request():
        text, data = split_body(body, header_length)
    header = load_json(text, config)
    if not isinstance(header, dict) or "inputs" not in header:
        raise InvalidRequest(
            f"the JSON header of a body with an {HEADER_LENGTH} header must be a KServe v2 "
            "request object with 'inputs'"
        )
    with _as_invalid_request():
        filled = fill_inputs(header, data)
    return _parse_v2(filled, query_top_k, config)


@contextmanager
def _as_invalid_request() -> Iterator[None]:
    """A binary body the shared reader (``serveshared.v2binary``) finds malformed: the
    client's 400, with the reader's message."""
    try:
        yield
    except MalformedBinary as exc:
        raise InvalidRequest(str(exc)) from None


def parse_top_k(value: Any) -> int:
    """``topk`` from a form field, header or JSON value: a positive integer (the model's class
    count bounds it once the model is known: ``check_top_k``)."""
    given = value
    if isinstance(value, (bytes, bytearray)):
        given = value = value.decode("utf-8", "replace")
    if isinstance(value, str) and re.fullmatch(r"\s*\+?[0-9]{1,7}\s*", value):
        value = int(value)
    if type(value) is not int or value < 1:
        raise InvalidParameter(f"topk must be a positive integer, got {echo(given)}")
    return value


def check_top_k(request: ParsedRequest, classes: int, what: str = "the model's classes") -> None:
    """Refuse (400) a ``topk`` above ``classes`` (``what`` they are: the model's, or its
    largest head's), the request's or a v2 output's."""
    for k in (request.top_k, *(o.top_k for o in request.outputs)):
        if k is not None and k > classes:
            raise InvalidParameter(f"topk must be an integer from 1 to {classes} ({what}), got {k}")


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


def _parameters_priority(parameters: Any, where: str) -> Priority | None:
    """A v1/v2 body's ``priority`` parameter (None: not given); its ``timeout`` is refused:
    checked after ``_parameters_top_k``, which has checked that ``parameters`` is an object."""
    if not isinstance(parameters, dict):
        return None
    if "timeout" in parameters:
        raise InvalidParameter(
            f"{where}.timeout is not supported here: TorchServe passes its worker no arrival "
            f"time to count a relative timeout from; send the {DEADLINE_HEADER} header "
            "(absolute Unix time in seconds, e.g. 1764067200.25) instead"
        )
    return parse_priority(parameters[PRIORITY_KEY]) if PRIORITY_KEY in parameters else None


def _count_images(count: int, config: HandlerConfig) -> None:
    """Refuse a request with more images than one may carry, before any of them is read."""
    if count > config.max_images_per_request:
        raise PayloadTooLarge(
            f"request carries {count} images, more than the limit of "
            f"{config.max_images_per_request} (handler.max_images_per_request); split it into "
            "several requests"
        )


def _parse_v1(
    payload: dict, query_top_k: int | None, options: dict, config: HandlerConfig
) -> ParsedRequest:
    instances = _require(payload, "instances", list, "body")
    if not instances:
        raise InvalidRequest("body.instances is empty: send at least one image")
    _count_images(len(instances), config)
    parameters = payload.get("parameters")
    top_k = _parameters_top_k(parameters, "body.parameters", query_top_k)
    priority = _parameters_priority(parameters, "body.parameters")
    given = parameters or {}
    options.update((k, given[k]) for k in EXPLAIN_KEYS if k in given)
    images = [_v1_instance(item, f"instances[{i}]") for i, item in enumerate(instances)]
    return ParsedRequest(Protocol.V1, images, top_k=top_k, options=options, priority=priority)


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
        f'{where} must be {{"data": "<base64>"}} or {{"image": {{"b64": "<base64>"}}}}'
    )


def _parse_v2(payload: dict, query_top_k: int | None, config: HandlerConfig) -> ParsedRequest:
    request_id = payload.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"body.id must be a string, got {type(request_id).__name__}")
    if request_id is not None and len(request_id) > MAX_ID_CHARS:
        raise InvalidRequest(
            f"body.id is {len(request_id)} characters long, more than "
            f"{MAX_ID_CHARS}: the answer echoes it"
        )
    inputs = _require(payload, "inputs", list, "body")
    if len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidRequest(
            "body.inputs must hold exactly one input tensor: base64 images (BYTES) or crops "
            f"(UINT8), got {len(inputs)}"
        )
    tensor = inputs[0]
    name = tensor.get("name", "input-0")
    where = f"inputs[0] ({echo(name)})" if isinstance(name, str) else "inputs[0]"
    if tensor.get("datatype") not in ("BYTES", "UINT8"):
        raise InvalidRequest(
            f'{where}.datatype must be "BYTES" (base64-encoded images) or "UINT8" (crops, '
            f"shape [n, 224, 224, 3]), got {echo(tensor.get('datatype'))}"
        )
    crops = tensor["datatype"] == "UINT8"
    shape = tensor.get("shape")
    if crops:
        count = crop_count(shape, where)
        _count_images(count, config)
        data = crops_of(tensor.get("data"), count, where)
    else:
        data = _bytes_data(tensor, where)
        _count_images(len(data), config)
        if shape not in ([len(data)], [len(data), 1]) or not data:
            raise InvalidRequest(
                f"{where}.shape must be [n] or [n, 1] with n = number of images >= 1 (data holds "
                f"{len(data)}), got {echo(shape)}"
            )
    top_k = _parameters_top_k(payload.get("parameters"), "body.parameters", query_top_k)
    top_k = _parameters_top_k(tensor.get("parameters"), f"{where}.parameters", top_k)
    priority = _parameters_priority(payload.get("parameters"), "body.parameters")
    binary_output = _parameters_flag(payload.get("parameters"), BINARY_OUTPUT, "body.parameters")
    outputs = _v2_outputs(payload.get("outputs"), top_k)
    images = [
        item if isinstance(item, bytes) else decode_base64(item, f"{where}.data[{i}]")
        for i, item in enumerate(data)
    ]
    return ParsedRequest(
        Protocol.V2,
        images,
        top_k=top_k,
        request_id=request_id,
        outputs=outputs,
        priority=priority,
        crops=crops,
        binary_output=bool(binary_output),
    )


def _bytes_data(tensor: dict, where: str) -> list:
    """A BYTES tensor's elements: base64 texts in JSON, raw bytes from the binary extension
    (a view of the body, ``fill_inputs``)."""
    if isinstance(tensor.get("data"), (bytes, memoryview)):
        with _as_invalid_request():
            return elements_of(tensor["data"], where)
    return _require(tensor, "data", list, where)


def _v2_outputs(outputs: Any, top_k: int | None) -> tuple[OutputSpec, ...]:
    if outputs is None:
        return ()
    if not isinstance(outputs, list) or not 1 <= len(outputs) <= len(Output):
        raise InvalidRequest(
            f'body.outputs must be a list of 1 to {len(Output)} {{"name": ...}}, one per output'
        )
    specs = []
    for i, item in enumerate(outputs):
        name = item.get("name") if isinstance(item, dict) else None
        names = [o.value for o in Output]
        if name not in names:
            raise InvalidRequest(f"outputs[{i}].name must be one of {names}, got {echo(name)}")
        output = Output(name)
        where = f"outputs[{i}].parameters"
        k = _parameters_top_k(item.get("parameters"), where, top_k)
        binary = _parameters_flag(item.get("parameters"), BINARY_DATA, where)
        specs.append(OutputSpec(output, k if output is Output.TAGS else None, binary))
    return tuple(specs)


def _parameters_flag(parameters: Any, name: str, where: str) -> bool | None:
    """A boolean parameter of the binary tensor extension (None: not given); checked after
    ``_parameters_top_k``, which has checked that ``parameters`` is an object."""
    if not isinstance(parameters, dict) or name not in parameters:
        return None
    value = parameters[name]
    if not isinstance(value, bool):
        raise InvalidParameter(f"{where}.{name} must be true or false, got {echo(value)}")
    return value
