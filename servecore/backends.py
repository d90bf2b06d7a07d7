"""Runtimes that turn a preprocessed batch into ``(embedding, logits)``, both on CPU, float32.

A ``Backend`` (``servecore.runtime``) is one loaded runtime with a name: which runtime
(``name``), the arithmetic it really runs (``precision``, what ``describe`` reports) and its
``forward``. Its input is the
served model's (``model_files.resnet_dual``): uint8 crops, normalised inside the model (in the
exported graph, or by the eager module on its own device). Each crosses the device boundary
once per batch: one copy in (uint8, from page-locked memory on a GPU), one forward, one copy
out.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from model_files.artifacts import QUANTIZED, SERIALIZED, fidelity_record, is_quantised
from model_files.recipe import ROW
from servecore.precision import Candidate, failures
from servecore.runtime import Backend

logger = logging.getLogger(__name__)

# load_backend's precision when none is forced: whatever the runtime picks on this host,
# unmeasured (not ``handler.precision: auto``, which measures the candidates).
RUNTIME_DEFAULT = "runtime-default"

# The half precisions ``auto`` times on a GPU beside f32 (eager PyTorch).
_GPU_HALVES = {"f16": torch.float16, "bf16": torch.bfloat16}
_PRECISION_OF = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class RuntimeOptions:
    """How a runtime is set up, from the handler's settings (``HandlerConfig``): intra-op
    ``threads`` (0: the runtime's default), ONNX Runtime's ``spin`` (busy-waiting threads) and
    ``half`` (float16, eager on CUDA only: ``handler.half_precision``); ``max_rows``: the
    largest batch the worker runs (eager on CUDA pads every batch up to one of
    ``padded_sizes(max_rows)``; 0: no padding); ``graphs``: eager on CUDA replays each of those
    sizes as a CUDA graph (``handler.cuda_graphs``)."""

    threads: int = 0
    spin: bool = False
    half: bool = False
    max_rows: int = 0
    graphs: bool = False


def padded_sizes(max_rows: int) -> tuple[int, ...]:
    """The batch sizes an eager CUDA worker runs: the powers of two below a step (8, or an
    eighth of ``max_rows`` rounded up to a multiple of 8), then each multiple of the step below
    ``max_rows``, and ``max_rows``. cuDNN's autotuner picks a batch size's convolutions on its
    first call (a few hundred milliseconds each); a worker pads every batch up to the next of
    these sizes and autotunes each once when it loads, so no request pays it. A batch runs at
    most a step - 1 rows more than it holds, whatever the parts the overlap cuts it into (64
    rows in 3 parts: 3 x 24, not 3 x 32 as at powers of two)."""
    if max_rows < 1:
        return ()
    step = max(8, -(-max_rows // 64) * 8)
    powers = {1 << i for i in range(step.bit_length()) if 1 << i < min(step, max_rows)}
    return tuple(sorted(powers | set(range(step, max_rows, step)) | {max_rows}))


def padded_rows(rows: int, sizes: tuple[int, ...]) -> int:
    """The rows a batch of ``rows`` runs as: the smallest of ``sizes`` that holds it (itself
    when none is given or none holds it)."""
    return next((size for size in sizes if size >= rows), rows)


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


def device_memory(device: torch.device) -> dict | None:
    """This process's memory on a CUDA ``device``, bytes: what PyTorch's caching allocator
    holds (``reserved``) and what tensors use of it (``allocated``), and the device's
    ``free`` and ``total`` (every process's); None on a CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return {
        "pid": os.getpid(),
        "reserved_bytes": torch.cuda.memory_reserved(device),
        "allocated_bytes": torch.cuda.memory_allocated(device),
        "device_free_bytes": free,
        "device_total_bytes": total,
    }


def load_backend(
    kind: str,
    path: Path,
    device: torch.device,
    options: RuntimeOptions = RuntimeOptions(),
    precision: str = RUNTIME_DEFAULT,
    warmup: tuple[int, ...] = (),
) -> Backend:
    """Load the serialized model at ``path`` for ``kind`` (eager, torchscript, onnx, openvino).

    ``precision``: ``f32``, ``bf16`` or ``int8`` (OpenVINO only), or ``RUNTIME_DEFAULT``: the
    runtime's own choice, unmeasured (``handler.precision: auto`` measures instead:
    servecore/autoprecision.py). ``warmup``: batch sizes OpenVINO runs once at load (its first
    call at a new batch size is 1.2-3.5x slower than the next ones).
    """
    if kind == "openvino":
        return _openvino(path, options.threads, precision, warmup)
    if precision not in (RUNTIME_DEFAULT, "f32"):
        raise ValueError(
            f"handler.precision {precision!r} needs an OpenVINO archive "
            f"(BACKEND=openvino); this one is {kind}: use auto or f32"
        )
    if kind == "onnx":
        return _onnx(path, device, options)
    dtype = torch.float16 if options.half else torch.float32
    return _torch(kind, path, device, dtype, options)


def precision_candidates(
    kind: str,
    folder: Path,
    serialized: str,
    device: torch.device,
    options: RuntimeOptions,
    allow_int8: bool = True,
) -> list[Candidate]:
    """What ``handler.precision: auto`` chooses from in ``folder``, most precise first: a
    ``Candidate`` with its ``load`` for each precision this archive, device and config can
    serve, one with why it is ``excluded`` for each they cannot.

    OpenVINO: every IR the folder carries (the float32 one, the int8 one when its fidelity
    record passed the gate and ``allow_int8``) at f32 and, where the CPU has bf16 units, bf16.
    Eager on CUDA: f32, f16 and, where the GPU has it, bf16. Anything else: f32 only.
    """
    candidates: list[Candidate] = []
    if kind == "openvino":
        bf16 = _cpu_has_bf16()
        irs = {"": SERIALIZED["openvino"], "int8+": QUANTIZED[("openvino", "int8")]}
        for prefix, path in ((p, folder / name) for p, name in irs.items()):
            if not path.is_file():
                continue
            if prefix and (why := _int8_unusable(path, allow_int8)):
                candidates.append(Candidate(f"{prefix}f32", excluded=why))
                continue
            for inference in ("f32", "bf16"):
                if inference == "bf16" and not bf16:
                    candidates.append(
                        Candidate(
                            prefix + inference, excluded="this CPU has no bf16 units (OpenVINO)"
                        )
                    )
                else:
                    candidates.append(
                        Candidate(
                            prefix + inference,
                            load=partial(_openvino, path, options.threads, inference, ()),
                        )
                    )
        return candidates
    path = folder / serialized
    if kind == "onnx":
        return [Candidate("f32", load=partial(_onnx, path, device, options))]
    candidates.append(Candidate("f32", load=partial(_torch, kind, path, device, options=options)))
    if device.type != "cuda":
        return candidates
    for name, dtype in _GPU_HALVES.items():
        if kind != "eager":
            why = f"{kind} holds its weights as float32 constants: {name} is eager-only"
        elif dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            why = f"{torch.cuda.get_device_name(device)} has no bf16 support"
        else:
            candidates.append(
                Candidate(name, load=partial(_torch, kind, path, device, dtype, options))
            )
            continue
        candidates.append(Candidate(name, excluded=why))
    return candidates


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


def _torch(
    kind: str,
    path: Path,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    options: RuntimeOptions = RuntimeOptions(),
) -> Backend:
    """Eager PyTorch (the checkpoint, as ``ServedResNet50``) or TorchScript (exported with the
    normalisation in it). ``dtype``: eager on CUDA only (a frozen TorchScript module holds its
    weights as float32 constants); elsewhere float32.

    On a GPU, eager runs channels_last with cuDNN's autotuner on (a batch size's fastest
    convolutions are found on its first call), every batch padded up to one of
    ``padded_sizes(options.max_rows)``, each autotuned here, at load, then with
    ``options.graphs`` captured as a CUDA graph each (``CudaGraphs``); its ``start`` leaves the
    outputs on the device. A CPU batch goes over from page-locked memory (the copy is
    asynchronous; torch's page-locked allocator reuses a buffer only once its copy is done)."""
    on_gpu = device.type == "cuda"
    if kind == "torchscript":
        module = torch.jit.load(str(path), map_location=device).eval()
    else:
        from model_files.resnet_dual import build_served

        module = build_served(torch.load(path, map_location="cpu", weights_only=True)).to(device)
    eager_gpu = on_gpu and kind == "eager"
    if not eager_gpu:
        dtype = torch.float32
    module = module.to(dtype)
    if eager_gpu:
        torch.backends.cudnn.benchmark = True
        module = module.to(memory_format=torch.channels_last)
        module.channels_last = True
    sizes = padded_sizes(options.max_rows) if eager_gpu else ()

    def run(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = len(batch)
        padding = padded_rows(rows, sizes) - rows
        if padding:  # rows of zeros: each row's answer is its own (eval mode)
            batch = torch.cat([batch, batch.new_zeros((padding, *batch.shape[1:]))])
        embedding, logits = module(batch)
        return embedding[:rows], logits[:rows]

    with torch.inference_mode():
        for size in sizes:  # cuDNN's autotuning of every size the worker will run, now
            run(torch.zeros(size, *ROW, dtype=torch.uint8, device=device))
    graphs, replayed = None, ""
    if eager_gpu:
        graphs, replayed = (
            CudaGraphs.capture(module, sizes, device)
            if options.graphs
            else (None, "off (handler.cuda_graphs: false)")
        )
    launch = graphs or run

    def start(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            if batch.device != device:
                batch = batch.pin_memory().to(device, non_blocking=True)
            return launch(batch)

    def forward(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not on_gpu:
            with torch.inference_mode():
                return run(batch)
        embedding, logits = start(batch)
        return embedding.float().cpu(), logits.float().cpu()

    return Backend(
        kind,
        _PRECISION_OF[dtype],
        path.name,
        str(device),
        forward,
        start=start if eager_gpu else None,
        graphs=replayed,
    )


Graph = tuple[Any, torch.Tensor, tuple[torch.Tensor, ...]]  # CUDAGraph, static input, outputs


class CudaGraphs:
    """The served module replayed as one CUDA graph per padded batch size: a batch is copied
    into its size's static input, the graph replayed, its rows of the static outputs copied out
    (the next replay of that size overwrites them). One replay stands for the hundreds of
    kernels the eager forward launches from Python, each some microseconds of the worker's CPU.
    The graphs share one memory pool, captured largest first, and a replay of one size may
    overwrite the memory another's outputs are in: sound only because a replay's outputs are
    cloned at once, on the same stream, before anything else replays: ``__call__`` holds a
    lock from the copy in to the clones out (one engine thread calls it; the lock keeps a
    second from interleaving). A batch larger than every size runs eagerly. No GPU has run
    this yet: tests/test_gpu_choices.py drives it with a stand-in for ``torch.cuda``'s graph
    calls."""

    def __init__(self, module: Callable, graphs: dict[int, Graph]) -> None:
        self.module = module
        self.graphs = graphs
        self.lock = threading.Lock()

    @classmethod
    def capture(
        cls, module: Callable, sizes: tuple[int, ...], device: torch.device, cuda=torch.cuda
    ) -> tuple[CudaGraphs | None, str]:
        """The graphs of ``sizes`` (each warmed up on the capture stream first, as capture
        needs) and what describe reports of them: their sizes, or (None, why) when a capture
        fails or a replay answers otherwise than the eager forward (the worker then runs
        eagerly, logged). ``cuda``: ``torch.cuda`` unless a test stands in for it."""
        try:
            graphs: dict[int, Graph] = {}
            pool = cuda.graph_pool_handle()
            stream = cuda.Stream(device)
            with torch.inference_mode():
                for size in sorted(sizes, reverse=True):
                    static = torch.zeros(size, *ROW, dtype=torch.uint8, device=device)
                    stream.wait_stream(cuda.current_stream(device))
                    with cuda.stream(stream):
                        module(static)
                    cuda.current_stream(device).wait_stream(stream)
                    graph = cuda.CUDAGraph()
                    with cuda.graph(graph, pool=pool, stream=stream):
                        outputs = module(static)
                    graphs[size] = (graph, static, tuple(outputs))
                replayed = cls(module, graphs)
                for size in sorted({min(sizes), max(sizes)}):
                    replayed.check(size, device)
        except Exception as error:  # noqa: BLE001 - any failure to capture: eager instead
            logger.warning("CUDA graphs: capture failed, running eagerly: %s", error)
            return None, f"off (capture failed: {type(error).__name__}: {str(error)[:200]})"
        return replayed, ", ".join(map(str, sorted(graphs)))

    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = len(batch)
        size = next((s for s in sorted(self.graphs) if s >= rows), None)
        with torch.inference_mode():  # the static tensors were made under it
            if size is None:
                embedding, logits = self.module(batch)
                return embedding, logits
            graph, static, (embedding, logits) = self.graphs[size]
            with self.lock:
                static[:rows].copy_(batch)
                graph.replay()
                return embedding[:rows].clone(), logits[:rows].clone()

    def check(self, size: int, device: torch.device) -> None:
        """A replay of ``size`` rows of seeded noise answers as the eager forward, else raises."""
        generator = torch.Generator().manual_seed(0)
        probe = torch.randint(0, 256, (size, *ROW), dtype=torch.uint8, generator=generator)
        probe = probe.to(device)
        replayed = [t.float() for t in self(probe)]
        eager = [t.float() for t in self.module(probe)]
        for got, expected in zip(replayed, eager, strict=True):
            if not torch.allclose(got, expected, rtol=1e-3, atol=1e-3):
                raise RuntimeError(
                    f"a replay of {size} rows differs from the eager forward by up to "
                    f"{float((got - expected).abs().max()):.3g}"
                )


def _openvino(path: Path, threads: int, precision: str, warmup: tuple[int, ...]) -> Backend:
    """Compile the IR at ``path`` (its .bin beside it) for the CPU with the latency hint: one
    stream using every core for one synchronous request (the throughput hint splits the cores
    into streams and ran half as fast here).

    ``precision``: ``f32``, ``bf16``, or ``RUNTIME_DEFAULT`` (OpenVINO's choice: bf16 where the
    CPU has bf16 units, else f32). An int8 IR (buildsteps/quantize.py) runs its quantised layers in
    int8 and the others at that precision; ``int8`` then means ``RUNTIME_DEFAULT``.
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
        forward(torch.zeros(size, 3, 224, 224, dtype=torch.uint8))
    logger.info(
        "OpenVINO %s: %s, inference precision %s%s, %s threads",
        ov.get_version(),
        path.name,
        used,
        " (int8 layers)" if quantised else "",
        compiled.get_property(props.inference_num_threads),
    )
    return Backend(
        "openvino",
        f"int8+{used}" if quantised else used,
        path.name,
        "cpu",
        forward,
        emulated,
        torch_threads=False,
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
    device_name = str(device) if on_gpu else "cpu"
    return Backend("onnx", "f32", path.name, device_name, forward, torch_threads=False)
