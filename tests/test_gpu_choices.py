"""What a GPU worker chooses from and times at (#41): the candidates on CUDA, the batch sizes
``auto`` times there, the decode threads; and, where a GPU exists, its answers against the f32
CPU reference within the fidelity bound. The CUDA tests skip without one."""

from __future__ import annotations

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
    (the powers of two below the largest batch, and it), each run once when the worker loads."""
    assert backends.padded_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert backends.padded_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    assert backends.padded_sizes(1) == (1,) and backends.padded_sizes(0) == ()
    sizes = backends.padded_sizes(48)
    assert [backends.padded_rows(n, sizes) for n in (1, 3, 16, 17, 33, 48)] == [
        1,
        4,
        16,
        32,
        48,
        48,
    ]
    assert backends.padded_rows(49, sizes) == 49 and backends.padded_rows(5, ()) == 5


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
