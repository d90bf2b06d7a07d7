"""``python -m bench.gpu`` (``make bench-gpu``) on this CPU, the way it runs bare on a GPU host:
the packages such a host lacks made unimportable, no weights built (seeded ones are made in a
temporary folder). A quick run's numbers mean nothing; what is checked is that each of the three
measurements ran and was reported, with the device named."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from bench.gpu import GPU_REPORT
from servecore.host import cpu_model
from tests.conftest import REPO

# What a GPU host with only torch, torchvision, numpy and Pillow lacks that our venv has.
ABSENT_ON_GPU_HOST = (
    "openvino",
    "onnxruntime",
    "nncf",
    "captum",
    "yaml",
    "ts",
    "requests",
    "prometheus_client",
    "skimage",
    "tritonclient",
)
# None in sys.modules: `import` raises ModuleNotFoundError, importlib.util.find_spec (torch's
# probe for optional packages) says absent.
BARE = """
import runpy, sys

sys.modules.update(dict.fromkeys({absent!r}))
{run}
"""
RUN_BENCH = (
    "sys.argv = ['bench.gpu', *sys.argv[1:]]; runpy.run_module('bench.gpu', run_name='__main__')"
)


def bare(run: str, *args: str, absent=ABSENT_ON_GPU_HOST) -> subprocess.CompletedProcess:
    code = BARE.format(absent=tuple(absent), run=run)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )


def section(markdown: str, title: str) -> str:
    """The text under the ``## title...`` heading, up to the next one."""
    start = markdown.index(f"## {title}")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end > 0 else None]


def img_per_s(text: str, column: int) -> dict[str, float]:
    """Each table row's first cell -> its ``column``-th cell as a number."""
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    return {
        " ".join(c.strip() for c in r[:column]): float(r[column].replace(",", ""))
        for r in rows[1:]  # the header row
        if not r[0].strip().startswith("---")
    }


def test_quick_run_reports_the_three_measurements_on_the_device_it_found(tmp_path):
    out = tmp_path / "gpu.md"
    run = bare(
        RUN_BENCH, "--quick", "--quiet", "--weights", str(tmp_path / "none"), "--out", str(out)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    markdown = out.read_text()
    assert run.stdout == markdown
    device = f"{torch.cuda.get_device_name(0)} (" if torch.cuda.is_available() else "CPU: "
    assert f"- Device: **{device}" in markdown and cpu_model() in markdown
    assert re.search(r"- Date: \d{4}-\d\d-\d\d .*; code: `[0-9a-f]{7}", markdown)
    assert "weights: seeded-untrained" in markdown  # none in --weights: built in a scratch folder
    raw = img_per_s(section(markdown, "1. Raw forward"), 3)
    assert {"f32 contiguous 4", "f32 channels_last 4"} <= set(raw), raw
    pipeline = img_per_s(section(markdown, "2. Pipeline limit"), 2)
    core = img_per_s(section(markdown, "3. The core"), 2)
    assert set(pipeline) == {"small 4", "12mp-noisy 2"}, pipeline
    # The core on the JPEGs, the same photos as crops (no decode), then on a GPU the JPEGs
    # with the overlap off; the decoder it chose and why (on a CPU: the CPU path).
    overlap_off = {"small, overlap off 4", "12mp-noisy, overlap off 2"}
    on_gpu = torch.cuda.is_available()
    expected = {*pipeline, "small as crops 4", "12mp-noisy as crops 2"}
    assert set(core) == expected | (overlap_off if on_gpu else set()), core
    if not on_gpu:
        assert "decoder: cpu (a CPU worker); overlap: 0 parts a batch" in markdown
    assert all(v > 0 for v in [*raw.values(), *pipeline.values(), *core.values()])
    # Each image's ratios; raw / the core's forward where (1) timed the same batch (4: small).
    ratios = {
        cells[0].strip(): [c.strip() for c in cells[1:]]
        for cells in (
            line.strip("|").split("|") for line in section(markdown, "Ratios").splitlines()
        )
        if cells[0].strip() in ("small", "12mp-noisy")
    }
    assert all(float(v) > 0 for v in ratios["small"]), ratios
    assert all(float(v) > 0 for v in ratios["12mp-noisy"][:-1]), ratios
    core_times = section(markdown, "3. The core").splitlines()
    small_row = next(line for line in core_times if line.startswith("| small |"))
    opened, decode, forward, answer = (float(v) for v in small_row.strip("|").split("|")[-4:])
    assert decode > 0 and forward > 0 and opened >= 0 and answer >= 0, small_row


def test_the_core_is_skipped_by_name_where_psutil_is_missing():
    run = bare("from bench import gpu; print(gpu.core_missing())", absent=("psutil",))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "core skipped: psutil missing"


def test_a_cpu_run_never_writes_the_gpu_report():
    before = GPU_REPORT.read_bytes() if GPU_REPORT.exists() else None
    run = bare(RUN_BENCH, "--quick", "--out", str(GPU_REPORT))
    assert run.returncode == 2 and "holds GPU figures" in run.stderr, run.stderr[-3000:]
    assert (GPU_REPORT.read_bytes() if GPU_REPORT.exists() else None) == before


def test_the_gpu_check_rehearses_on_a_cpu_saying_what_needs_cuda(tmp_path):
    """``python -m bench.gpucheck`` bare, on this CPU: every check's section with what it
    decides; those that need CUDA or nvImageCodec skipped saying so; the corrupt JPEGs
    through the core on the CPU path (PIL refuses a marker inside the scan, decodes noise)."""
    from bench.gpucheck import CHECKS

    out = tmp_path / "gpu-check.md"
    run = bare(
        "sys.argv = ['bench.gpucheck', *sys.argv[1:]]; "
        "runpy.run_module('bench.gpucheck', run_name='__main__')",
        "--quiet", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    markdown = out.read_text()
    assert run.stdout.strip() == markdown.strip()
    for number, (title, findings, _, _) in enumerate(CHECKS, 1):
        text = section(markdown, f"{number}. {title} (review {findings}")
        assert "\nDecides: " in text, title
        expected = {5: "- a marker mid-scan: CPU path 400 InvalidImage"}.get(number, "- skipped:")
        assert expected in text, text
    assert "- noise mid-scan: CPU path 200" in markdown
    assert markdown.count("- skipped: needs CUDA") == 6


def test_a_cpu_run_never_writes_the_gpu_check(capsys):
    from bench.gpucheck import GPU_REPORT, main

    before = GPU_REPORT.read_bytes() if GPU_REPORT.exists() else None
    with pytest.raises(SystemExit) as refused:
        main(["--out", str(GPU_REPORT)])
    assert refused.value.code == 2 and "holds a GPU's answers" in capsys.readouterr().err
    assert (GPU_REPORT.read_bytes() if GPU_REPORT.exists() else None) == before
