"""Runtimes that turn a preprocessed batch into ``(embedding, logits)``, both on CPU, float32.

Each backend crosses the device boundary once per batch: one copy in, one forward, one copy out.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch

logger = logging.getLogger(__name__)

Backend = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


def load_backend(kind: str, path: Path, device: torch.device, *, half: bool = False,
                 threads: int = 0, spin: bool = False) -> Backend:
    """Load the serialized model at ``path`` for ``kind`` (eager, torchscript, onnx).

    ``spin``: ONNX Runtime's intra-op threads busy-wait between operators (ORT's own default;
    off by default here as in ``HandlerConfig.onnx_spinning``).
    """
    if kind == "onnx":
        return _onnx(path, device, threads, spin)
    if kind == "torchscript":
        module = torch.jit.load(str(path), map_location=device).eval()
    else:
        from model_files.resnet_dual import build_dual

        module = build_dual(torch.load(path, map_location="cpu", weights_only=True)).to(device)
    # A frozen TorchScript module holds its weights as float32 constants: half is eager-only.
    dtype = torch.float16 if half and device.type == "cuda" and kind == "eager" else torch.float32
    module = module.to(dtype)

    def run(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            embedding, logits = module(batch.to(device, dtype, non_blocking=True))
            return embedding.float().cpu(), logits.float().cpu()

    return run


def _onnx(path: Path, device: torch.device, threads: int, spin: bool) -> Backend:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
        else:  # the pinned onnxruntime wheel is the CPU build
            logger.warning("ONNX Runtime has no CUDA provider here: running on CPU although "
                           "the worker has %s; archive with BACKEND=eager for the GPU", device)
    session = ort.InferenceSession(str(path), options, providers=providers)
    input_name = session.get_inputs()[0].name

    def run(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedding, logits = session.run(["embedding", "logits"], {input_name: batch.numpy()})
        return torch.from_numpy(embedding), torch.from_numpy(logits)

    return run
