"""Which precision a worker serves, given what was measured: the rule, with no timing and no
files (``servecore/autoprecision.py`` measures and remembers).

The rule for ``handler.precision: auto``: among the candidates whose outputs agree with the most
precise one within ``FIDELITY_BOUND``, serve the fastest; a candidate within ``MARGIN`` of the
fastest counts as tied, and a tie keeps the previous choice on this host, else goes to the more
precise candidate (``PRECISE_FIRST``). Speed is the mean over the served batch sizes (1 and the
model's batchSize) of milliseconds per image, so latency when idle and throughput under load
weigh the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from servecore.runtime import Backend

# Most precise first: the order that breaks ties and names the reference.
PRECISE_FIRST = ("f32", "f16", "bf16", "int8+f32", "int8+bf16")
# Timing noise between two runs on one quiet host is a few percent; 10% is "clearly faster".
MARGIN = 0.10
# Against the most precise candidate on the seeded probe batch. 0.99 is the int8 gate's own
# worst-embedding bound (config/int8_gate.yaml); top-1 needs to agree on only three quarters
# of the probe images because synthetic inputs leave near-tied logits that any rounding flips.
FIDELITY_BOUND = {"embedding_cosine_min": 0.99, "top1_agreement": 0.75}


@dataclass(frozen=True)
class Candidate:
    """One precision this worker could serve, the one type from the archive's offer
    (``servecore.backends.precision_candidates``) through the measurement
    (``servecore.autoprecision``) to the rule (``select``) and what describe reports.

    load: loads the runtime at this precision; None when it cannot be loaded here (excluded)
        or when read back from a kept choice.
    ms: batch size -> measured milliseconds per batch (median); empty when not timed.
    fidelity: agreement figures against the reference (``agreement``); None for the reference.
    excluded: why it may not be served (failed fidelity, unsupported here); "" when eligible.
    """

    precision: str
    ms: dict[int, float] = field(default_factory=dict)
    fidelity: dict | None = None
    excluded: str = ""
    load: Callable[[], Backend] | None = field(default=None, compare=False, repr=False)

    @property
    def ms_per_image(self) -> float | None:
        """Mean over the measured batch sizes of ms per image; None when not timed."""
        if not self.ms:
            return None
        return sum(ms / size for size, ms in self.ms.items()) / len(self.ms)

    @classmethod
    def from_dict(cls, row: dict) -> Candidate:
        """The inverse of ``as_dict``."""
        return cls(
            row["precision"],
            {int(k): v for k, v in row["ms_per_batch"].items()},
            row.get("fidelity"),
            row.get("excluded") or "",
        )

    def as_dict(self) -> dict:
        return {
            "precision": self.precision,
            "ms_per_batch": {str(size): round(ms, 1) for size, ms in sorted(self.ms.items())},
            "ms_per_image": None if self.ms_per_image is None else round(self.ms_per_image, 2),
            "fidelity": self.fidelity,
            "excluded": self.excluded or None,
        }


@dataclass(frozen=True)
class Choice:
    """What a worker serves and why. ``measured``: timed at this start (by this worker or
    another of the model); ``source`` says by whom, or that the setting forced it."""

    precision: str
    reason: str
    candidates: tuple[Candidate, ...] = ()
    measured: bool = False
    source: str = ""
    requested: str = "auto"

    def as_dict(self) -> dict:
        """What describe reports; ``summary`` is ``line()`` (what ``tsctl describe`` prints)."""
        fields = {
            "requested": self.requested,
            "choice": self.precision,
            "reason": self.reason,
            "measured": self.measured,
            "source": self.source,
            "margin": MARGIN,
            "fidelity_bound": FIDELITY_BOUND,
            "candidates": [c.as_dict() for c in self.candidates],
        }
        return {**fields, "summary": summary_line(fields)}

    @classmethod
    def from_dict(cls, choice: dict) -> Choice:
        """The inverse of ``as_dict``."""
        fields = {
            "precision": choice["choice"],
            "reason": choice["reason"],
            "candidates": tuple(Candidate.from_dict(c) for c in choice["candidates"]),
            "measured": choice["measured"],
            "source": choice.get("source", ""),
            "requested": choice.get("requested", "auto"),
        }
        return cls(**fields)

    def line(self) -> str:
        """One line for logs and ``tsctl describe``."""
        return self.as_dict()["summary"]


def summary_line(choice: dict) -> str:
    """``Choice.as_dict()`` (e.g. read back from describe) in one line: the choice, each
    candidate's ms per batch (or why it was left out), and the reason."""
    parts = []
    for c in choice.get("candidates", []):
        if c.get("excluded"):
            parts.append(f"{c['precision']} excluded ({c['excluded']})")
        elif c.get("ms_per_batch"):
            timings = "/".join(f"{ms:g}" for ms in c["ms_per_batch"].values())
            sizes = "/".join(c["ms_per_batch"])
            parts.append(f"{c['precision']} {timings} ms at batch {sizes}")
        else:
            parts.append(f"{c['precision']} not timed")
    measured = (
        f"measured by {choice.get('source') or 'this worker'}"
        if choice.get("measured")
        else "not measured"
    )
    chosen: dict = next(
        (c for c in choice.get("candidates", []) if c["precision"] == choice.get("choice")), {}
    )
    fidelity = chosen.get("fidelity")
    # How far the served arithmetic is from f32's answers: what an operator checks first.
    against = (
        f"; vs f32: embedding cosine min {fidelity['embedding_cosine_min']:.4f}, top-1 "
        f"agreement {fidelity['top1_agreement']:.2f}"
        if fidelity
        else ""
    )
    return (
        f"{choice.get('requested', 'auto')} -> {choice.get('choice')} ({measured}"
        f"{'; ' + '; '.join(parts) if parts else ''}): {choice.get('reason')}{against}"
    )


def agreement(
    reference: tuple[np.ndarray, np.ndarray],
    candidate: tuple[np.ndarray, np.ndarray],
    heads: Sequence[slice] = (),
) -> dict:
    """How closely ``candidate``'s (embedding, logits) follow ``reference``'s, per image:
    embedding cosine (mean and worst), top-1 agreement, top-5 overlap (fraction of the
    reference's top 5 among the candidate's top 5; of all its classes when the model has
    fewer than 5, so that a 4-class model agreeing everywhere scores 1). ``heads``: the logit
    columns of each head of a model with several (``servecore.classes``); the class figures
    are then the worst head's, each head ranked on its own."""
    e0, l0 = (np.asarray(a, np.float64) for a in reference)
    e1, l1 = (np.asarray(a, np.float64) for a in candidate)
    cosine = (e0 * e1).sum(1) / (np.linalg.norm(e0, axis=1) * np.linalg.norm(e1, axis=1))
    per_head = [_class_agreement(l0[:, h], l1[:, h]) for h in heads or [slice(None)]]
    return {
        "photos": len(e0),
        "embedding_cosine_mean": float(cosine.mean()),
        "embedding_cosine_min": float(cosine.min()),
        **{name: min(h[name] for h in per_head) for name in per_head[0]},
    }


def _class_agreement(l0: np.ndarray, l1: np.ndarray) -> dict:
    k = min(5, l0.shape[1])
    top5_0, top5_1 = np.argsort(-l0, 1)[:, :k], np.argsort(-l1, 1)[:, :k]
    return {
        "top1_agreement": float((l0.argmax(1) == l1.argmax(1)).mean()),
        "top5_overlap": float(np.mean([len(set(a) & set(b)) / k for a, b in zip(top5_0, top5_1)])),
        # How informative top-1 agreement is: 1 distinct class = every image got the same one.
        "reference_distinct_top1": len(set(l0.argmax(1).tolist())),
    }


def failures(figures: dict, bound: dict) -> list[str]:
    """The figures below their bound, each as ``name measured < bound``."""
    unknown = sorted(set(bound) - set(figures))
    if unknown:
        raise ValueError(f"bound {unknown} names no measured figure; known: {sorted(figures)}")
    return [
        f"{name} {figures[name]:.4f} < {low}" for name, low in bound.items() if figures[name] < low
    ]


def _rank(precision: str) -> int:
    return PRECISE_FIRST.index(precision) if precision in PRECISE_FIRST else len(PRECISE_FIRST)


def select(
    candidates: list[Candidate], previous: str | None = None, margin: float = MARGIN
) -> Choice:
    """The ``auto`` rule (module docstring) over measured ``candidates``.

    Raises ValueError when no candidate is eligible and timed (the reference always is).
    """
    eligible = [c for c in candidates if not c.excluded and c.ms_per_image is not None]
    if not eligible:
        raise ValueError(f"no eligible, timed precision among {[c.precision for c in candidates]}")
    fastest = min(eligible, key=lambda c: (_timed(c), _rank(c.precision)))
    tied = [c for c in eligible if _timed(c) <= _timed(fastest) * (1 + margin)]
    kept = next((c for c in tied if c.precision == previous), None)
    if len(eligible) == 1:
        chosen, why = (
            fastest,
            (
                "the only eligible candidate"
                if len(candidates) > 1
                else "the only candidate this archive and device offer"
            ),
        )
    elif kept is not None and kept is not fastest:
        chosen, why = (
            kept,
            (
                f"kept from the last start on this host: within {margin:.0%} of "
                f"the fastest, {fastest.precision}"
            ),
        )
    elif kept is not None:
        chosen, why = kept, "fastest within fidelity, as at the last start on this host"
    else:
        chosen = min(tied, key=lambda c: _rank(c.precision))
        if chosen is fastest:
            why = "fastest within fidelity" + (
                f" ({_ratio(eligible, chosen)})" if len(tied) == 1 else ""
            )
        else:
            why = f"within {margin:.0%} of the fastest, {fastest.precision}, and more precise"
        if previous and previous != chosen.precision:
            why += f" (the last start on this host served {previous})"
    return Choice(chosen.precision, why, tuple(candidates), measured=True)


def _ratio(eligible: list[Candidate], chosen: Candidate) -> str:
    """``1.6x faster than bf16``: the chosen against the next fastest eligible candidate."""
    others = sorted((c for c in eligible if c is not chosen), key=_timed)
    return f"{_timed(others[0]) / _timed(chosen):.2f}x faster than {others[0].precision}"


def _timed(candidate: Candidate) -> float:
    """``ms_per_image`` of a candidate the caller kept because it was timed."""
    ms = candidate.ms_per_image
    if ms is None:
        raise ValueError(f"{candidate.precision} was not timed")
    return ms


def forced(
    requested: str, served: str, last: list[Candidate] | None = None, margin: float = MARGIN
) -> Choice:
    """An explicit ``handler.precision`` (``requested``; ``served``: what the runtime runs for
    it): no measurement. ``last``: the candidates of the last ``auto`` measurement on this
    host, if any; the reason then says when one of them was clearly faster."""
    reason = f"handler.precision is {requested}: not measured"
    timed = {c.precision: c for c in last or () if not c.excluded and c.ms_per_image}
    own = timed.get(served)
    if own is not None:
        faster = [c for c in timed.values() if _timed(c) * (1 + margin) < _timed(own)]
        if faster:
            best = min(faster, key=_timed)
            reason += (
                f"; the last measurement on this host had {best.precision} "
                f"{_timed(own) / _timed(best):.2f}x faster than {served}"
            )
    return Choice(
        served,
        reason,
        tuple(last or ()),
        measured=False,
        source="handler.precision",
        requested=requested,
    )
