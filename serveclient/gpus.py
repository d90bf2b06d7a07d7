"""The GPUs of a server as its ``/metrics`` reports them, for ``tsctl top``: how busy each one
is and how much of its memory is in use, read the same way from either engine.

- TorchServe 0.12 (``ts/metrics/system_metrics.py``, where ``number_of_gpu`` > 0, sampled every
  minute; ``config/metrics.yaml`` must declare them): ``GPUUtilization`` and
  ``GPUMemoryUtilization`` in percent, ``GPUMemoryUsed`` in MiB, per ``DeviceId`` (nvidia-smi's
  index).
- Triton 2.51 (every second): ``nv_gpu_utilization`` as a fraction, ``nv_gpu_memory_used_bytes``
  and ``nv_gpu_memory_total_bytes``, per ``gpu_uuid``.

And each GPU worker's own: the core's ``resnet50_worker_gpu_mb{worker_pid}`` (the memory its
PyTorch holds, reserved, set every batch; either engine), ``worker_mb``.

A server without GPUs exports none of them: ``read`` and ``worker_mb`` return nothing and
``lines`` adds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tabulate import tabulate

from serveclient.metrics import Sample

MIB = 2**20
UUID_SHOWN = 12  # "GPU-" and 8 hex digits of Triton's gpu_uuid: unique on one host in practice


@dataclass
class Gpu:
    """One GPU's last reading; ``None`` where the engine did not report it."""

    busy: float | None = None  # 0..1
    used_bytes: float | None = None
    total_bytes: float | None = None
    used_share: float | None = None  # 0..1, TorchServe's own

    @property
    def memory_share(self) -> float | None:
        if self.used_share is not None:
            return self.used_share
        if self.used_bytes is not None and self.total_bytes:
            return self.used_bytes / self.total_bytes
        return None


# Metric -> (the label naming the GPU, the field it sets, the factor to the field's unit).
SERIES = {
    "GPUUtilization": ("DeviceId", "busy", 0.01),
    "GPUMemoryUtilization": ("DeviceId", "used_share", 0.01),
    "GPUMemoryUsed": ("DeviceId", "used_bytes", MIB),
    "nv_gpu_utilization": ("gpu_uuid", "busy", 1.0),
    "nv_gpu_memory_used_bytes": ("gpu_uuid", "used_bytes", 1.0),
    "nv_gpu_memory_total_bytes": ("gpu_uuid", "total_bytes", 1.0),
}


WORKER_SERIES = "resnet50_worker_gpu_mb"  # servecore.metrics.WORKER_GPU


def worker_mb(samples: Iterable[Sample]) -> dict[str, float]:
    """``{worker pid: MiB}``: the GPU memory each GPU worker's PyTorch holds."""
    return {
        labels.get("worker_pid", "?"): value
        for name, labels, value in samples
        if name == WORKER_SERIES
    }


def read(samples: Iterable[Sample]) -> dict[str, Gpu]:
    """``{gpu: Gpu}`` from a ``/metrics`` text's samples, in the order they came."""
    gpus: dict[str, Gpu] = {}
    for name, labels, value in samples:
        if name not in SERIES:
            continue
        label, field, factor = SERIES[name]
        gpu = labels.get(label, "?")
        setattr(gpus.setdefault(gpu, Gpu()), field, value * factor)
    return gpus


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def lines(gpus: dict[str, Gpu]) -> list[str]:
    """The frame's GPU table (busy, memory used in MiB and as a share), or nothing."""
    if not gpus:
        return []
    rows = [
        [
            gpu if len(gpu) <= UUID_SHOWN else gpu[:UUID_SHOWN],
            _percent(g.busy),
            "-" if g.used_bytes is None else f"{g.used_bytes / MIB:.0f}",
            _percent(g.memory_share),
        ]
        for gpu, g in gpus.items()
    ]
    return [
        "",
        *tabulate(
            [["gpu", "busy", "memory MiB", "memory"], *rows],
            tablefmt="plain",
            disable_numparse=True,
            colalign=("left", "right", "right", "right"),
        ).splitlines(),
    ]
