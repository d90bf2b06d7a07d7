"""``handler.precision`` at worker start: measure the candidates, choose, and keep the answer
stable (the rule itself is ``servecore.precision``).

* Bounded: each candidate is compiled and run once at every served batch size (the warm-up a
  worker needs anyway; it also gives the outputs fidelity is judged on), then one round of
  one timed forward per candidate and batch size, and more rounds while the whole
  measurement fits in ``BUDGET_S`` (one round when there is a single candidate). The floor
  is two forwards per candidate at each batch size, whatever the machine's speed. One clock
  (``_clock``, monotonic) times the forwards and the budget.
* One precision per model: the workers of one model on one host serve what the first of them
  measured. It writes its choice to ``CHOICE_FILE`` beside the host cache (below; the folder
  the engine loads the model's files from when there is none), keyed by the host, the model's
  name and version and the archive (the weights' content hash, serialized file, batch sizes,
  threads, device, candidates), with itself as a holder. Beside the cache, because a model's
  bulk lane (``servecore/lanes.py``) is a second registration whose files the engine unpacks
  into a folder of its own, and it must serve the model's choice. A worker that finds a
  choice there held by a live worker (pid and start time) waits on the lock and serves it,
  joining the holders. A choice whose holders are all gone (the previous start of the
  server) is measured again: every engine's workers can tell that, whatever its process tree
  or folder layout.
* Measured once per host and archive: the choice is kept in a small JSON file (the host
  cache), keyed by the host, the archive and the versions of the libraries that run it, and
  every later worker of that key serves it without timing again (a worker restarted after a
  crash, one scaled up, the server's next start): a worker then starts in the time it takes to
  load one backend, not every candidate (results/worker-start.md). A changed archive, library
  version, device or batch size is another key, measured again; ``select`` keeps the
  previous choice of the same host and archive while the new timings stay within the margin.
  To measure again on purpose: delete the host cache, or ``handler.precision_cache: off``.
* One lock (``ChoiceStore.locked``): the host cache's, so that two models of one host do not
  time on top of each other either; the model folder's when there is no host cache. An
  unwritable folder costs the sharing or the memory, never the start.
* An explicit precision is loaded as asked, without timing; its reason cites the last ``auto``
  measurement of this host and archive when one was clearly faster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gc
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from importlib import metadata
from pathlib import Path

import psutil
import torch

from model_files.artifacts import ModelFiles
from servecore.backends import (
    RUNTIME_DEFAULT,
    Backend,
    RuntimeOptions,
    load_backend,
    precision_candidates,
)
from servecore.config import HandlerConfig
from servecore.host import cpu_model
from servecore.precision import (
    FIDELITY_BOUND,
    Candidate,
    Choice,
    agreement,
    failures,
    forced,
    select,
)

logger = logging.getLogger(__name__)

CHOICE_FILE = "precision-choice.json"
BUDGET_S = 4.0  # loading, warm-up and timed rounds; one timed round runs whatever it costs
MAX_ROUNDS = 5
CACHE_ENTRIES = 64  # host cache: the most recently written archives kept
_clock = time.perf_counter  # the one clock (monotonic); tests give a simulated one


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
    return {"node": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count()}


def probe_batch(size: int, seed: int = 0) -> torch.Tensor:
    """``size`` fixed, image-like inputs, as the served model takes them (uint8 crops): smooth
    seeded colour fields spread over the pixel range, the same on every host and every start."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(size, 3, 7, 7, generator=generator)
    smooth = torch.nn.functional.interpolate(
        coarse, size=(224, 224), mode="bicubic", align_corners=False
    )
    return (smooth * 64 + 128).clamp(0, 255).round().to(torch.uint8).contiguous()


def measure(
    candidates: list[Candidate],
    batch_sizes: tuple[int, ...],
    budget_s: float = BUDGET_S,
    heads: Sequence[slice] = (),
) -> tuple[list[Candidate], dict[str, Backend]]:
    """Load and time every candidate that has a loader (most precise first: the first is the
    fidelity reference, its agreement judged per head of ``heads``) at ``batch_sizes``.
    Returns the candidates (timed ones, then the excluded untimed), their milliseconds rounded
    as they are kept, and the loaded backends."""
    started = _clock()
    probe = probe_batch(max(batch_sizes))
    loaders = _loaders(candidates)
    backends, outputs = {}, {}
    for name, load in loaders.items():
        backends[name] = load()
        for size in batch_sizes:
            result = backends[name](probe[:size])
        embedding, logits = result
        outputs[name] = (embedding.numpy(), logits.numpy())  # at the largest size
    times: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batch_sizes} for n in backends}
    rounds, round_s = 0, 0.0
    # One candidate: its timing is reported, not compared, so one round is enough.
    most = MAX_ROUNDS if len(backends) > 1 else 1
    while rounds < most and (rounds == 0 or _clock() - started + round_s <= budget_s):
        round_started = _clock()
        for name, backend in backends.items():  # interleaved: drift hits every candidate alike
            for size in batch_sizes:
                t = _clock()
                backend(probe[:size])
                times[name][size].append(1000 * (_clock() - t))
        round_s, rounds = _clock() - round_started, rounds + 1
    reference = next(iter(backends))
    measured = []
    for candidate in (c for c in candidates if c.precision in loaders):
        name = candidate.precision
        fidelity = (
            None if name == reference else agreement(outputs[reference], outputs[name], heads)
        )
        failed = failures(fidelity, FIDELITY_BOUND) if fidelity else []
        measured.append(
            dataclasses.replace(
                candidate,
                ms={b: round(statistics.median(ms), 1) for b, ms in times[name].items()},
                fidelity=fidelity,
                excluded=f"against {reference} on the probe: {'; '.join(failed)}" if failed else "",
            )
        )
    measured += [c for c in candidates if c.load is None]
    return measured, backends


class ChoiceStore:
    """Where choices are kept: ``CHOICE_FILE`` beside the host cache, else in the model's
    folder (the workers of the model on this host share it while one of them lives) and the
    host cache (the last choice per host and archive, across restarts); and the one lock that
    orders measuring. ``model``: the model's name and version, as the engine loaded it."""

    def __init__(self, model_dir: Path, cache: Path | None, archive: dict, model: str = "") -> None:
        self.shared_file = (cache.parent if cache else model_dir) / CHOICE_FILE
        self.cache = cache
        self.host_key = _key({"host": host_identity(), **archive})
        self.model_key = _key({"host": self.host_key, "model": model})
        self.lock_files = [
            path
            for path in (
                cache and cache.with_name(cache.name + ".lock"),
                model_dir / f".{CHOICE_FILE}.lock",
            )
            if path
        ]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive ``flock`` on the first lock file that can be opened (none: no lock,
        with a warning; workers may then measure twice)."""
        handle = None
        for path in self.lock_files:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                handle = path.open("a")
                break
            except OSError as error:
                logger.warning("precision: no lock %s (%s)", path, error)
        try:
            if handle is not None:
                fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            if handle is not None:
                handle.close()  # closing releases the flock

    def shared(self) -> Choice | None:
        """The choice a live worker of this model on this host serves, if any."""
        entry = _read(self.shared_file).get(self.model_key)
        if entry and any(_alive(holder) for holder in entry.get("holders", [])):
            return Choice.from_dict(entry["choice"])
        return None

    def join(self) -> None:
        """This worker serves the shared choice too: one more holder (the dead ones dropped)."""
        entries = _read(self.shared_file)
        entry = entries.get(self.model_key)
        if entry:
            me = _me()
            entry["holders"] = [h for h in entry.get("holders", []) if _alive(h) and h != me] + [me]
            _write(self.shared_file, entries)

    def last(self) -> Choice | None:
        """The last choice on this host for this archive, if remembered."""
        entry = _read(self.cache).get(self.host_key)
        return Choice.from_dict(entry["choice"]) if entry else None

    def stored(self) -> Choice | None:
        """The choice measured on this host for this archive and libraries (the host cache's
        entry of this key), saying when, if one is kept."""
        entry = _read(self.cache).get(self.host_key)
        if not entry:
            return None
        choice = Choice.from_dict(entry["choice"])
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(entry.get("at", 0)))
        return dataclasses.replace(choice, source=f"stored on this host at {when}: {choice.source}")

    def adopt(self, choice: Choice) -> Choice:
        """This worker serves ``choice`` and holds it for the model's later workers (the
        holders of other models' choices that are gone dropped)."""
        shared = {
            k: v
            for k, v in _read(self.shared_file).items()
            if any(_alive(h) for h in v.get("holders", []))
        }
        shared[self.model_key] = {"choice": choice.as_dict(), "holders": [_me()]}
        _write(self.shared_file, shared)
        return choice

    def keep(self, choice: Choice) -> None:
        """A choice this worker measured: kept for the host and shared with the model's
        workers."""
        entries = _read(self.cache)
        entries[self.host_key] = {"choice": choice.as_dict(), "at": time.time()}
        newest = sorted(entries.items(), key=lambda kv: kv[1].get("at", 0))[-CACHE_ENTRIES:]
        _write(self.cache, dict(newest))
        self.adopt(choice)


def _me() -> dict:
    """This worker as a holder of a shared choice: its pid and start time (a pid alone may be
    reused)."""
    return {"pid": os.getpid(), "started": psutil.Process().create_time()}


def _alive(holder: dict) -> bool:
    try:
        return psutil.Process(holder["pid"]).create_time() == holder["started"]
    except (psutil.Error, KeyError, TypeError):
        return False


def choose(
    candidates: list[Candidate],
    batch_sizes: tuple[int, ...],
    store: ChoiceStore,
    budget_s: float = BUDGET_S,
    heads: Sequence[slice] = (),
) -> tuple[Backend, Choice]:
    """``auto``: the backend to serve and the choice, measured once per model (the first
    worker), remembered per host."""
    loaders = _loaders(candidates)
    with store.locked():
        shared = store.shared()
        stored = store.stored() if shared is None else None
        if stored is not None and stored.precision in loaders:
            shared = store.adopt(stored)
        elif shared is None:
            started = _clock()  # the cost of measuring, not of waiting for the lock
            last = store.last()
            measured, backends = measure(candidates, batch_sizes, budget_s, heads)
            choice = dataclasses.replace(
                select(measured, last.precision if last else None),
                source=f"worker pid {os.getpid()} in {_clock() - started:.1f} s",
            )
            store.keep(choice)
            chosen = backends.pop(choice.precision)
            backends.clear()
            _release_device_memory()  # the others' weights, tuned sizes and CUDA graphs
            return chosen, choice
        else:
            store.join()
    # Measured before: load what was chosen (outside the lock: workers load in parallel).
    backend = loaders[shared.precision]()
    for size in batch_sizes:
        backend(torch.zeros(size, 3, 224, 224, dtype=torch.uint8))
    return backend, shared


def explicit(
    requested: str, load: Callable[[], Backend], store: ChoiceStore
) -> tuple[Backend, Choice]:
    """An explicit precision: load it; the choice cites this host's last ``auto`` timings."""
    backend = load()
    last = store.last()
    choice = forced(requested, backend.precision, list(last.candidates) if last else None)
    if backend.emulated:
        choice = dataclasses.replace(
            choice,
            reason=choice.reason
            + (
                f"; {backend.name} runs {backend.precision} emulated on this CPU (it lists no "
                "native units for it): expect it slower than f32"
            ),
        )
    return backend, choice


def serving_backend(
    files: ModelFiles,
    config: HandlerConfig,
    device: torch.device,
    batch_sizes: tuple[int, ...],
    model: str = "",
    heads: Sequence[slice] = (),
) -> tuple[Backend, Choice]:
    """The backend a worker of ``model`` (its name and version) serves and the choice behind
    it, from the handler's settings
    (precision, half_precision, threads, onnx_spinning, auto_int8, precision_cache, cuda_graphs:
    an eager GPU candidate is timed as it serves, replayed from its graphs).
    ``half_precision`` on an eager CUDA worker is an explicit f16. ``auto`` with a single
    candidate is measured on OpenVINO only, whose warm-up it times."""
    kind = files.backend
    options = RuntimeOptions(
        config.threads,
        config.onnx_spinning,
        config.half_precision,
        max(batch_sizes),
        config.cuda_graphs and device.type == "cuda",
    )
    candidates = precision_candidates(
        kind, files.folder, files.serialized, device, options, config.auto_int8
    )
    loaders = _loaders(candidates)
    archive = {
        "libraries": library_versions(),
        "backend": kind,
        "serialized": files.serialized,
        "weights": files.weights["sha256"],
        "batch_sizes": list(batch_sizes),
        "threads": config.threads,
        "device": device.type,
        "candidates": list(loaders),
        **({"cuda_graphs": options.graphs} if options.graphs else {}),
    }
    store = ChoiceStore(files.folder, cache_file(config.precision_cache), archive, model)
    precision = config.precision
    if config.half_precision and device.type == "cuda" and kind == "eager":
        precision = "f16"
    if precision == "auto" and (len(loaders) > 1 or kind == "openvino"):
        return choose(candidates, batch_sizes, store, heads=heads)
    if precision == "auto":
        # Nothing to choose and no warm-up to time for free (OpenVINO warms up anyway).
        (only,) = loaders.values()
        return only(), Choice(
            "f32",
            f"the only precision {kind} runs on {device.type}",
            tuple(c for c in candidates if c.load is None),
        )
    path = files.folder / files.serialized
    if precision == "int8":
        if files.int8 is None:
            raise ValueError(
                f"handler.precision is int8 but this archive carries no int8 "
                f"model beside {files.serialized}: build it with QUANTIZE=int8 "
                "(the default, BACKEND=openvino) and check the build's fidelity "
                "gate verdict (make weights)"
            )
        path = files.int8
    return explicit(
        precision,
        partial(
            load_backend,
            kind,
            path,
            device,
            options,
            RUNTIME_DEFAULT if precision == "f16" else precision,
            batch_sizes,
        ),
        store,
    )


def _release_device_memory() -> None:
    """On a GPU worker, the device memory torch's allocator holds but nothing uses (the
    backends ``auto`` timed and did not choose) handed back to the driver, for the decoder and
    the other workers of the GPU; nothing on a CPU worker."""
    if torch.cuda.is_initialized():
        gc.collect()  # a backend's graphs or closures may sit in a cycle
        torch.cuda.empty_cache()


def library_versions() -> dict[str, str | None]:
    """The versions of the runtimes a precision is timed on: another version, another key."""
    versions: dict[str, str | None] = {}
    for name in ("torch", "torchvision", "openvino", "onnxruntime"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _loaders(candidates: list[Candidate]) -> dict[str, Callable[[], Backend]]:
    """The candidates that can be loaded here, by precision, most precise first."""
    return {c.precision: c.load for c in candidates if c.load is not None}


def _key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


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
