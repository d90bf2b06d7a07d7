"""What a GPU worker chooses from and times at (#41): the candidates on CUDA, the batch sizes
``auto`` times there, the decode threads; and, where a GPU exists, its answers against the f32
CPU reference within the fidelity bound. The CUDA tests skip without one."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from model_files.artifacts import SERIALIZED
from servecore import backends, intake
from servecore.backends import load_backend, precision_candidates
from servecore.config import HandlerConfig
from servecore.intake import decode_threads
from servecore.precision import FIDELITY_BOUND, agreement, failures
from servecore.preprocessor import Preprocessor
from servecore.service import timed_batches
from tests import imagegen

CUDA = torch.device("cuda", 0)
CPU_DEVICE = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.mark.parametrize("bf16", [True, False])
def test_eager_on_a_gpu_offers_f32_f16_and_bf16_where_the_gpu_has_it(monkeypatch, tmp_path, bf16):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _device=None: "Test GPU")
    offered = precision_candidates(
        "eager", tmp_path, SERIALIZED["eager"], CUDA, backends.RuntimeOptions()
    )
    loadable = [c.precision for c in offered if c.load is not None]
    assert loadable == (["f32", "f16", "bf16"] if bf16 else ["f32", "f16"])
    if not bf16:
        (excluded,) = [c for c in offered if c.load is None]
        assert excluded.precision == "bf16" and "Test GPU has no bf16" in excluded.excluded


def test_torchscript_on_a_gpu_offers_f32_only_and_says_why(tmp_path):
    offered = precision_candidates(
        "torchscript", tmp_path, SERIALIZED["torchscript"], CUDA, backends.RuntimeOptions()
    )
    assert [c.precision for c in offered if c.load is not None] == ["f32"]
    assert all("eager-only" in c.excluded for c in offered if c.load is None)


def test_a_gpu_worker_times_its_served_batch_only_and_a_cpu_worker_1_and_it():
    assert timed_batches(CUDA, 64) == (64,)
    assert timed_batches(torch.device("cpu"), 64) == (1, 64)
    assert timed_batches(torch.device("cpu"), 1) == (1,)


def test_decode_threads_are_capped_on_a_cpu_worker_only(monkeypatch):
    monkeypatch.setattr(intake, "usable_cpus", lambda: 16)
    assert decode_threads(torch.device("cpu")) == intake.MAX_DECODE_THREADS
    assert decode_threads(CUDA) == 16


@needs_cuda
@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
def test_gpu_answers_agree_with_the_f32_cpu_reference(weights_dir, precision):
    """The eager model on the GPU at each precision against eager f32 on the CPU, on real
    crops: within the fidelity bound ``auto`` holds every candidate to."""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    checkpoint = weights_dir / SERIALIZED["eager"]
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[precision]
    gpu = backends._torch("eager", checkpoint, CUDA, dtype)
    cpu = load_backend("eager", checkpoint, torch.device("cpu"))
    preprocess = Preprocessor(HandlerConfig())
    batch = torch.stack([preprocess(imagegen.jpeg(400, 300, seed=s)) for s in range(16)])
    reference = tuple(t.numpy() for t in cpu(batch))
    served = tuple(t.numpy() for t in gpu(batch))
    assert gpu.precision == precision
    assert not failures(agreement(reference, served), FIDELITY_BOUND)
    assert np.isfinite(served[0]).all()


def test_a_gpu_worker_runs_a_few_padded_sizes_each_tuned_at_load():
    """No cuDNN autotuning under a request: every batch is padded up to one of a few sizes
    (powers of two up to a step of 8, or an eighth of the largest batch, then its multiples,
    and the largest), each run once when the worker loads: a part of a batch the overlap cut
    runs at most a step - 1 rows more than it holds (64 rows in 3 parts ran as 3 x 32)."""
    assert backends.padded_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert backends.padded_sizes(48) == (1, 2, 4, 8, 16, 24, 32, 40, 48)
    assert backends.padded_sizes(256) == (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256)
    assert backends.padded_sizes(5) == (1, 2, 4, 5) and backends.padded_sizes(8) == (1, 2, 4, 8)
    assert backends.padded_sizes(1) == (1,) and backends.padded_sizes(0) == ()
    sizes = backends.padded_sizes(48)
    assert [backends.padded_rows(n, sizes) for n in (1, 3, 16, 17, 33, 48)] == [
        1, 4, 16, 24, 40, 48,
    ]  # fmt: skip
    assert backends.padded_rows(49, sizes) == 49 and backends.padded_rows(5, ()) == 5
    sizes = backends.padded_sizes(64)
    assert sum(backends.padded_rows(n, sizes) for n in (22, 21, 21)) == 72
    assert sum(backends.padded_rows(n, sizes) for n in (20, 20)) == 48  # 40 rows in 2 parts


@needs_cuda
def test_padded_rows_answer_as_the_batch_alone(tmp_path, weights_dir):
    """On CUDA, a batch of 3 runs as 4 (one row of zeros): its rows answer as the first 3 rows
    of the same 4 images would, and only 3 rows come back."""
    backend = load_backend(
        "eager", weights_dir / SERIALIZED["eager"], CUDA, backends.RuntimeOptions(max_rows=8)
    )
    images = torch.stack(
        [Preprocessor(HandlerConfig())(imagegen.jpeg(300, 240, seed=s)) for s in range(3)]
    )
    embedding, logits = backend(images)
    assert embedding.shape == (3, 2048) and logits.shape == (3, 1000)
    full, _ = backend(torch.cat([images, torch.zeros_like(images[:1])]))
    torch.testing.assert_close(embedding, full[:3], rtol=1e-5, atol=1e-5)


class FakeCuda:
    """``torch.cuda``'s graph calls as ``CudaGraphs.capture`` makes them, on the CPU: a
    captured graph's replay runs the module again on its static input and writes the outputs
    it captured in place, as a CUDA graph replays into its memory; ``fail``: capture raises."""

    def __init__(self, fail: bool = False, drift: float = 0.0, stale: int = 0):
        self.fail, self.drift, self.capturing, self.sizes = fail, drift, None, []
        self.stale = stale  # a size whose replay writes nothing (its outputs stay as captured)

    def graph_pool_handle(self):
        return "pool"

    def Stream(self, device):  # noqa: N802 - the library's name
        return self

    def current_stream(self, device):
        return self

    def wait_stream(self, stream):
        pass

    def stream(self, stream):
        import contextlib

        return contextlib.nullcontext()

    def CUDAGraph(self):  # noqa: N802 - the library's name
        return types.SimpleNamespace(replay=None)

    def graph(self, graph, pool, stream):
        import contextlib

        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.capturing = graph
        return contextlib.nullcontext()


def graphed(fake: FakeCuda):
    def module(pixels):
        embedding = pixels.float().mean((2, 3)).repeat(1, 4)
        logits = pixels.float().amax((2, 3)) + fake.drift * (fake.capturing is None)
        if fake.capturing is not None:  # the outputs a replay writes into
            graph, static, outputs = fake.capturing, pixels, (embedding, logits)
            fake.sizes.append(len(static))

            def replay():
                for out, new in zip(outputs, module_eager(static)):
                    if len(static) != fake.stale:
                        out.copy_(new)

            graph.replay = replay
            fake.capturing = None
        return embedding, logits

    def module_eager(pixels):
        return pixels.float().mean((2, 3)).repeat(1, 4), pixels.float().amax((2, 3))

    return module


def test_cuda_graphs_are_captured_per_size_and_replayed_padded(monkeypatch):
    """Largest first; a batch of 3 replays the graph of 4 (its rows copied in, its rows of
    the outputs copied out: the next replay does not change them), a batch over every size runs
    eagerly."""
    fake = FakeCuda()
    module = graphed(fake)
    graphs, described = backends.CudaGraphs.capture(module, (1, 2, 4), CPU_DEVICE, cuda=fake)
    assert graphs is not None and described == "1, 2, 4" and fake.sizes == [4, 2, 1]
    first = torch.randint(0, 256, (3, 3, 224, 224), dtype=torch.uint8)
    embedding, logits = graphs(first)
    expected = module(first)
    assert embedding.shape == (3, 12) and torch.equal(embedding, expected[0])
    assert torch.equal(logits, expected[1])
    graph = graphs.graphs[4][0]
    replay, held = graph.replay, []
    graph.replay = lambda: held.append(graphs.lock.locked()) or replay()
    graphs(torch.zeros(3, 3, 224, 224, dtype=torch.uint8))  # the same graph again
    assert torch.equal(embedding, expected[0]) and held == [True]  # replayed under the lock
    five = torch.randint(0, 256, (5, 3, 224, 224), dtype=torch.uint8)
    assert torch.equal(graphs(five)[1], module(five)[1])


@pytest.mark.parametrize(
    ("fake", "why"),
    [
        (FakeCuda(fail=True), "off (capture failed: RuntimeError: operation not permitted"),
        (FakeCuda(drift=1.0), "off (capture failed: RuntimeError: a replay of 1 rows differs"),
        (FakeCuda(stale=2), "off (capture failed: RuntimeError: a replay of 2 rows differs"),
    ],
)
def test_a_failed_capture_or_a_replay_that_disagrees_runs_eagerly_and_says_so(fake, why):
    graphs, described = backends.CudaGraphs.capture(graphed(fake), (1, 2), CPU_DEVICE, cuda=fake)
    assert graphs is None and described.startswith(why)


def test_auto_hands_back_the_memory_of_the_backends_it_did_not_choose(monkeypatch, tmp_path):
    """On a GPU worker ``auto`` loads every candidate (each tuned at every padded size, its
    graphs captured): once one is chosen, the others are gone when torch's allocator hands
    its unused memory back to the driver; a CPU worker does neither."""
    import weakref

    from servecore import autoprecision
    from tests.test_precision import ARCHIVE, Clock, fake, offer

    monkeypatch.setattr(autoprecision, "_clock", Clock())  # the stand-ins' simulated time
    loaded: dict[str, weakref.ref] = {}

    def keeping(name, ms):
        load = fake(name, ms)

        def loading():
            backend = load()
            loaded[name] = weakref.ref(backend)
            return backend

        return loading

    alive_at_release: list[list[str]] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(
        torch.cuda,
        "empty_cache",
        lambda: alive_at_release.append([n for n, ref in loaded.items() if ref() is not None]),
    )
    store = autoprecision.ChoiceStore(tmp_path / "model", tmp_path / "cache.json", ARCHIVE)
    loaders = {"f32": keeping("f32", 20), "bf16": keeping("bf16", 10)}
    backend, choice = autoprecision.choose(offer(loaders), (1, 4), store, budget_s=0.2)
    assert choice.precision == backend.precision == "bf16"
    assert alive_at_release == [["bf16"]]
