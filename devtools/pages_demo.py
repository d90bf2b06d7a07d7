"""The result pages (``tsctl similar|duplicates|explain --html``) made from an album with every
case they must handle, and ``tsctl head train``'s report, and looked at in headless Chromium:
tests/test_pages.py checks what the browser shows, ``make docs-screenshots`` (``python -m
devtools.pages_demo``) writes the small PNGs of docs/operations.md and docs/own-tags.md.

The album: a photo with two exact copies under hostile names (``<script>alert(1)</script>.jpg``,
which needs a folder ``<script>alert(1)<`` since ``/`` cannot be in a file name, and
``<img src=x onerror=alert(2)>.jpg``), so the query's neighbours and a duplicate group are the
hostile files; a photo copied to a file overwritten with bytes no decoder reads after it was
indexed (``broken.jpg``), and one copied to a file deleted after it was indexed
(``gone.jpg``). Explanations run on a few photos of it plus a file that was never an image.

Chromium is Debian's (``devtools/ensure_chromium.sh``), driven by the ``playwright`` package
with ``executable_path``: Playwright's own browser downloads are not needed.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT_NAME = "<script>alert(1)</script>.jpg"
ONERROR_NAME = "<img src=x onerror=alert(2)>.jpg"
NOT_AN_IMAGE = b"this file was a photo once\n"
DOC_SHOT_MAX_BYTES = 150_000  # docs/*.png: small enough for a repository
CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    """Debian's Chromium, or None when it is not installed."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Album:
    """The album's files (see the module docstring); ``explain`` holds the explanation
    gallery's inputs."""

    root: Path
    query: Path
    hostile: list[Path]
    broken: Path
    gone: Path
    others: list[Path]
    explain: Path
    explain_broken: Path = field(init=False)

    def __post_init__(self) -> None:
        self.explain_broken = self.explain / "not-a-photo.jpg"


def make_album(root: Path, photos: list[bytes]) -> Album:
    """Write the album from at least 4 encoded photos (JPEG)."""
    if len(photos) < 4:
        raise ValueError(f"an album needs 4 photos, got {len(photos)}")
    album = root / "album"
    (album / "<script>alert(1)<").mkdir(parents=True)
    query = album / "query.jpg"
    hostile = [album / "<script>alert(1)<" / "script>.jpg", album / ONERROR_NAME]
    broken, gone = album / "broken.jpg", album / "gone.jpg"
    others = [album / f"photo-{i}.jpg" for i in range(1, len(photos))]
    for path in [query, *hostile]:
        path.write_bytes(photos[0])
    for path, data in zip(others, photos[1:]):
        path.write_bytes(data)
    broken.write_bytes(photos[1])
    gone.write_bytes(photos[2])
    explain = root / "explain"
    (explain / "<script>alert(1)<").mkdir(parents=True)
    shutil.copy(others[0], explain / "photo-1.jpg")
    shutil.copy(query, explain / "<script>alert(1)<" / "script>.jpg")
    (explain / "not-a-photo.jpg").write_bytes(NOT_AN_IMAGE)
    return Album(root, query, hostile, broken, gone, others, explain)


def spoil(album: Album) -> None:
    """After indexing: ``broken.jpg`` stops being an image, ``gone.jpg`` goes."""
    album.broken.write_bytes(NOT_AN_IMAGE)
    album.gone.unlink()


def page_commands(album: Album, index: Path, out: Path) -> dict[str, list[str]]:
    """tsctl's arguments for each page (``out/NAME.html``); the index is ``tsctl embed``'s
    output of ``album.root / "album"``. Duplicates at 0.999: exact copies only, whatever the
    weights (seeded ones put every photo close)."""
    return {
        "similar": [
            "similar",
            str(album.query),
            "--embeddings",
            str(index),
            "-k",
            "5",
            "--html",
            str(out / "similar.html"),
        ],
        "duplicates": [
            "duplicates",
            "--embeddings",
            str(index),
            "--threshold",
            "0.99999",
            "--html",
            str(out / "duplicates.html"),
        ],
        "explain": ["explain", str(album.explain), "--html", str(out / "explain.html")],
    }


@dataclass
class PageView:
    """What Chromium showed: each ``<img>``'s alt text and naturalWidth, each placeholder's
    text, the script-capable elements in the DOM, the dialogs that opened, the visible text."""

    images: list[tuple[str, int]]
    placeholders: list[str]
    scripted: int
    dialogs: list[str]
    text: str
    links: list[str]


def look(
    browser,
    html: Path,
    screenshot: Path,
    full_page: bool = True,
    viewport: tuple[int, int] = (1100, 800),
) -> PageView:
    """Open ``html`` from disk in a new page of ``browser`` (Playwright), read what it shows,
    save a screenshot."""
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    dialogs: list[str] = []

    def dialog(d) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dialog)
    try:
        page.goto(html.resolve().as_uri(), wait_until="load")
        images = [
            tuple(x)
            for x in page.eval_on_selector_all(
                "img", "els => els.map(e => [e.alt, e.complete ? e.naturalWidth : 0])"
            )
        ]
        placeholders = page.eval_on_selector_all(
            ".placeholder",
            "els => els.filter(e => e.offsetWidth > 0 && e.offsetHeight > 0).map(e => e.innerText)",
        )
        scripted = page.evaluate(
            "document.querySelectorAll('script, iframe, object, embed, "
            "[onerror], [onload], [onclick]').length"
        )
        links = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        text = page.inner_text("body")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=full_page)
    finally:
        page.close()
    return PageView(images, placeholders, scripted, dialogs, text, links)


def small_png(shot: Path, out: Path, colours: int = 128) -> int:
    """``shot`` as a palette PNG (photos in a screenshot compress badly as RGB), at most
    ``DOC_SHOT_MAX_BYTES``: fewer colours, then a smaller size, until it fits."""
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    while True:
        buffer = io.BytesIO()
        image.quantize(colours, method=Image.Quantize.MEDIANCUT).save(buffer, "PNG", optimize=True)
        if buffer.tell() <= DOC_SHOT_MAX_BYTES:
            out.write_bytes(buffer.getvalue())
            return buffer.tell()
        if colours > 32:
            colours //= 2
        else:
            image = image.resize((image.width * 4 // 5, image.height * 4 // 5), Image.LANCZOS)


def docs_screenshots(docs: Path, work: Path) -> dict[str, int]:
    """Start a TorchServe, make the three pages from scikit-image's sample photos and the
    report of ``tsctl head train`` on the synthetic scenes (``devtools.scenes``), and write
    ``docs/page-NAME.png``; the byte size of each."""
    from playwright.sync_api import sync_playwright

    from devtools.samples import HELDOUT, photo
    from devtools.scenes import labelled_set
    from devtools.server import LocalTorchServe

    chromium = chromium_path()
    if chromium is None:
        raise SystemExit(
            "error: Chromium not found: run devtools/ensure_chromium.sh "
            "(apt-get install -y chromium)"
        )
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    photos = []
    for name in ("chelsea", "coffee", *HELDOUT[:3]):
        buffer = io.BytesIO()
        image = photo(name).convert("RGB")
        image.thumbnail((640, 640))
        image.save(buffer, "JPEG", quality=88)
        photos.append(buffer.getvalue())
    # Captions read build/pages-demo/album/... rather than this machine's absolute paths.
    album = make_album(work.relative_to(REPO) if work.is_relative_to(REPO) else work, photos)
    index = album.root / "album.parquet"
    sizes = {}
    with LocalTorchServe(work / "torchserve", REPO / "model-store") as server:

        def tsctl(*argv: str) -> None:
            run = subprocess.run(
                [str(REPO / ".venv" / "bin" / "tsctl"), *argv],
                cwd=REPO,
                env=server.cli_env(),
                capture_output=True,
                text=True,
                timeout=600,
            )
            if run.returncode not in (0, 7):  # 7: some files failed, as they should here
                raise SystemExit(f"tsctl {' '.join(argv)}: exit {run.returncode}\n{run.stderr}")

        tsctl("embed", str(album.root / "album"), "--out", str(index))
        spoil(album)
        for name, argv in page_commands(album, index, album.root).items():
            tsctl(*argv)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium)
                try:
                    look(
                        browser,
                        work / f"{name}.html",
                        work / f"{name}.png",
                        full_page=False,
                        viewport=(1000, 620),
                    )
                finally:
                    browser.close()
            sizes[name] = small_png(work / f"{name}.png", docs / f"page-{name}.png")
        # tsctl head train's report (docs/own-tags.md), from the synthetic labelled set.
        labelled_set(work / "scenes", per_label=12, seed=4800)
        tsctl("head", "train", str(work / "scenes"), "--out", str(work / "head"))
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium)
            try:
                look(
                    browser, work / "head" / "report.html", work / "head.png", viewport=(1000, 620)
                )
            finally:
                browser.close()
        sizes["head"] = small_png(work / "head.png", docs / "page-head.png")
    return sizes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=Path, default=REPO / "docs")
    p.add_argument("--work", type=Path, default=REPO / "build" / "pages-demo")
    args = p.parse_args(argv)
    args.docs, args.work = args.docs.resolve(), args.work.resolve()
    os.chdir(REPO)  # relative paths (the album's, tsctl's) are the repository's
    for name, size in docs_screenshots(args.docs, args.work).items():
        print(f"wrote {args.docs / f'page-{name}.png'} ({size / 1000:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
