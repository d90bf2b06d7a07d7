"""Every bench report's Markdown is written here, from the data its tool measured: a
``document`` is a title and blocks, one blank line apart (a block: a paragraph, ``bullets``, a
``table``, a ``section``; an empty one is left out); ``fmt`` and ``figure`` write a number
(``n/a`` where it is missing); ``publish`` writes a report, its figures as JSON beside it, and
prints it.

The tables are joined here, not by tabulate: tabulate pads each cell to its column's width,
and the reports in results/ (and the tests that read them) hold one unpadded row a line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path


def fmt(value, digits: int = 1) -> str:
    """A figure: a float to ``digits`` places, ``n/a`` for None or NaN, anything else as is."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def figure(value, places: int = 0) -> str:
    """A figure with its thousands separated (``12,345.6``), ``n/a`` where it is missing."""
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.{places}f}"


def table(header: str | list[str], rows: Iterable[Iterable], align: str = "") -> str:
    """A Markdown table: ``header`` (the columns' names, or one string of them split at
    ``" | "``), then each row, a cell a column (``fmt`` writes those that are not text).
    ``align``: a letter a column, ``l`` or ``r`` (right, for figures); columns it does not reach
    are left-aligned."""
    names = header.split(" | ") if isinstance(header, str) else header
    marks = [" ---: " if a == "r" else " --- " for a in align.ljust(len(names), "l")]
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join(marks) + "|"]
    cells = ([c if isinstance(c, str) else fmt(c) for c in row] for row in rows)
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def bullets(items: Iterable[str | None]) -> str:
    """A list, an item a line (one written as an item already, ``machine.dated()``, kept so);
    empty items are left out."""
    return "\n".join(f"- {item.removeprefix('- ')}" for item in items if item)


def document(title: str, *blocks: str | None, level: int = 1) -> str:
    """``title`` as a heading of ``level``, then each block that is not empty, one blank line
    between, ending in a newline."""
    return "\n\n".join([f"{'#' * level} {title}", *(b.strip("\n") for b in blocks if b)]) + "\n"


def section(heading: str, *blocks: str | None) -> str:
    """A ``##`` section of a document: its heading and blocks."""
    return document(heading, *blocks, level=2)


def write_json(figures, path: Path) -> None:
    """``figures`` as JSON at ``path``; NaN (not JSON) written as null, so that any reader
    loads the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_nan_to_none(figures), indent=2) + "\n")


def publish(path: Path, text: str, figures=None) -> int:
    """A tool's report written to ``path`` (its folder made), ``figures`` (where given) as JSON
    beside it, and the report printed: stdout carries only the report. The exit status, 0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if figures is not None:
        write_json(figures, path.with_suffix(".json"))
    print(text, end="" if text.endswith("\n") else "\n")
    return 0


def _nan_to_none(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value
