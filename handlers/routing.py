"""TorchServe's ``BaseHandler`` with its two routing switches set for a handler that answers
every request of a batch on its own. (Its own module: TorchServe requires the handler module to
define exactly one class.)"""
from __future__ import annotations

from ts.torch_handler.base_handler import BaseHandler

from handlers.parse import BODY_KEYS


class PerRequestHandler(BaseHandler):
    """Explanations and describe calls routed per request, not per batch."""

    def _is_explain(self) -> bool:
        """Never BaseHandler's captum path, which would explain the first request's target for
        the whole batch: explanations ride the prediction path (``handlers.explain``)."""
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
