"""The Markdown report of ``python -m bench.gpu``: where, on what and with which code it ran,
the raw forward, the pipeline limit, the core, and their ratios."""

from __future__ import annotations

import copy
import platform
from dataclasses import dataclass

import torch
import torchvision

from bench.machine import dated
from bench.markdown import bullets, document, section, table
from servecore.host import cpu_model

PARTS = ("open", "decode", "forward", "answer")  # the core's metrics, in the order they run


@dataclass(frozen=True)
class Setting:
    """A precision and a memory layout of the model and its inputs."""

    precision: str
    layout: str
    dtype: torch.dtype = torch.float32
    fmt: torch.memory_format = torch.contiguous_format

    def model(self, base: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        return copy.deepcopy(base).to(device, self.dtype).to(memory_format=self.fmt)

    def inputs(self, batch: int, device: torch.device) -> torch.Tensor:
        x = torch.randn(batch, 3, 224, 224, device=device, dtype=self.dtype)
        return x.contiguous(memory_format=self.fmt)


@dataclass(frozen=True)
class Rate:
    images_per_s: float
    batch_ms: float


@dataclass(frozen=True)
class Findings:
    """What one run measured: ``raw`` per (setting, batch); ``best`` the fastest setting at
    batch ``ref``; ``limit`` (the pipeline) and ``core`` per image kind at ``batches``;
    ``chose``: the core's precision and why, or why the core was skipped."""

    device: torch.device
    images: dict[str, tuple[bytes, str]]  # name -> (JPEG, where it came from)
    batches: dict[str, int]
    weights: str
    raw: dict[tuple[Setting, int], Rate]
    best: Setting
    ref: int
    compiled: str
    limit: dict[str, Rate]
    core: dict[str, Rate]
    parts: dict[str, dict[str, float]]  # the core's own ms per batch: open, decode, forward...
    chose: str
    handler: dict[str, object]  # --handler settings
    quick: bool


def device_line(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (
            f"{torch.cuda.get_device_name(device)} ({props.total_memory / 2**30:.0f} GiB, "
            f"CUDA {torch.version.cuda}), host {cpu_model()}"
        )
    return f"CPU: {cpu_model()}, {torch.get_num_threads()} torch threads"


def rate(r: Rate | None) -> str:
    """Images per second: whole above 100, else 3 significant digits (a CPU smoke's 0.4)."""
    if r is None:
        return "-"
    return f"{r.images_per_s:,.0f}" if r.images_per_s >= 100 else f"{r.images_per_s:.3g}"


def ratio(a: Rate | None, b: Rate | None) -> str:
    return f"{a.images_per_s / b.images_per_s:.2f}" if a and b else "-"


CROPS = " as crops"  # the core's rows of the same photos sent as crops (bench/gpucore.py)


def batch_of(f: Findings, name: str) -> int:
    """The batch size of an image kind's row (its crops and overlap-off rows: the same
    photos)."""
    return f.batches[name.split()[0].rstrip(",")]


def forward_share(f: Findings, name: str) -> str:
    """The best raw forward's ms per batch over the core's own forward ms at that batch (1:
    the core's backend call is as fast as the ceiling), where (1) has that batch."""
    raw, forward = f.raw.get((f.best, batch_of(f, name))), f.parts.get(name, {}).get("forward")
    return f"{raw.batch_ms / forward:.2f}" if raw and forward else "-"


def report(f: Findings) -> str:
    """The Markdown report: provenance, the three sections and their ratios."""
    cpu = f.device.type == "cpu"
    cudnn = (
        "" if cpu else "; `cudnn.benchmark` on for 1 and 2, restored for 3 (the core as it serves)"
    )
    about = [
        dated(),
        f"Device: **{device_line(f.device)}**",
        f"torch {torch.__version__}, torchvision {torchvision.__version__}, Python "
        f"{platform.python_version()}; weights: {f.weights}{cudnn}",
        *[f"{name}: {len(d):,} bytes, {where}" for name, (d, where) in f.images.items()],
        "`--quick`: tiny counts, the figures mean nothing" if f.quick else None,
    ]
    raw = [(s.precision, s.layout, b, rate(r), r.batch_ms) for (s, b), r in f.raw.items()]
    draft = (
        " On CPU the core's draft decode (DCT scaling) makes a 12 MP photo cheaper than this "
        "full decode."
    )
    return document(
        "The core against the device's ceilings (`python -m bench.gpu`)",
        bullets(about),
        section(
            "1. Raw forward (float inputs on the device)",
            table("precision | layout | batch | img/s | ms/batch", raw),
            f.compiled,
        ),
        section(
            "2. Pipeline limit (decode, resize, crop, normalise, forward on the device)",
            f"`decode_jpeg(device={f.device.type!r})`, forward {f.best.precision} "
            f"{f.best.layout} (the fastest at batch {f.ref}).{draft if cpu else ''}",
            table(BATCHES, by_image(f, f.limit)),
        ),
        core_section(f),
        ratios_section(f),
    )


BATCHES = "images | batch | img/s | ms/batch"


def by_image(f: Findings, rates: dict[str, Rate]) -> list[tuple]:
    return [(n, batch_of(f, n), rate(r), r.batch_ms) for n, r in rates.items()]


def core_section(f: Findings) -> str:
    """Section 3: the core's rate per image kind and its own ms per part, or why it was
    skipped."""
    if not f.core:
        body = [f"**{f.chose}**"]
    else:
        handler = "".join(f" Handler: `{k}: {v}`." for k, v in f.handler.items())
        rows = [
            (*row, *(f.parts[n].get(part, 0.0) for part in PARTS))
            for n, row in zip(f.core, by_image(f, f.core))
        ]
        body = [
            f"Precision: {f.chose}.{handler}",
            "open, decode, forward, answer: the core's own ms per batch (its metrics).",
            table(f"{BATCHES} | open | decode | forward | answer", rows),
        ]
    return section(
        "3. The core (`ImageModel.run`, one request per JPEG, eager, precision auto)",
        "As an engine calls it: a batch of the served size of 1-image requests at a time. "
        "Each image kind with the overlap on (the default, `gpu_overlap_chunks`: a batch's "
        "parts decoded while the earlier parts' forwards run) and off (`, overlap off`: "
        "decode the batch, then run it); on a CPU there is no overlap (a GPU worker's), "
        "so those rows are left out.",
        *body,
    )


def ratios_section(f: Findings) -> str:
    top = f.raw[f.best, f.ref]
    rows = [
        (n, rate(c), rate(r), ratio(c, r), ratio(r, top), ratio(c, top), forward_share(f, n))
        for n, r in f.limit.items()
        for c in [f.core.get(n)]
    ]
    # the crop-fed core: no decode, so held to the raw forward alone
    crops = [
        (n, rate(r), "-", "-", "-", ratio(r, top), forward_share(f, n))
        for n, r in f.core.items()
        if n.endswith(CROPS)
    ]
    return section(
        "Ratios",
        f"raw: {f.best.precision} {f.best.layout} at batch {f.ref}, {rate(top)} img/s.",
        table(
            "images | core img/s | pipeline img/s | core / pipeline | pipeline / raw | "
            "core / raw | raw / the core's forward (ms, same batch)",
            rows + crops,
        ),
    )
