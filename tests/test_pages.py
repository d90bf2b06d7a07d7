"""The result pages (``tsctl similar|duplicates|explain --html``, serveclient/pages.py), made by
tsctl from a generated album against the session's real TorchServe and opened in headless
Chromium (Debian's, through the ``playwright`` package): every thumbnail loads, the broken and
the missing file show a placeholder, no script from a file name runs and its name is shown as
text; a screenshot of each lands in build/pages/ for a person to look at. Plus the page
budget: a page of 1,000 pairs of noisy photos stays a few MB."""

from __future__ import annotations

import base64
import copy
import urllib.parse
from pathlib import Path

import pytest

from devtools import pages_demo
from devtools.pages_demo import ONERROR_NAME, SCRIPT_NAME
from serveclient import errors, pages
from serveclient.batchjob import Job, Plan, explain_budget
from serveclient.collection import Entry
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
    html = pages.duplicates_page(groups, pages.Thumbnailer(expected=2000), "x.parquet", 0.97)
    assert len(html.encode()) < pages.PAGE_BUDGET_BYTES + 1_000_000
    assert html.count("<img ") == 2000
    # A small page keeps its thumbnails large.
    small = pages.duplicates_page(groups[:2], pages.Thumbnailer(expected=4), "x.parquet", 0.97)
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
