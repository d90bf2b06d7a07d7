"""The HTTP edge (TorchServe's handler, the transformer): an HTTP request in, as the core's
``Incoming``, and a ``Reply``'s values out, as the status and phrase (from the error's kind,
``servecore.edges.bodies``), headers and JSON body (``servecore.edges.bodies``) an HTTP
engine sends. The HTTP names live here, not in the core's values.

An HTTP request (``HttpRequest``: a raw body, or form fields; ``parse_http``) comes in one of
the forms we accept:

- raw body (``curl -T img.jpg`` / ``--data-binary``): the image bytes;
- multipart field ``data`` (``curl -F data=@img.jpg``), beside optional fields;
- JSON ``{"data": "<base64>", "topk": 3}`` (as text, or as a ``JsonDocument`` an engine parsed);
- KServe v1 ``{"instances": [...], "parameters": {...}}``;
- KServe v2 / Open Inference Protocol ``{"id", "inputs": [BYTES tensor], "outputs", "parameters"}``,
  the tensor as JSON or after the JSON header (the binary tensor extension: the
  ``Inference-Header-Content-Length`` header), its input encoded images (``BYTES``) or crops
  (``UINT8 [n, 224, 224, 3]``, ``servecore.crops``).

``topk`` may also come as a multipart field or an ``X-Top-K`` header. A v1/v2 body's
``parameters.priority`` is the request's class (``servecore.priority``); its ``parameters.timeout``
is refused here (a relative timeout needs an arrival time no engine hands this path).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, NamedTuple

from servecore.answers import AnswerSpec
from servecore.config import HandlerConfig, Output
from servecore.crops import crop_count, crops_of
from servecore.edges.bodies import error_body, headers_of, status_of, written_answer
from servecore.edges.jsonguard import JsonDocument, is_json, load_json
from servecore.errors import (
    InvalidParameter,
    InvalidRequest,
    PayloadTooLarge,
    detached,
    echo,
    echo_all,
)
from servecore.priority import PRIORITY_KEY, Priority, parse_priority
from servecore.request import (
    EXPLAIN_KEYS,
    OutputSpec,
    ParsedRequest,
    Protocol,
    count_images,
    decode_base64,
    parse_top_k,
)
from servecore.service import Reply
from servecore.stages import Incoming
from serveshared.v2binary import (
    BINARY_DATA,
    BINARY_OUTPUT,
    HEADER_LENGTH,
    MalformedBinary,
    elements_of,
    fill_inputs,
    split_body,
)
from serveshared.wire import (
    BATCH_HEADER,
    CACHE_HITS_HEADER,
    DEADLINE_HEADER,
    PRECISION_HEADER,
    PRIORITY_HEADER,
)

MAX_ID_CHARS = 256  # a v2 request id, echoed in the answer

IMAGE_FIELD = "data"  # the multipart field, or JSON field, that carries the image

PARAM_KEYS = ("topk",)

CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"  # a JSON header and then raw output bytes


@dataclass(frozen=True)
class HttpEdge:
    """The HTTP edge as one object, what an HTTP engine's adapter (TorchServe's) holds:
    ``decode`` an HTTP request into the core's ``Incoming``, ``encode`` a ``Reply`` as its
    ``HttpReply``. ``servecore.edges.tensor.TensorEdge`` is the same shape for tensors."""

    spec: AnswerSpec
    max_bytes: int  # handler.max_response_bytes

    def decode(
        self,
        request_id: str,
        request: HttpRequest,
        headers: Mapping[str, str | None],
        explain: bool,
    ) -> Incoming:
        """The request as the core takes it, with the class and deadline of its
        ``X-Priority`` and ``X-Deadline`` ``headers`` (found by the engine, whatever their
        case; None: not sent); a bad value fails this request alone. ``explain``: it came on
        an explanation route."""
        return Incoming(request_id, request, explain=explain).classified(
            headers.get(PRIORITY_HEADER), headers.get(DEADLINE_HEADER)
        )

    def encode(self, reply: Reply) -> tuple[Reply, HttpReply]:
        """``reply`` as sent and its HTTP response (``http_reply``): an answer too large to
        send is refused, and the reply sent is its 413."""
        try:
            return reply, http_reply(reply, self.spec, self.max_bytes)
        except PayloadTooLarge as error:
            refused = reply.refused(detached(error))
            return refused, http_reply(refused, self.spec, self.max_bytes)


class HttpReply(NamedTuple):
    """One request's HTTP response: ``status`` and its ``phrase``, ``headers``, its ``body``
    (UTF-8 JSON, or a JSON header and binary v2 outputs) and its ``content_type``."""

    status: int
    phrase: str
    headers: dict[str, str]
    body: bytes
    content_type: str = CONTENT_TYPE


def http_reply(reply: Reply, spec: AnswerSpec, max_bytes: int) -> HttpReply:
    """``reply`` as its HTTP response: ``X-Batch-Size``, then ``X-Precision`` (and
    ``X-Cache-Hits`` when the cache looked, ``Inference-Header-Content-Length`` before binary
    v2 outputs) on an answer, or the error's own headers (``Retry-After``). Raises
    ``PayloadTooLarge`` for an answer whose body would be longer than ``max_bytes``
    (``handler.max_response_bytes``): ``HttpEdge.encode`` then sends that 413."""
    headers = {BATCH_HEADER: str(reply.batch_size)}
    if reply.error is not None:
        status = status_of(reply.error)
        body = json.dumps(error_body(reply.error)).encode()
        return HttpReply(int(status), status.phrase, {**headers, **headers_of(reply.error)}, body)
    body, header_length = written_answer(reply.answer, spec)
    if len(body) > max_bytes:
        raise PayloadTooLarge(
            f"the answer would be {len(body)} bytes, more than the limit of {max_bytes} "
            "(handler.max_response_bytes); send fewer images or ask for less"
        )
    headers[PRECISION_HEADER] = reply.precision
    if reply.cached is not None:
        headers[CACHE_HITS_HEADER] = str(sum(reply.cached))
    if header_length is None:
        return HttpReply(int(HTTPStatus.OK), HTTPStatus.OK.phrase, headers, body)
    headers[HEADER_LENGTH] = str(header_length)
    return HttpReply(int(HTTPStatus.OK), HTTPStatus.OK.phrase, headers, body, BINARY_CONTENT_TYPE)


Body = bytes | bytearray | str | JsonDocument


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request as an engine hands it over: its raw ``body`` (None when it came as form
    fields), its ``form`` fields by name (``data``: the image, ``topk``, the explanation
    parameters) and its ``X-Top-K`` header, if any. A body or ``data`` field is bytes or text,
    or a ``JsonDocument`` when the engine parsed the JSON itself. ``header_length``: the
    ``Inference-Header-Content-Length`` header of a v2 body in the binary tensor extension
    (its JSON header, then the tensors' bytes), None when not sent."""

    body: Body | None = None
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


def _parse_v1(
    payload: dict, query_top_k: int | None, options: dict, config: HandlerConfig
) -> ParsedRequest:
    instances = _require(payload, "instances", list, "body")
    if not instances:
        raise InvalidRequest("body.instances is empty: send at least one image")
    count_images(len(instances), config)
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
        count_images(count, config)
        data = crops_of(tensor.get("data"), count, where)
    else:
        data = _bytes_data(tensor, where)
        count_images(len(data), config)
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
