"""The result pages (``tsctl similar|duplicates|explain --html``, serveclient/pages.py), made by
tsctl from a generated album against the session's real TorchServe and opened in headless
Chromium (Debian's, through the ``playwright`` package): every thumbnail loads, the broken and
the missing file show a placeholder, no script from a file name runs and its name is shown as
text; a screenshot of each lands in build/pages/ for a person to look at. Plus the caps,
without a server: a page of 1,000 pairs of noisy photos stays a few MB, no page grows past
its pictures, bytes and table rows whatever it is given (and says what it left out), and a
FIFO, a device, a folder or a huge file among the paths is a placeholder, never a hang."""

from __future__ import annotations

import base64
import copy
import re
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from devtools import pages_demo
from devtools.pages_demo import ONERROR_NAME, SCRIPT_NAME
from serveclient import errors, head, pages
from serveclient.batchjob import Job, Plan, explain_budget
from serveclient.collection import MAX_FILE_BYTES, Entry
from serveclient.search import Grouped
from tests import imagegen
from tests.conftest import REPO
from tests.served import tsctl

SHOTS = REPO / "build" / "pages"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, closed after the module; skipped only where it is not installed."""
    chromium = pages_demo.chromium_path()
    if chromium is None:
        pytest.skip(
            "Debian's chromium is not installed and set-up could not install it "
            "(devtools/ensure_chromium.sh needs apt-get as root or passwordless sudo)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def made(torchserve, tmp_path_factory):
    """The album indexed by ``tsctl embed``, then spoiled, and the three pages tsctl wrote:
    (album, {name: (html path, tsctl's run)})."""
    root = tmp_path_factory.mktemp("pages")
    album = pages_demo.make_album(root, [imagegen.jpeg(320, 240, seed=3000 + i) for i in range(4)])
    index = root / "album.parquet"
    run = tsctl(torchserve, "embed", str(album.root / "album"), "--out", str(index))
    assert run.returncode == 0, run.stderr
    pages_demo.spoil(album)
    runs = {
        name: tsctl(torchserve, *argv)
        for name, argv in pages_demo.page_commands(album, index, root).items()
    }
    return album, {name: (root / f"{name}.html", run) for name, run in runs.items()}


def _checked(browser, html: Path, name: str) -> pages_demo.PageView:
    """The page as Chromium shows it, with what every page must hold: thumbnails that load,
    no script run or in the DOM, the hostile names as literal text."""
    view = pages_demo.look(browser, html, SHOTS / f"{name}.png")
    assert view.images, "no thumbnails on the page"
    assert [alt for alt, width in view.images if width <= 0] == []
    assert view.dialogs == []
    assert view.scripted == 0
    assert (SHOTS / f"{name}.png").stat().st_size > 0
    return view


def test_similar_page_shows_the_query_its_neighbours_and_placeholders(made, browser):
    album, runs = made
    html, run = runs["similar"]
    assert run.returncode == 0, run.stderr
    assert f"wrote {html}" in run.stdout
    view = _checked(browser, html, "similar")
    # The query and its 5 neighbours: the two hostile copies first (cosine 1), then 3 more, of
    # which the broken and the deleted file show placeholders, not thumbnails.
    shown = len(view.images) + len(view.placeholders)
    assert shown == 6, (view.images, view.placeholders)
    alts = [alt for alt, _ in view.images]
    assert alts[0] == str(album.query)
    assert sorted(alts[1:3]) == sorted(map(str, album.hostile))  # equal scores: either order
    assert SCRIPT_NAME in view.text and ONERROR_NAME in view.text
    assert "cosine 1.0000" in view.text
    # Each caption links to its original, the hostile name percent-encoded in the URI.
    links = [urllib.parse.unquote(link) for link in view.links]
    assert links[0] == "file://" + str(album.query)
    assert sorted(links[1:3]) == sorted("file://" + str(p) for p in album.hostile)


def test_duplicates_page_shows_each_group_with_placeholders_for_bad_files(made, browser):
    album, runs = made
    html, run = runs["duplicates"]
    assert run.returncode == 0, run.stderr
    view = _checked(browser, html, "duplicates")
    assert "3 group(s)" in view.text
    assert "Group 1: 3 files" in view.text  # the query and its two hostile copies
    assert sorted(p.split("\n")[0] for p in view.placeholders) == [
        "cannot show: cannot read: No such file or directory",
        "cannot show: not an image Pillow can read",
    ]
    assert SCRIPT_NAME in view.text and ONERROR_NAME in view.text
    assert str(album.gone) in view.text and str(album.broken) in view.text
    assert "320x240" in view.text  # each file's pixels


def test_explain_gallery_names_method_and_target_and_shows_heatmaps(made, browser):
    album, runs = made
    html, run = runs["explain"]
    # The file that is no image fails (exit 7, some files failed); the rest are explained.
    assert run.returncode == 7, run.stderr
    assert "2 explained, 1 failed" in run.stdout
    view = _checked(browser, html, "explain")
    assert "with gradcam, target: the 3 most probable classes" in view.text
    # Two photos, each beside its heatmap; the failed file: two placeholders and the error.
    assert len(view.images) == 4, view.images
    assert sum(alt.startswith("heatmap of ") for alt, _ in view.images) == 2
    assert len(view.placeholders) == 2
    assert str(album.explain_broken) in view.text
    assert SCRIPT_NAME in view.text
    assert view.text.count("0.") >= 6  # three probabilities per explained photo


def test_a_page_of_a_thousand_pairs_stays_a_few_mb(tmp_path):
    # Noisy photos compress worst; 40 files stand for 2,000 (each shown once per pair).
    paths = []
    for i in range(40):
        path = tmp_path / f"p{i}.jpg"
        path.write_bytes(imagegen.jpeg(640, 480, seed=i))
        paths.append(str(path))
    groups = [
        {"paths": [paths[i % 40], paths[(i + 1) % 40]], "min_score": 0.98} for i in range(1000)
    ]
    found = Grouped(groups, 1000, complete=True)
    html = pages.duplicates_page(found, pages.Thumbnailer(expected=2000), "x.parquet", 0.97)
    assert len(html.encode()) < pages.PAGE_BUDGET_BYTES + 1_000_000
    assert html.count("<img ") == 2000
    # A small page keeps its thumbnails large.
    small = pages.duplicates_page(
        Grouped(groups[:2], 2, True), pages.Thumbnailer(expected=4), "x.parquet", 0.97
    )
    assert 'width="160"' in small


def test_escaping_without_a_browser(tmp_path):
    path = tmp_path / ONERROR_NAME
    path.write_bytes(imagegen.jpeg(64, 48))
    html = pages.similar_page(
        {str(path): [{"path": str(path), "score": 1.0}]}, pages.Thumbnailer(), "<b>.parquet", "m"
    )
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(2)&gt;.jpg" in html
    assert "&lt;b&gt;.parquet" in html
    assert "<script" not in html


DESCRIBED = {
    "batchSize": 16,
    "workers": [{}, {}],
    "customizedMetadata": {
        "handler": {"explain": {"method": "gradcam", "n_steps": 32, "max_passes_per_batch": 64}}
    },
}


def test_a_gallery_is_paced_by_the_servers_explanation_budget():
    # GradCAM of 3 classes: 3 passes, 21 fit in 64, a batch holds 16: 16 per worker.
    plan = Plan.for_explanations(DESCRIBED, None, None, targets=3)
    assert (plan.per_request, plan.concurrency) == (1, 2 * 16)
    # IG's 32 steps for 2 classes fill a batch's budget alone: one per worker.
    assert explain_budget(DESCRIBED, "ig", None) == (32, 64)
    assert Plan.for_explanations(DESCRIBED, "ig", None, targets=2).concurrency == 2
    tight = copy.deepcopy(DESCRIBED)
    tight["customizedMetadata"]["handler"]["explain"]["max_passes_per_batch"] = 7
    assert Plan.for_explanations(tight, None, None, targets=3).concurrency == 2 * 2
    assert Plan.for_explanations(DESCRIBED, None, None, 3, concurrency=5).concurrency == 5


def test_an_explanation_job_retries_a_busy_server_and_records_refusals(tmp_path):
    class Explaining:
        """The first call 503 with Retry-After (the budget is taken); a bad image 400."""

        bytes_sent = 0

        def __init__(self):
            self.calls = []

        def explain(self, model, image, **options):
            self.calls.append(options)
            if len(self.calls) == 1:
                error = errors.ApiError(503, "Overloaded", "explanation budget")
                error.retry_after = 0.01
                raise error
            if image.startswith(b"bad"):
                raise errors.ApiError(400, "InvalidImage", "not an image")
            return {
                "method": "gradcam",
                "explanations": [
                    {
                        "label": "tabby",
                        "probability": 0.5,
                        "png": base64.b64encode(imagegen.png(64, 48)).decode(),
                    }
                ],
            }

    entries = []
    for name, data in (("a.jpg", imagegen.jpeg(64, 48)), ("bad.jpg", b"bad bytes")):
        (tmp_path / name).write_bytes(data)
        info = (tmp_path / name).stat()
        entries.append(Entry(str(tmp_path / name), name, info.st_size, info.st_mtime_ns))
    client, gallery = Explaining(), pages.ExplainGallery(pages.Thumbnailer())
    job = Job(
        client,
        "m",
        "explain",
        gallery,
        Plan(concurrency=1, per_request=1),
        explain={"topk": 3, "png": True},
    )
    summary = job.run(entries)
    assert (summary.done, summary.failed) == (1, 1)
    assert len(client.calls) == 3 and client.calls[0] == {"topk": 3, "png": True}
    items = {Path(i.path).name: i for i in gallery.items}
    assert items["a.jpg"].targets == (("tabby", 0.5),)
    assert items["a.jpg"].overlay.thumb_size == (64, 48)
    assert items["bad.jpg"].error == "HTTP 400 InvalidImage: not an image"
    with pytest.raises(ValueError, match="one image per request"):
        Job(client, "m", "explain", gallery, Plan(per_request=4))


def noisy_photos(folder: Path, n: int) -> list[str]:
    paths = []
    for i in range(n):
        path = folder / f"p{i}.jpg"
        path.write_bytes(imagegen.jpeg(640, 480, seed=i))
        paths.append(str(path))
    return paths


def _head_report(labels: list[str], truth: np.ndarray, predicted: np.ndarray) -> dict:
    """A head train report as ``serveclient.head`` writes it, its confusion from the pairs."""
    return {
        "labels": labels,
        "split": {"train": 60_000, "held_out": len(truth), "seed": 0},
        "per_label": {label: {"precision": 0.5, "recall": 0.5, "support": 40} for label in labels},
        "confusion": head.confusion(truth, predicted, labels),
        "held_out_accuracy": 0.0,
        "calibration": {"expected_calibration_error": 0.1},
    }


def test_a_head_report_of_twenty_thousand_mistakes_and_500_labels_stays_within_its_caps(
    tmp_path,
):
    paths = noisy_photos(tmp_path, 40)
    labels = [f"label{i}" for i in range(500)]
    truth = np.arange(20_000) % 500
    predicted = (truth * 7 + 1) % 500
    predicted[:90] = 4
    truth[:90] = 3  # label3 taken for label4 90 times: the most confused pair
    report = _head_report(labels, truth, predicted)
    mistakes = [
        {"path": paths[i % 40], "label": "label3", "predicted": "label4", "probability": 0.9}
        for i in range(20_000)
    ]
    html = pages.head_page(report, mistakes, pages.Thumbnailer(expected=len(mistakes)))
    assert len(html.encode()) < pages.PAGE_BUDGET_BYTES + 2_000_000
    assert html.count("<figure") == pages.MAX_PICTURES
    assert "Showing 2,000 of 20,000 mistakes: the page&#x27;s cap; report.json holds" in html
    # 500 labels: no table in the report, so the page lists the most confused pairs first.
    assert "500 labels: too many for a table; the most confused pairs" in html
    rows = re.findall(r"<tr><td>(label\d+)</td><td>(label\d+)</td><td>(\d+)</td>", html)
    assert rows[0] == ("label3", "label4", "90") and len(rows) == head.CONFUSION_PAIRS
    assert html.count("<td>") == 500 * 4 + head.CONFUSION_PAIRS * 3


def test_a_head_report_over_the_page_s_labels_shows_those_with_the_most_mistakes():
    labels = [f"label{i}" for i in range(45)]  # a table in the report, too wide for the page
    truth = np.repeat(np.arange(45), 4)
    predicted = truth.copy()
    predicted[::4] = (truth[::4] + 1) % 45  # one mistake a label
    predicted[1:12:4] = 44  # label0..label2 taken for label44 too
    report = _head_report(labels, truth, predicted)
    html = pages.head_page(report, [], pages.Thumbnailer())
    assert f"{pages.MAX_TABLE_LABELS} of 45 labels: those with the most mistakes" in html
    assert "<th>label44</th>" in html and html.count("<td>") == 45 * 4 + pages.MAX_TABLE_LABELS**2


def test_thumbnails_past_the_byte_budget_are_placeholders_and_counted(tmp_path):
    paths = noisy_photos(tmp_path, 3)
    one = len(pages.Thumbnailer().of_path(paths[0]).uri)
    thumbs = pages.Thumbnailer(expected=1, budget=one * 3 // 2)  # one fits, two do not
    shown = [thumbs.of_path(p) for p in paths + paths]
    assert sum(t.uri is not None for t in shown) == 1
    assert {t.error for t in shown[1:]} == {"the page's thumbnail budget is spent"}
    assert thumbs.spent == one and thumbs.left_out == 5
    assert thumbs.note().startswith(" 5 thumbnail(s) left out: the page's ")


def test_similar_duplicates_and_explain_pages_cap_their_pictures(tmp_path):
    (photo,) = noisy_photos(tmp_path, 1)
    hits = [{"path": photo, "score": 0.9}] * 1000
    results = {f"{photo}?{q}": hits for q in range(3)}
    html = pages.similar_page(results, pages.Thumbnailer(expected=3003), "x.parquet", "m")
    assert html.count("<figure") == pages.MAX_PICTURES
    assert "Showing 2,000 of 3,003 photos" in html
    groups = [{"paths": [photo] * 1500, "min_score": 0.99}] * 2
    found = Grouped(groups, 5, complete=False)
    html = pages.duplicates_page(found, pages.Thumbnailer(expected=3000), "x.parquet", 0.3)
    assert html.count("<figure") == pages.MAX_PICTURES
    assert "Showing 2,000 of 3,000 photos" in html
    assert "The search stopped at 5 pairs (--max-pairs)" in html

    class Row:
        path, error, answer = photo, "HTTP 400 InvalidImage: no", None

    gallery = pages.ExplainGallery(pages.Thumbnailer(), most=3)
    gallery.add([Row()] * 5)
    assert (len(gallery.items), gallery.left_out) == (3, 2)
    html = pages.explain_page(gallery.items, "m", "gradcam", "t", gallery.left_out)
    assert "Showing 3 of 5 photos" in html and html.count("<figure") == 3


def test_a_fifo_a_device_a_folder_and_a_huge_file_are_placeholders_never_a_hang(tmp_path):
    import os
    import threading

    fifo, huge = tmp_path / "photo.fifo", tmp_path / "huge.jpg"
    os.mkfifo(fifo)
    with huge.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing written
    asked = [str(fifo), "/dev/zero", str(tmp_path), str(huge)]
    thumbs, found = pages.Thumbnailer(), {}
    worker = threading.Thread(target=lambda: found.update((p, thumbs.of_path(p)) for p in asked))
    worker.start()
    worker.join(30)
    if worker.is_alive():  # blocked opening the FIFO: let it go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading the FIFO's thumbnail hung")
    assert [found[p].error for p in asked] == [
        "a FIFO, not a regular file",
        "a device, not a regular file",
        "a folder, not a regular file",
        "33,554,433 bytes, over the 32 MiB a request can carry",
    ]


def test_two_runs_writing_one_page_at_once_each_write_it_whole(tmp_path, monkeypatch):
    """Before: every writer of a page used the one temporary name ``NAME.tmp``: a second run
    writing the same page between the first one's write and its rename renamed the first's
    file away (the first failed with FileNotFoundError), and a failed rename left ``NAME.tmp``.
    Now each writes a temporary name of its own: both finish, the page is the last rename's,
    whole, and no temporary is left; a write that fails leaves the old page whole."""
    import os

    page, replace, runs = tmp_path / "similar.html", os.replace, []

    def another_run_meanwhile(src, dst):
        if not runs:  # the first run, written but not yet renamed: the second runs whole
            runs.append("second")
            assert pages.write(page, "<p>second</p>") == 13
            assert page.read_text() == "<p>second</p>"
        replace(src, dst)

    monkeypatch.setattr(pages.os, "replace", another_run_meanwhile)
    assert pages.write(page, "<p>first</p>") == 12 and runs == ["second"]
    assert page.read_text() == "<p>first</p>"  # the last rename's page, whole
    assert [p.name for p in tmp_path.iterdir()] == ["similar.html"]

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pages.os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        pages.write(page, "<p>third</p>")
    assert page.read_text() == "<p>first</p>"
    assert [p.name for p in tmp_path.iterdir()] == ["similar.html"]
