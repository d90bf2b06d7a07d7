"""TorchServe's requests as the model's ``Incoming``, and its ``BaseHandler`` with the two
routing switches set for a handler that answers every request of a batch on its own. (Its own
module: TorchServe requires the handler module to define exactly one class.)"""

from __future__ import annotations

from functools import partial

from ts.torch_handler.base_handler import BaseHandler

from servecore.config import HandlerConfig
from servecore.parse import BODY_KEYS, parse_request
from servecore.stages import Incoming

TOP_K_HEADER = "x-top-k"
EXPLAIN_PROPERTY = "explain"  # "True" on /explanations and KServe v1 :explain (TorchServe 0.12)


def incoming(context, idx: int, row: dict, config: HandlerConfig) -> Incoming:
    """Request ``idx`` of TorchServe's batch: its id (for the logs), its parsing, its route."""
    return Incoming(
        request_id=str((context.request_ids or {}).get(idx, "?")),
        parse=partial(
            parse_request, row, header_top_k=header(context, idx, TOP_K_HEADER), config=config
        ),
        explain=context.get_request_header(idx, EXPLAIN_PROPERTY) == "True",
    )


def header(context, idx: int, name: str) -> str | None:
    """A request header by case-insensitive name (clients differ in capitalisation)."""
    processor = context.request_processor
    if not processor or idx >= len(processor) or processor[idx] is None:
        return None
    for key, value in processor[idx].get_request_properties().items():
        if key.lower() == name and isinstance(value, str):
            return value
    return None


class PerRequestHandler(BaseHandler):
    """Explanations and describe calls routed per request, not per batch."""

    def _is_explain(self) -> bool:
        """Never BaseHandler's captum path, which would explain the first request's target for
        the whole batch: explanations ride the prediction path (``servecore.explain``)."""
        return False

    def _is_describe(self) -> bool:
        """Only the management API's describe call (one request, no image) is a describe;
        a ``describe: True`` header on a prediction is just a header."""
        processors = self.context.request_processor or []
        if len(processors) != 1 or processors[0] is None:
            return False
        properties = processors[0].get_request_properties()
        if any(key in properties for key in BODY_KEYS):
            return False
        return super()._is_describe()
