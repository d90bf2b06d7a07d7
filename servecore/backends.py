"""Runtimes that turn a preprocessed batch into ``(embedding, logits)``, both on CPU, float32.

A ``Backend`` is one loaded runtime with a name: which runtime (``name``), the arithmetic it
really runs (``precision``, what ``describe`` reports) and its ``forward``. Each crosses the
device boundary once per batch: one copy in, one forward, one copy out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from model_files.artifacts import QUANTIZED, SERIALIZED, fidelity_record, is_quantised
from servecore.precision import failures

logger = logging.getLogger(__name__)

Forward = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


@dataclass(frozen=True)
class Backend:
    """One loaded runtime. ``name``: eager, torchscript, onnx or openvino; ``precision``: f32,
    f16, bf16, int8+f32 or int8+bf16, as the runtime reports it runs; ``file``: the serialized
    model it runs; ``forward``: ``pixels [N, 3, 224, 224] -> (embedding [N, 2048], logits
    [N, 1000])``, CPU float32; ``emulated``: the runtime runs ``precision`` without the CPU's
    native units for it (OpenVINO's bf16 on AVX-512 without bf16: real bf16 rounding, slower
    than f32)."""

    name: str
    precision: str
    file: str
    device: str
    forward: Forward
    emulated: bool = False

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


@dataclass(frozen=True)
class RuntimeOptions:
    """How a runtime is set up, from the handler's settings (``HandlerConfig``): intra-op
    ``threads`` (0: the runtime's default), ONNX Runtime's ``spin`` (busy-waiting threads) and
    ``half`` (float16, eager on CUDA only)."""

    threads: int = 0
    spin: bool = False
    half: bool = False


def pick_device(wanted: str, gpu_id) -> torch.device:
    """The device a worker runs on: ``wanted`` is ``auto`` (the GPU the engine assigned, else
    CPU), ``cpu`` or ``cuda`` (a worker without a GPU then fails to load, loudly)."""
    if wanted in ("auto", "cuda") and gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{gpu_id}")
    if wanted == "cuda":
        raise RuntimeError(
            "handler.device is 'cuda' but the engine gave this worker no GPU "
            f"(gpu_id={gpu_id}, cuda available={torch.cuda.is_available()})"
        )
    return torch.device("cpu")


def load_backend(
    kind: str,
    path: Path,
    device: torch.device,
    options: RuntimeOptions = RuntimeOptions(),
    precision: str = "auto",
    warmup: tuple[int, ...] = (),
) -> Backend:
    """Load the serialized model at ``path`` for ``kind`` (eager, torchscript, onnx, openvino).

    ``precision``: ``f32``, ``bf16`` or ``int8`` (OpenVINO only), or ``auto``: here the
    runtime's own default (``handler.precision: auto`` measures instead:
    servecore/autoprecision.py). ``warmup``: batch sizes OpenVINO runs once at load (its first
    call at a new batch size is 1.2-3.5x slower than the next ones).
    """
    if kind == "openvino":
        return _openvino(path, options.threads, precision, warmup)
    if precision not in ("auto", "f32"):
        raise ValueError(
            f"handler.precision {precision!r} needs an OpenVINO archive "
            f"(BACKEND=openvino); this one is {kind}: use auto or f32"
        )
    if kind == "onnx":
        return _onnx(path, device, options)
    return _torch(kind, path, device, options.half)


def precision_candidates(
    kind: str,
    folder: Path,
    serialized: str,
    device: torch.device,
    options: RuntimeOptions,
    allow_int8: bool = True,
) -> tuple[dict[str, Callable[[], Backend]], dict[str, str]]:
    """What ``handler.precision: auto`` chooses from in ``folder``: ``{precision: loader}``,
    most precise first, and ``{precision: why it is left out}`` for the ones this archive,
    device or config cannot serve.

    OpenVINO: every IR the folder carries (the float32 one, the int8 one when its fidelity
    record passed the gate and ``allow_int8``) at f32 and, where the CPU has bf16 units, bf16.
    Eager on CUDA: f32 and f16. Anything else: f32 only.
    """
    loaders: dict[str, Callable[[], Backend]] = {}
    excluded: dict[str, str] = {}
    if kind == "openvino":
        bf16 = _cpu_has_bf16()
        irs = {"": SERIALIZED["openvino"], "int8+": QUANTIZED[("openvino", "int8")]}
        for prefix, path in ((p, folder / name) for p, name in irs.items()):
            if not path.is_file():
                continue
            if prefix and (why := _int8_unusable(path, allow_int8)):
                excluded[f"{prefix}f32"] = why
                continue
            for inference in ("f32", "bf16"):
                if inference == "bf16" and not bf16:
                    excluded[prefix + inference] = "this CPU has no bf16 units (OpenVINO)"
                else:
                    loaders[prefix + inference] = partial(
                        _openvino, path, options.threads, inference, ()
                    )
        return loaders, excluded
    path = folder / serialized
    if kind == "onnx":
        loaders["f32"] = partial(_onnx, path, device, options)
        return loaders, excluded
    loaders["f32"] = partial(_torch, kind, path, device, False)
    if kind == "eager" and device.type == "cuda":
        loaders["f16"] = partial(_torch, kind, path, device, True)
    elif device.type == "cuda":
        excluded["f16"] = f"{kind} holds its weights as float32 constants: f16 is eager-only"
    return loaders, excluded


def _cpu_has_bf16() -> bool:
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def _int8_unusable(path: Path, allow_int8: bool) -> str:
    """Why the int8 IR at ``path`` may not be chosen by ``auto``; "" when it may."""
    if not allow_int8:
        return "handler.auto_int8 is false"
    record = path.with_name(fidelity_record(path.name))
    if not record.is_file():
        return f"no fidelity record {record.name} beside it"
    built = json.loads(record.read_text())
    failed = failures(built["fidelity_vs_f32"], built["thresholds"])
    return f"its fidelity gate failed: {'; '.join(failed)}" if failed else ""


def _torch(kind: str, path: Path, device: torch.device, half: bool) -> Backend:
    """Eager PyTorch (the checkpoint) or TorchScript; ``half``: float16, eager on CUDA only."""
    if kind == "torchscript":
        module = torch.jit.load(str(path), map_location=device).eval()
    else:
        from model_files.resnet_dual import build_dual

        module = build_dual(torch.load(path, map_location="cpu", weights_only=True)).to(device)
    # A frozen TorchScript module holds its weights as float32 constants: half is eager-only.
    dtype = torch.float16 if half and device.type == "cuda" and kind == "eager" else torch.float32
    module = module.to(dtype)

    def forward(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            embedding, logits = module(batch.to(device, dtype, non_blocking=True))
            return embedding.float().cpu(), logits.float().cpu()

    return Backend(
        kind, "f16" if dtype == torch.float16 else "f32", path.name, str(device), forward
    )


def _openvino(path: Path, threads: int, precision: str, warmup: tuple[int, ...]) -> Backend:
    """Compile the IR at ``path`` (its .bin beside it) for the CPU with the latency hint: one
    stream using every core for one synchronous request (the throughput hint splits the cores
    into streams and ran half as fast here).

    ``precision``: ``f32``, ``bf16``, or ``auto`` (OpenVINO's choice: bf16 where the CPU has
    bf16 units, else f32). An int8 IR (buildsteps/quantize.py) runs its quantised layers in
    int8 and the others at that precision; ``int8`` then means ``auto``.
    """
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    quantised = is_quantised(path.name)
    if precision == "int8" and not quantised:
        raise ValueError(
            f"handler.precision is int8 but {path.name} is not quantised: "
            "archive with QUANTIZE=int8 (make archives BACKEND=openvino "
            "QUANTIZE=int8)"
        )
    config: dict = {hints.performance_mode: hints.PerformanceMode.LATENCY}
    if precision in ("f32", "bf16"):
        config[hints.inference_precision] = ov.Type.f32 if precision == "f32" else ov.Type.bf16
    if threads:
        config[props.inference_num_threads] = threads
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    # What the runtime says it runs, never what was asked: OpenVINO ignores a bf16 hint where the
    # CPU cannot run bf16 at all (AVX2), and honours it by emulation on AVX-512 without bf16 units
    # (OPTIMIZATION_CAPABILITIES lists BF16 only for native units).
    used = compiled.get_property(hints.inference_precision).get_type_name()  # "f32", "bf16"
    emulated = used == "bf16" and not _cpu_has_bf16()
    if emulated:
        logger.warning(
            "OpenVINO runs bf16 emulated on this CPU (no BF16 among its "
            "OPTIMIZATION_CAPABILITIES): bf16 rounding without bf16's speed; "
            "precision auto would not choose it"
        )
    # One request, reused: an engine calls a worker's model from one thread at a time, and
    # an InferRequest must not be used from two threads at once.
    request = compiled.create_infer_request()
    outputs = compiled.output("embedding"), compiled.output("logits")

    def forward(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # share_inputs: no input copy; outputs are copied out of the request's buffers.
        result = request.infer({0: batch.contiguous().numpy()}, share_inputs=True)
        return torch.from_numpy(result[outputs[0]]), torch.from_numpy(result[outputs[1]])

    for size in warmup:
        forward(torch.zeros(size, 3, 224, 224))
    logger.info(
        "OpenVINO %s: %s, inference precision %s%s, %s threads",
        ov.get_version(),
        path.name,
        used,
        " (int8 layers)" if quantised else "",
        compiled.get_property(props.inference_num_threads),
    )
    return Backend(
        "openvino", f"int8+{used}" if quantised else used, path.name, "cpu", forward, emulated
    )


def _onnx(path: Path, device: torch.device, options: RuntimeOptions) -> Backend:
    import onnxruntime as ort

    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if options.threads:
        session_options.intra_op_num_threads = options.threads
        session_options.inter_op_num_threads = 1
    session_options.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if options.spin else "0"
    )
    providers: list[str | tuple[str, dict]] = ["CPUExecutionProvider"]
    if device.type == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
        else:  # the pinned onnxruntime wheel is the CPU build
            logger.warning(
                "ONNX Runtime has no CUDA provider here: running on CPU although "
                "the worker has %s; archive with BACKEND=eager for the GPU",
                device,
            )
    session = ort.InferenceSession(str(path), session_options, providers=providers)
    input_name = session.get_inputs()[0].name

    def forward(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedding, logits = session.run(["embedding", "logits"], {input_name: batch.numpy()})
        return torch.from_numpy(embedding), torch.from_numpy(logits)

    on_gpu = session.get_providers()[0] == "CUDAExecutionProvider"
    return Backend("onnx", "f32", path.name, str(device) if on_gpu else "cpu", forward)
