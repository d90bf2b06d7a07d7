"""``handler.precision`` at worker start: measure the candidates, choose, and keep the answer
stable (the rule itself is ``model_files.precision``).

* Bounded: each candidate is compiled and run once at every served batch size (the warm-up a
  worker needs anyway; it also gives the outputs fidelity is judged on), then one round of
  one timed forward per candidate and batch size, and more rounds while the whole
  measurement fits in ``BUDGET_S`` (one round when there is a single candidate). The floor
  is two forwards per candidate at each batch size, whatever the machine's speed.
* One precision per model: TorchServe 0.12 extracts an archive once per registration into one
  folder that every worker of the model loads from (``ModelArchive.downloadModel`` ->
  ``ZipUtils.unzip`` into ``$TMPDIR/models/<random id>``; ``ModelLoadModelRequest`` passes
  ``model.getModelDir()`` to each worker). The first worker measures under a lock there and
  writes ``CHOICE_FILE``; the others wait on the lock and serve what it chose.
* Stable across restarts: the last choice per host and archive is kept in a small JSON file
  (``cache_file``), and ``select`` keeps it while it stays within the margin. The same file's
  lock keeps two models of one host from timing on top of each other. An unwritable folder
  costs the sharing or the memory, never the start.
* An explicit precision is loaded as asked, without timing; its reason cites the last ``auto``
  measurement of this host and archive when one was clearly faster.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from model_files.backends import Backend, load_backend, precision_candidates
from model_files.precision import (FIDELITY_BOUND, Candidate, Choice, agreement, failures,
                                   forced, select)

logger = logging.getLogger(__name__)

CHOICE_FILE = "precision-choice.json"
BUDGET_S = 4.0  # loading, warm-up and timed rounds; one timed round runs whatever it costs
MAX_ROUNDS = 5
CACHE_ENTRIES = 64  # host cache: the most recently written archives kept
_clock = time.perf_counter  # what forwards are timed with (tests give a simulated one)


def cache_file(setting: str, environ=os.environ) -> Path | None:
    """The host cache: ``setting`` (``handler.precision_cache``) when given, ``off`` for none,
    else ``$XDG_CACHE_HOME/resnet50-serve/precision.json`` (``~/.cache`` when unset)."""
    if setting == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "resnet50-serve" / "precision.json"


def host_identity() -> dict:
    """What makes timings comparable between two starts: machine name, CPU model, cores."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"node": platform.node(), "cpu": cpu, "cores": os.cpu_count()}


def probe_batch(size: int, seed: int = 0) -> torch.Tensor:
    """``size`` fixed, image-like inputs (smooth seeded colour fields at the normalised scale
    of the weights' transform): the same on every host and every start."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(size, 3, 7, 7, generator=generator)
    return torch.nn.functional.interpolate(coarse, size=(224, 224), mode="bicubic",
                                           align_corners=False).contiguous()


def measure(loaders: dict[str, Callable[[], Backend]], excluded: dict[str, str],
            batch_sizes: tuple[int, ...], budget_s: float = BUDGET_S
            ) -> tuple[list[Candidate], dict[str, Backend]]:
    """Load and time every loader (most precise first: the first is the fidelity reference).
    Returns the candidates (timed ones, then ``excluded`` untimed) and the loaded backends."""
    started = time.monotonic()
    probe = probe_batch(max(batch_sizes))
    backends, outputs = {}, {}
    for name, load in loaders.items():
        backends[name] = load()
        for size in batch_sizes:
            result = backends[name](probe[:size])
        outputs[name] = tuple(t.numpy() for t in result)  # at the largest size
    times: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batch_sizes} for n in loaders}
    rounds, round_s = 0, 0.0
    # One candidate: its timing is reported, not compared, so one round is enough.
    most = MAX_ROUNDS if len(loaders) > 1 else 1
    while rounds < most and (rounds == 0 or time.monotonic() - started + round_s <= budget_s):
        round_started = time.monotonic()
        for name, backend in backends.items():  # interleaved: drift hits every candidate alike
            for size in batch_sizes:
                t = _clock()
                backend(probe[:size])
                times[name][size].append(1000 * (_clock() - t))
        round_s, rounds = time.monotonic() - round_started, rounds + 1
    reference = next(iter(loaders))
    candidates = []
    for name in loaders:
        fidelity = None if name == reference else agreement(outputs[reference], outputs[name])
        failed = failures(fidelity, FIDELITY_BOUND) if fidelity else []
        candidates.append(Candidate(
            name, {b: statistics.median(ms) for b, ms in times[name].items()}, fidelity,
            f"against {reference} on the probe: {'; '.join(failed)}" if failed else ""))
    candidates += [Candidate(name, excluded=why) for name, why in excluded.items()]
    return candidates, backends


def choose(loaders: dict[str, Callable[[], Backend]], excluded: dict[str, str],
           batch_sizes: tuple[int, ...], model_dir: Path, archive: dict,
           cache: Path | None, budget_s: float = BUDGET_S) -> tuple[Backend, Choice]:
    """``auto``: the backend to serve and the choice. ``archive``: what identifies the model
    being measured (weights, file, settings); measured once per model, remembered per host."""
    host_key = _key({"host": host_identity(), **archive, "candidates": list(loaders)})
    # The frontend's pid: a choice left by another server in the same folder is not reused.
    model_key = _key({"host": host_key, "frontend": os.getppid()})
    with _locked(model_dir / f".{CHOICE_FILE}.lock"):
        shared = _read(model_dir / CHOICE_FILE).get(model_key)
        if shared is None:
            with _locked(cache and cache.with_name(cache.name + ".lock")):
                started = time.monotonic()  # the cost of measuring, not of waiting for the lock
                previous = _read(cache).get(host_key, {}).get("choice", {}).get("choice")
                candidates, backends = measure(loaders, excluded, batch_sizes, budget_s)
                choice = select(candidates, previous)
                # Through as_dict: the rounded form the other workers read from CHOICE_FILE.
                choice = Choice.from_dict(choice.as_dict(), source=(
                    f"worker pid {os.getpid()} in {time.monotonic() - started:.1f} s"))
                _remember(cache, host_key, choice)
            _write(model_dir / CHOICE_FILE, {model_key: {"choice": choice.as_dict()}})
            return backends[choice.precision], choice
    # Another worker measured: load what it chose (outside the lock: workers load in parallel).
    choice = Choice.from_dict(shared["choice"])
    backend = loaders[choice.precision]()
    for size in batch_sizes:
        backend(torch.zeros(size, 3, 224, 224))
    return backend, choice


def explicit(requested: str, load: Callable[[], Backend], archive: dict,
             candidates: list[str], cache: Path | None) -> tuple[Backend, Choice]:
    """An explicit precision: load it; the choice cites this host's last ``auto`` timings."""
    backend = load()
    host_key = _key({"host": host_identity(), **archive, "candidates": candidates})
    last = _read(cache).get(host_key, {}).get("choice")
    return backend, forced(requested, backend.precision,
                           Choice.from_dict(last).candidates if last else None)


def _key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _remember(cache: Path | None, key: str, choice: Choice) -> None:
    entries = _read(cache)
    entries[key] = {"choice": choice.as_dict(), "at": time.time()}
    newest = sorted(entries.items(), key=lambda kv: kv[1].get("at", 0))[-CACHE_ENTRIES:]
    _write(cache, dict(newest))


def _read(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        logger.warning("precision: ignoring unreadable %s (%s)", path, error)
        return {}


def _write(path: Path | None, entries: dict) -> None:
    """Atomically (a rename), or a warning when the folder is not writable."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        staged.write_text(json.dumps(entries, indent=1) + "\n")
        staged.replace(path)
    except OSError as error:
        logger.warning("precision: cannot write %s (%s): the choice is not shared", path, error)


@contextlib.contextmanager
def _locked(path: Path | None):
    """An exclusive ``flock`` on ``path`` (None, or a folder not writable: no lock)."""
    handle = None
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = path.open("a")
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as error:
            logger.warning("precision: no lock %s (%s): workers may measure twice", path, error)
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            handle.close()  # closing releases the flock


def serving_backend(kind: str, model_dir: Path, serialized: str, device: torch.device, *,
                    precision: str, batch_sizes: tuple[int, ...], weights_sha256: str,
                    half: bool = False, threads: int = 0, spin: bool = False,
                    allow_int8: bool = True, cache_setting: str = "") -> tuple[Backend, Choice]:
    """The backend a worker serves and the choice behind it, from the handler's settings
    (``handlers.config.HandlerConfig``: precision, half_precision, threads, onnx_spinning,
    auto_int8, precision_cache). ``half`` on an eager CUDA worker is an explicit f16. ``auto``
    with a single candidate is measured on OpenVINO only, whose warm-up it times."""
    loaders, excluded = precision_candidates(kind, model_dir, serialized, device,
                                             threads=threads, spin=spin, allow_int8=allow_int8)
    archive = {"backend": kind, "serialized": serialized, "weights": weights_sha256,
               "batch_sizes": list(batch_sizes), "threads": threads, "device": device.type}
    cache = cache_file(cache_setting)
    if half and device.type == "cuda" and kind == "eager":
        precision = "f16"
    if precision == "auto" and (len(loaders) > 1 or kind == "openvino"):
        return choose(loaders, excluded, batch_sizes, model_dir, archive, cache)
    if precision == "auto":
        # Nothing to choose and no warm-up to time for free (OpenVINO warms up anyway).
        (only,) = loaders.values()
        return only(), Choice("f32", f"the only precision {kind} runs on {device.type}",
                              tuple(Candidate(n, excluded=why) for n, why in excluded.items()))
    return explicit(precision, lambda: load_backend(
        kind, model_dir / serialized, device, half=half, threads=threads, spin=spin,
        precision="auto" if precision == "f16" else precision, warmup=batch_sizes),
        archive, list(loaders), cache)
