"""Self-contained HTML pages of results, for people to look at: ``tsctl similar --html``,
``tsctl duplicates --html``, ``tsctl explain --html`` and ``tsctl head train``'s report.

One file per page, opened from disk: every thumbnail is a small JPEG made here with Pillow and
embedded as a ``data:`` URI, the style is inline, and there is no JavaScript at all (a
Content-Security-Policy forbids any, as a second line behind the escaping). Every path, label
and message goes through ``html.escape``: a file named ``<script>.jpg`` is text. A file that
cannot be read or decoded shows a placeholder with the reason, never a broken image. Captions
link to the originals (``file://`` URIs from ``Path.as_uri``, which percent-encodes).

Size, capped: a page shows at most ``MAX_PICTURES`` pictures and ``PAGE_BUDGET_BYTES`` of
thumbnails, its tables at most ``MAX_TABLE_ROWS`` rows (the confusion table ``MAX_TABLE_LABELS``
labels), and its summary says what it left out. A ``Thumbnailer`` is told how many thumbnails
its page will hold and shrinks them (side, then JPEG quality) to share the budget: a page of
1,000 pairs of photos stays a few MB; a thumbnail past the budget is a placeholder saying so.
A picture is read by ``collection.read_file``, as every file a command sends: only from a
regular file of at most ``collection.MAX_FILE_BYTES``, never from a FIFO, a device or a folder
(each a placeholder naming what it is), so no path can hang a page or fill its memory.

    thumbs = Thumbnailer(expected=len(paths))
    Path("similar.html").write_text(similar_page(results, thumbs, index="v.parquet"))
"""

from __future__ import annotations

import base64
import io
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps

from serveclient.collection import read_file

if TYPE_CHECKING:
    from serveclient.search import Grouped

# (longer side in px, JPEG quality), largest first: the first whose JPEG fits the per-image
# share of the budget is kept, the last is kept whatever its size.
THUMB_STEPS = ((160, 80), (128, 72), (96, 65), (64, 55))
PAGE_BUDGET_BYTES = 4 << 20  # base64 thumbnails per page, at most
MAX_THUMB_BYTES = 24 << 10  # one thumbnail at most, however few the page holds
MAX_PICTURES = 2000  # pictures a page shows at most (1,000 pairs)
MAX_TABLE_ROWS = 1000  # rows of a table on a page
MAX_TABLE_LABELS = 40  # labels of a confusion table (rows and columns)
ORIENTATION_TAG = 0x0112  # EXIF orientation: only photos that carry one are transposed


@dataclass(frozen=True)
class Thumb:
    """One picture as the page shows it: a ``data:`` URI and its size in px, or the reason it
    cannot be shown (``error``). ``width``/``height``/``bytes`` describe the original."""

    uri: str | None
    thumb_size: tuple[int, int] = (0, 0)
    width: int | None = None
    height: int | None = None
    bytes: int | None = None
    error: str | None = None


class Thumbnailer:
    """Thumbnails for one page, each file read once however often the page shows it, within
    ``budget`` bytes (base64) in all: one that no longer fits is a placeholder saying so,
    counted in ``left_out``."""

    def __init__(self, expected: int = 1, budget: int = PAGE_BUDGET_BYTES) -> None:
        expected = max(1, min(expected, MAX_PICTURES))
        self.share = max(1, min(MAX_THUMB_BYTES, budget // expected))
        self.budget, self.spent, self.left_out = budget, 0, 0
        self._cache: dict[str, Thumb] = {}

    def of_path(self, path: str) -> Thumb:
        """The thumbnail of the file at ``path`` (a placeholder's reason when it is missing,
        unreadable, not a regular file, too large or not an image Pillow decodes)."""
        if path not in self._cache:
            try:
                self._cache[path] = self._made(read_file(path)[0])
            except OSError as exc:
                self._cache[path] = Thumb(None, error=f"cannot read: {exc.strerror or exc}")
            except ValueError as exc:
                self._cache[path] = Thumb(None, error=str(exc))
        return self._charged(self._cache[path])

    def of_bytes(self, data: bytes) -> Thumb:
        """The thumbnail of an encoded image (any format Pillow reads)."""
        return self._charged(self._made(data))

    def note(self) -> str:
        """What the budget left out, for a page's summary ("" when nothing)."""
        if not self.left_out:
            return ""
        return (
            f" {self.left_out:,} thumbnail(s) left out: the page's {_bytes(self.budget)} "
            "for thumbnails was spent."
        )

    def _charged(self, thumb: Thumb) -> Thumb:
        """``thumb`` counted against the budget, or its placeholder once the budget is spent."""
        if thumb.uri is None:
            return thumb
        if self.spent + len(thumb.uri) > self.budget:
            self.left_out += 1
            return replace(thumb, uri=None, error="the page's thumbnail budget is spent")
        self.spent += len(thumb.uri)
        return thumb

    def _made(self, data: bytes) -> Thumb:
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                image.draft("RGB", (THUMB_STEPS[0][0], THUMB_STEPS[0][0]))  # JPEG: decode small
                if ORIENTATION_TAG in image.getexif():
                    image = ImageOps.exif_transpose(image)
                image = image.convert("RGB")
                image.thumbnail((THUMB_STEPS[0][0], THUMB_STEPS[0][0]))
                jpeg, size = self._fitted(image)
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            # Pillow's own message ("cannot identify image file ..." names a BytesIO): the kind.
            reason = (
                "not an image Pillow can read"
                if isinstance(exc, Image.UnidentifiedImageError)
                else f"cannot decode: {exc}"
            )
            return Thumb(None, bytes=len(data), error=reason)
        uri = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
        return Thumb(uri, size, width, height, len(data))

    def _fitted(self, image: Image.Image) -> tuple[bytes, tuple[int, int]]:
        """The largest step's JPEG within the per-image share (base64 is 4/3 of the bytes)."""
        for side, quality in THUMB_STEPS:
            small = image.copy()
            small.thumbnail((side, side))
            buffer = io.BytesIO()
            small.save(buffer, "JPEG", quality=quality, optimize=True)
            if len(buffer.getvalue()) * 4 // 3 <= self.share:
                break
        return buffer.getvalue(), small.size


# ---------------------------------------------------------------------- building blocks

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .3em} h2{font-size:1.05em;margin:1.2em 0 .4em}
.summary{color:#555;margin-bottom:1em}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.6em .8em;margin:.8em 0}
.row{display:flex;flex-wrap:wrap;gap:.8em;align-items:flex-start}
figure{margin:0;width:170px}
figure.query{border-right:2px solid #bbb;padding-right:.8em;width:180px}
figure img,.placeholder{display:block;max-width:160px;max-height:160px;border-radius:3px}
.placeholder{width:160px;height:120px;background:repeating-linear-gradient(45deg,#eee,#eee 8px,
#e2e2e2 8px,#e2e2e2 16px);border:1px dashed #b44;color:#822;font-size:12px;
display:flex;align-items:center;justify-content:center;text-align:center;padding:4px;
box-sizing:border-box}
figcaption{font-size:12px;word-break:break-all;margin-top:.3em}
figcaption a{color:#235}
.score{font-weight:600;font-variant-numeric:tabular-nums}
.meta{color:#666}
table.gallery{border-collapse:collapse;background:#fff}
table.gallery td,table.gallery th{border:1px solid #ddd;padding:.5em;vertical-align:top;
text-align:left}
table.gallery td.tags{min-width:14em}
.error{color:#822}
"""
# No script of any kind, images only from the page itself, styles only inline.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def file_uri(path: str) -> str | None:
    """A ``file://`` URI of ``path`` (made absolute), or None when it cannot be one."""
    try:
        return Path(path).absolute().as_uri()
    except ValueError:
        return None


def page(title: str, summary: str, body: Iterable[str]) -> str:
    """A whole document: ``title`` and ``summary`` are plain text (escaped here), ``body`` is
    HTML made by this module's functions."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{escape(title)}</h1><p class="summary">{escape(summary)}</p>\n'
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def picture(thumb: Thumb, alt: str) -> str:
    """The thumbnail as an ``<img>``, or the placeholder naming why it cannot be shown."""
    if thumb.uri is None:
        return (
            f'<div class="placeholder" role="img" aria-label="{escape(alt)}">'
            f"cannot show: {escape(thumb.error or 'unknown error')}</div>"
        )
    width, height = thumb.thumb_size
    return f'<img src="{thumb.uri}" width="{width}" height="{height}" alt="{escape(alt)}">'


def figure(
    thumb: Thumb, path: str, lines: Sequence[str] = (), css: str = "", link: bool = True
) -> str:
    """A thumbnail with its path as caption (a link to the original when ``link``) and
    ``lines`` of plain text under it."""
    uri = file_uri(path) if link else None
    name = escape(path)
    caption = f'<a href="{escape(uri)}">{name}</a>' if uri else name
    extra = "".join(f'<br><span class="meta">{escape(line)}</span>' for line in lines)
    cls = f' class="{escape(css)}"' if css else ""
    return f"<figure{cls}>{picture(thumb, path)}<figcaption>{caption}{extra}</figcaption></figure>"


def describe_file(thumb: Thumb) -> str:
    """``4032x3024, 2.1 MB``: the original's pixels and bytes, as far as known."""
    parts = []
    if thumb.width:
        parts.append(f"{thumb.width}x{thumb.height}")
    if thumb.bytes is not None:
        parts.append(_bytes(thumb.bytes))
    return ", ".join(parts)


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KB" if n < 1024**2 else f"{n / 1024**2:.1f} MB"


# ---------------------------------------------------------------------- the pages


def _fitted(counts: Sequence[int], most: int = MAX_PICTURES) -> list[int]:
    """How many of each item's ``counts`` pictures a page of ``most`` shows: in order, until
    it is full."""
    shown = []
    for n in counts:
        shown.append(min(n, most))
        most -= shown[-1]
    return shown


def left_out(shown: int, total: int, what: str, where: str) -> str:
    """A summary's note of what a page's cap left out and ``where`` the rest is ("" when
    nothing was)."""
    if shown >= total:
        return ""
    return f" Showing {shown:,} of {total:,} {what}: the page's cap; {where} holds them all."


def similar_page(
    results: dict[str, list[dict]], thumbs: Thumbnailer, index: str, model: str
) -> str:
    """``tsctl similar``: per query, the query photo then its neighbours, best first, each
    with its cosine score. ``results``: ``{query: [{"path", "score"}, ...]}``."""
    counts = [1 + len(hits) for hits in results.values()]
    shown = _fitted(counts)
    sections = []
    for (query, hits), room in zip(results.items(), shown):
        if not room:
            break
        row = [figure(thumbs.of_path(query), query, ["query"], css="query")]
        row += [
            figure(thumbs.of_path(h["path"]), h["path"], [f"#{i}  cosine {h['score']:.4f}"])
            for i, h in enumerate(hits[: room - 1], 1)
        ]
        if not hits:
            row.append('<p class="meta">no stored photos</p>')
        sections.append(f'<section><div class="row">{"".join(row)}</div></section>')
    summary = (
        f"{len(results)} quer{'y' if len(results) == 1 else 'ies'} against {index}, "
        f"embedded by {model}; neighbours best first, by cosine similarity."
        + left_out(sum(shown), sum(counts), "photos", "tsctl similar --json")
        + thumbs.note()
    )
    return page("Similar photos", summary, sections)


def duplicates_page(found: Grouped, thumbs: Thumbnailer, index: str, threshold: float) -> str:
    """``tsctl duplicates``: each group side by side with its lowest pair score and each
    file's pixels and bytes. ``found``: ``search.group``'s."""
    groups = found.groups
    shown = _fitted([len(g["paths"]) for g in groups])
    sections = []
    for number, (group, room) in enumerate(zip(groups, shown), 1):
        if not room:
            break
        row = []
        for path in group["paths"][:room]:
            thumb = thumbs.of_path(path)
            row.append(figure(thumb, path, [describe_file(thumb)]))
        sections.append(
            f"<section><h2>Group {number}: {len(group['paths'])} files, cosine "
            f'>= <span class="score">{group["min_score"]:.4f}</span></h2>'
            f'<div class="row">{"".join(row)}</div></section>'
        )
    if not groups:
        sections.append(f"<p>No near-duplicates at cosine >= {threshold}.</p>")
    summary = (
        f"{len(groups)} group(s) of near-duplicates in {index} at cosine >= "
        f"{threshold}: files linked by a chain of pairs at least that similar."
        + found.note
        + left_out(sum(shown), sum(len(g["paths"]) for g in groups), "photos", "--json")
        + thumbs.note()
    )
    return page("Near-duplicate photos", summary, sections)


@dataclass(frozen=True)
class Explained:
    """One photo of an explanation gallery: its thumbnail, the heatmap overlay's (None when it
    failed), the explained targets ``[(label, probability)]``, or the server's error."""

    path: str
    photo: Thumb
    overlay: Thumb | None
    targets: tuple[tuple[str, float], ...] = ()
    error: str | None = None


class ExplainGallery:
    """A ``batchjob.Job`` sink for explanations: each answered row becomes an ``Explained`` at
    once (the PNG heatmap, some 200 KB, shrunk to a thumbnail and dropped), so memory grows by
    two thumbnails per photo, not by the server's answers, up to ``most`` photos: those
    answered later are counted (``left_out``), not kept."""

    def __init__(self, thumbs: Thumbnailer, most: int = MAX_PICTURES // 2) -> None:
        self.thumbs = thumbs
        self.items: list[Explained] = []
        self.most, self.left_out = most, 0  # photos kept (two pictures each), and past them

    def add(self, rows) -> None:
        for row in rows:
            if len(self.items) == self.most:
                self.left_out += 1
                continue
            photo = self.thumbs.of_path(row.path)
            if row.error:
                self.items.append(Explained(row.path, photo, None, error=row.error))
                continue
            found = row.answer["explanations"]
            png = found[0].get("png") if found else None
            overlay = (
                self.thumbs.of_bytes(base64.b64decode(png))
                if png
                else Thumb(None, error="no heatmap in the answer")
            )
            self.items.append(
                Explained(
                    row.path,
                    photo,
                    overlay,
                    tuple((t["label"], float(t["probability"])) for t in found),
                )
            )

    def flush_if_due(self) -> None:
        pass

    def close(self, complete: bool) -> None:
        pass


def explain_page(
    items: Sequence[Explained], model: str, method: str, target: str, dropped: int = 0
) -> str:
    """``tsctl explain --html``: a table of photo | heatmap of the first target | the
    explained targets with their probabilities. ``method`` and ``target`` are named at the
    top (e.g. ``gradcam``, ``the 3 most probable classes``); ``dropped``: the photos answered
    past the gallery's cap (``ExplainGallery.left_out``)."""
    rows = [
        '<table class="gallery"><tr><th>photo</th><th>where the model looked '
        "(first target)</th><th>targets (probability)</th></tr>"
    ]
    for item in items:
        photo = figure(item.photo, item.path, [describe_file(item.photo)])
        if item.error:
            rows.append(
                f"<tr><td>{photo}</td><td>{picture(Thumb(None, error='no heatmap'), '')}"
                f'</td><td class="tags error">{escape(item.error)}</td></tr>'
            )
            continue
        overlay = picture(item.overlay, f"heatmap of {item.path}") if item.overlay else ""
        if item.targets:
            overlay += f'<div class="meta">{escape(item.targets[0][0])}</div>'
        tags = "".join(
            f'<li>{escape(label)} <span class="score">{p:.3f}</span></li>'
            for label, p in item.targets
        )
        rows.append(
            f'<tr><td>{photo}</td><td>{overlay}</td><td class="tags"><ol>{tags}</ol></td></tr>'
        )
    rows.append("</table>")
    failed = sum(1 for i in items if i.error)
    summary = (
        f"{len(items)} photo(s) explained by {model} with {method}, target: {target}"
        + (f"; {failed} failed" if failed else "")
        + ". Heatmaps cover the centre crop "
        "the model saw; the rest is dimmed."
        + left_out(len(items), len(items) + dropped, "photos", "tsctl explain --json")
    )
    return page("Where the model looked", summary, rows)


def write(path: Path, html: str) -> int:
    """Write the page (UTF-8); return its size in bytes. Written to a temporary name of its own
    beside it (``.NAME.<random>.tmp``), fsynced, then renamed: ``path`` holds an old page or the
    new one, whole, however many runs write it at once (the last rename wins). A writer killed
    before its rename leaves its temporary file, never a part of a page under ``path``."""
    data = html.encode("utf-8")
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return len(data)


def head_page(report: dict, mistakes: Sequence[dict], thumbs: Thumbnailer) -> str:
    """``tsctl head train``: the held-out measures (per-label precision and recall, the
    confusion table) and a thumbnail of each held-out mistake, captioned with its true label,
    the predicted one and the head's probability, within the page's caps (report.json holds
    everything). ``mistakes``: ``[{"path", "label", "predicted", "probability"}, ...]``."""
    labels, split = report["labels"], report["split"]
    per_label = "".join(
        f"<tr><td>{escape(label)}</td><td>{m['precision']:.3f}</td><td>{m['recall']:.3f}</td>"
        f"<td>{m['support']}</td></tr>"
        for label, m in list(report["per_label"].items())[:MAX_TABLE_ROWS]
    )
    figures = [
        figure(
            thumbs.of_path(m["path"]),
            m["path"],
            [f"true {m['label']}", f"predicted {m['predicted']} ({m['probability']:.3f})"],
        )
        for m in mistakes[:MAX_PICTURES]
    ]
    sections = [
        "<section><h2>Per label (held out)</h2><table class='gallery'><tr><th>label</th>"
        f"<th>precision</th><th>recall</th><th>photos</th></tr>{per_label}</table></section>",
        _confusion(labels, report["confusion"]),
        f"<section><h2>Mistakes ({len(mistakes)})</h2>"
        + (
            f'<div class="row">{"".join(figures)}</div>'
            if figures
            else '<p class="meta">none: every held-out photo was tagged right</p>'
        )
        + "</section>",
    ]
    summary = (
        f"{len(labels)} labels; {split['train']} photos trained on, {split['held_out']} held out "
        f"(stratified, seed {split['seed']}); held-out accuracy "
        f"{report['held_out_accuracy']:.3f}, expected calibration error "
        f"{report['calibration']['expected_calibration_error']:.3f}."
        + left_out(len(figures), len(mistakes), "mistakes", "report.json")
        + left_out(min(len(labels), MAX_TABLE_ROWS), len(labels), "labels' measures", "report.json")
        + thumbs.note()
    )
    return page("Tagger trained from your folders", summary, sections)


def _confusion(labels: Sequence[str], confusion: dict) -> str:
    """The confusion table's section: every label up to ``MAX_TABLE_LABELS``, else those
    with the most held-out mistakes (as the true or the predicted label), in label order; a
    report too large for a table (``counts`` empty: ``serveclient.head.confusion``) shows its
    most confused pairs instead."""
    title = "<section><h2>Confusion (rows: true label, columns: predicted)</h2>"
    if not confusion["counts"]:
        pairs = confusion["most_confused"][:MAX_TABLE_ROWS]
        rows = "".join(
            f"<tr><td>{escape(p['true'])}</td><td>{escape(p['predicted'])}</td>"
            f"<td>{p['count']}</td></tr>"
            for p in pairs
        )
        more = len(confusion["most_confused"]) - len(pairs) + confusion["most_confused_left_out"]
        return (
            f'{title}<p class="meta">{len(labels)} labels: too many for a table; the most '
            f"confused pairs{f', {more} more mistaken pairs left out' if more else ''}.</p>"
            "<table class='gallery'><tr><th>true</th><th>predicted</th><th>photos</th></tr>"
            f"{rows}</table></section>"
        )
    table = np.asarray(confusion["counts"], np.int64).reshape(len(labels), len(labels))
    shown = list(range(len(labels)))
    note = ""
    if len(labels) > MAX_TABLE_LABELS:
        wrong = table.sum(0) + table.sum(1) - 2 * np.diag(table)
        shown = sorted(np.argsort(-wrong, kind="stable")[:MAX_TABLE_LABELS].tolist())
        note = (
            f'<p class="meta">{MAX_TABLE_LABELS} of {len(labels)} labels: those with the most '
            "mistakes; report.json holds the whole table.</p>"
        )
    head = "".join(f"<th>{escape(labels[i])}</th>" for i in shown)
    rows = "".join(
        f"<tr><th>{escape(labels[i])}</th>"
        + "".join(f"<td>{table[i, j]}</td>" for j in shown)
        + "</tr>"
        for i in shown
    )
    return f"{title}{note}<table class='gallery'><tr><th></th>{head}</tr>{rows}</table></section>"
