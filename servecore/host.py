"""What CPU this is, as results and the precision cache name it: the model name with its
family and model numbers (two EPYCs of different generations share the name "AMD EPYC")."""

from __future__ import annotations

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
