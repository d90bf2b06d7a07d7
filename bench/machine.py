"""What the numbers were measured on: machine, load, software versions, weights."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from servecore.host import cpu_model

PACKAGES = (
    "torch",
    "torchvision",
    "onnxruntime",
    "openvino",
    "nncf",
    "torchserve",
    "torch-model-archiver",
)
# The CPU features the bf16 and int8 paths use (AMX: the next step up, absent on Zen 4).
CPU_FLAGS = ("avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def cpu_flags() -> dict[str, bool]:
    """Which of ``CPU_FLAGS`` /proc/cpuinfo lists."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")),
        [],
    )
    return {flag: flag in flags for flag in CPU_FLAGS}


def java_version() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    lines = (out.stderr or out.stdout).splitlines()
    return lines[0].strip() if lines else "unknown"


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "java": java_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def describe_machine() -> dict:
    """CPU, cores, memory, and how busy the machine was just *before* the run (other work on
    it makes every number slower; the report shows it so a reader can judge). Takes ~1 s."""
    # Here, not at import: bench.gpu reads this module's provenance on bare GPU hosts.
    import psutil

    return {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpu_busy_percent_before": psutil.cpu_percent(interval=1.0),
    }


def code_version() -> str:
    """The commit the measured code is at (``abc1234``), ``+ uncommitted changes`` when the
    working tree differs from it outside ``results/``: what a report's figures belong to."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            run = subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return run.stdout.strip() if run.returncode == 0 else ""

    commit = git("rev-parse", "--short=7", "HEAD") or "unknown"
    # Reports written by earlier runs (results/) are not the code measured.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!results")
    return f"{commit} + uncommitted changes" if dirty else commit


def dated() -> str:
    """A report's provenance line: ``- Date: 2026-11-25 08:10 UTC; code: `abc1234`; CPU;
    load average``: when, what code, on what, and how busy the machine was (other work on
    it inflates every latency)."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"- Date: {now}; code: `{code_version()}`; {cpu_model()}, {os.cpu_count()} cores; "
        f"load average {load}"
    )


def host(machine: dict) -> str:
    """A report's line on the host of a run (``describe_machine``): what, and how busy it was
    just before."""
    return (
        f"Host: {machine['cpu']}, {machine['cores']} cores; "
        f"{machine['cpu_busy_percent_before']:.0f}% busy in the second before the run"
    )


def weights_info(weights_dir: Path) -> dict:
    return json.loads((weights_dir / "weights_info.json").read_text())
