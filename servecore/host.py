"""Facts about this host: what CPU this is, as results and the precision cache name it (the
model name with its family and model numbers: two EPYCs of different generations share the
name "AMD EPYC"), and how many cores this process may use (affinity and a cgroup quota)."""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """``model name (family F, model M)`` of the first CPU in ``cpuinfo``, else
    ``platform.processor()``."""
    try:
        fields = dict(
            line.split(":", 1)
            for line in cpuinfo.read_text().split("\n\n")[0].splitlines()
            if ":" in line
        )
    except OSError:
        return platform.processor() or "unknown"
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a
    pod's CPU limit; ``os.cpu_count()`` is the node's cores)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _cgroup_quota(cgroup)
    return max(1, min(cpus or 1, math.ceil(quota) if quota else cpus or 1))


def _cgroup_quota(root: Path) -> float | None:
    """CPUs allowed by the cgroup (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), None if none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for folder in (root / "cpu", root / "cpu,cpuacct"):
        try:
            cfs_quota = int((folder / "cpu.cfs_quota_us").read_text())
            cfs_period = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return cfs_quota / cfs_period if cfs_quota > 0 and cfs_period > 0 else None
    return None
