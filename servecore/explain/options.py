"""What an explanation request may ask of this model: ``ExplainRules``, a value made once at
load, with which the intake checks a request's parameters into an ``ExplainSpec``
(``servecore.explainvalues``; 400 otherwise, 501 where the model or protocol cannot explain)
when it opens the request, before any of its images is read, and prices its passes for the
batch's budget. Nothing here computes an explanation (``explanations``, the stage, does)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servecore.admission import Budget
from servecore.config import EXPLAIN_METHODS, ExplainConfig
from servecore.errors import InvalidParameter, NotSupported, echo
from servecore.explain.compute import passes
from servecore.explainvalues import ExplainSpec
from servecore.request import ParsedRequest, Protocol
from servecore.stages import Explaining, Opened

EMBEDDING_TARGET = "embedding"  # explain the embedding's own direction, not a class


@dataclass(frozen=True)
class ExplainRules:
    """``handler.explain`` on this model: its ``labels``, whether it explains the embedding
    when no target is named (``embedding_default``: the embedding model) and whether it can
    explain at all (``explains``: the archive carries ``checkpoint``, its PyTorch checkpoint)."""

    config: ExplainConfig
    labels: Sequence[str]
    embedding_default: bool
    checkpoint: str
    explains: bool

    @property
    def budget(self) -> Budget:
        """A batch's explanation passes (``explain.max_passes_per_batch``); predictions cost 0."""
        return Budget(
            "explain.max_passes_per_batch",
            "explanation passes",
            self.config.max_passes_per_batch,
            cost,
        )

    def spec(self, request: ParsedRequest) -> ExplainSpec:
        """An explanation request's checked parameters (4xx; 501 when this model cannot
        explain or the protocol has no explanations; 400 when its passes, for all its images,
        exceed a whole batch's: it could never fit, so it takes no other request's place)."""
        if not self.explains:
            raise NotSupported(
                "this archive carries no PyTorch checkpoint for explanations; "
                f"rebuild it with archive.sh (it packs {self.checkpoint})"
            )
        if request.protocol is Protocol.V2:
            raise NotSupported(
                "explanations answer /explanations/{model} and KServe v1 "
                ":explain; the v2 protocol has no explain route"
            )
        spec = parse_explain(
            request.options, request.top_k, self.labels, self.config, self.embedding_default
        )
        limit, images, each = self.config.max_passes_per_batch, len(request.images), passes(spec)
        if each * images > limit:  # never fits, unlike one that only lost the race
            raise InvalidParameter(
                f"this explanation needs {each * images} forward/backward passes "
                f"({images} image(s) x {each}), more than the limit of {limit} "
                "(handler.explain.max_passes_per_batch); send fewer images, targets or n_steps"
            )
        return spec

    @staticmethod
    def refuse_options(request: ParsedRequest) -> None:
        """A prediction carries no explanation parameters (400)."""
        if request.options:
            raise InvalidParameter(
                f"{sorted(request.options)} only apply to explanations: POST to "
                "/explanations/{model} (or KServe v1 :explain)"
            )


def cost(request: Opened) -> int:
    """A request's forward/backward passes of explanation work (none for a prediction)."""
    if not isinstance(request, Explaining):
        return 0
    return passes(request.spec) * request.image_count


def parse_explain(
    options: dict[str, Any],
    top_k: int | None,
    labels: Sequence[str],
    limits: ExplainConfig,
    embedding_default: bool = False,
) -> ExplainSpec:
    """Check one request's explain parameters (multipart fields arrive as bytes, JSON and
    KServe v1 ``parameters`` as JSON values) against ``limits`` (``handler.explain``); raise
    ``InvalidParameter`` (400) otherwise. ``embedding_default``: with no ``target``, explain the
    embedding (the embedding model) rather than the top class. ``internal_batch_size`` is a
    memory bound (autograd keeps each row's activations): a request may lower it, not raise it.
    """
    options = {k: _text(v) for k, v in options.items()}
    method = options.get("method", limits.method)
    if method not in EXPLAIN_METHODS:
        raise InvalidParameter(f"method must be one of {list(EXPLAIN_METHODS)}, got {echo(method)}")
    n_steps = _int_option(options, "n_steps", limits.n_steps, 1, limits.max_n_steps)
    batch = _int_option(
        options, "internal_batch_size", limits.internal_batch_size, 1, limits.internal_batch_size
    )
    png = _bool_option(options.get("png", False))
    target = options.get("target")
    targets = len(target) if isinstance(target, list) else 1
    k = top_k or 1
    if max(targets, k) > limits.max_targets:  # counted before any target is looked at
        raise InvalidParameter(
            f"at most {limits.max_targets} targets per image (handler.explain.max_targets), "
            f"got {max(targets, k)}; send several requests"
        )
    classes = _classes(target, labels, embedding_default)
    if classes and top_k:
        raise InvalidParameter(
            "give either 'target' (the classes to explain) or 'topk' "
            "(explain the k most probable classes), not both"
        )
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
        raise InvalidParameter(f"{name} must be an integer from {low} to {high}, got {echo(value)}")
    return value


def _bool_option(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise InvalidParameter(f"png must be true or false, got {echo(value)}")


def _classes(target: Any, labels: Sequence[str], embedding_default: bool) -> tuple[int, ...]:
    """A target is a label first (as written, then in any case: labels that differ only in
    case are refused at build time), then ``embedding``; a class index only as a JSON integer
    or ``#3`` (text: a form field), so the labels ``1``..``5`` or ``2019`` are labels."""
    if target is None:
        return (-1,) if embedding_default else ()
    items = target if isinstance(target, list) else [target]
    if not items:
        raise InvalidParameter("target must name at least one class (a label, or #index)")
    exact = {name: i for i, name in reversed(list(enumerate(labels)))}  # the first wins
    any_case = {name.lower(): i for i, name in reversed(list(enumerate(labels)))}
    classes = []
    for item in items:
        text = item.strip() if isinstance(item, str) else ""
        index = re.fullmatch(r"#([0-9]{1,9})", text)
        if text and (text in exact or text.lower() in any_case):
            classes.append(exact[text] if text in exact else any_case[text.lower()])
        elif text.lower() == EMBEDDING_TARGET:
            classes.append(-1)
        elif type(item) is int or index:
            classes.append(_index(int(index.group(1)) if index else item, len(labels)))
        else:
            digits = re.fullmatch("[0-9]+", text)
            raise InvalidParameter(
                f"unknown target class {echo(item)}"
                + (f" (no label {text}; the class index is '#{text}')" if digits else "")
                + f": give one of the model's labels, such as {labels[-1]!r}, a class index "
                f"as '#3' or the JSON integer 3 (0..{len(labels) - 1}), or {EMBEDDING_TARGET!r}"
            )
    return tuple(classes)


def _index(index: int, classes: int) -> int:
    if not 0 <= index < classes:
        raise InvalidParameter(f"target class index {index} is not in 0..{classes - 1}")
    return index
