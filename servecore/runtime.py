"""One loaded runtime, the type ``servecore.backends`` loads and ``servecore.precision``'s
candidates load: its own module, so that neither of those two imports the other for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Forward = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


@dataclass(frozen=True)
class Backend:
    """One loaded runtime. ``name``: eager, torchscript, onnx or openvino; ``precision``: f32,
    f16, bf16, int8+f32 or int8+bf16, as the runtime reports it runs; ``file``: the serialized
    model it runs; ``forward``: ``pixels [N, 3, 224, 224] -> (embedding [N, 2048], logits
    [N, classes])`` (the checkpoint's own class count), CPU float32, ``pixels`` uint8 on the
    CPU or already on the backend's device; ``emulated``: the runtime runs ``precision``
    without the CPU's native units for it (OpenVINO's bf16 on AVX-512 without bf16: real bf16
    rounding, slower than f32); ``torch_threads``: the forward runs on torch's intra-op
    threads (eager, TorchScript), not a runtime's own (OpenVINO, ONNX Runtime); ``start``
    (eager on a GPU): ``forward`` without its copy back, its outputs left on the device, queued
    on the current stream and not waited for, so that a caller queues several and copies once;
    ``graphs``: the batch sizes replayed as CUDA graphs, or why none ("": not a GPU runtime)."""

    name: str
    precision: str
    file: str
    device: str
    forward: Forward
    emulated: bool = False
    torch_threads: bool = True
    start: Forward | None = None
    graphs: str = ""

    def __call__(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward(pixels)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "precision": self.precision,
            "file": self.file,
            "device": self.device,
            "emulated": self.emulated,
        }
