"""Parity of the runtimes an archive can use: ONNX Runtime, TorchScript and OpenVINO (at f32;
tests/test_openvino.py covers its other precisions) against eager PyTorch, on the same images
through the same handler."""

from __future__ import annotations

import json

import pytest

from buildsteps.export import EXPORTED, export
from model_files.artifacts import SERVED_INPUT
from tests import imagegen
from tests.handler_context import make_handler, run_batch
from tests.reference import rel_error

# float32 kernels differ between runtimes (fused conv+bn, other summation orders): measured
# here around 1e-6 relative; 1e-4 leaves room for other CPUs while catching any real mismatch.
TOLERANCE = 1e-4
IMAGES = [{"body": imagegen.jpeg(320, 240, seed=s)} for s in range(5)]


@pytest.fixture(scope="module")
def eager(weights_dir):
    handler, context = make_handler(weights_dir, task="tags")
    return run_batch(handler, context, IMAGES)


@pytest.mark.parametrize("backend", EXPORTED)
def test_backend_matches_eager(weights_dir, eager, backend):
    path = export(backend, weights_dir)
    handler, context = make_handler(weights_dir, serialized=path.name, task="tags", precision="f32")
    assert json.loads(handler.describe_handle())["backend"] == backend
    responses, statuses, batch = run_batch(handler, context, IMAGES)
    eager_responses, _, eager_batch = eager
    assert statuses == [(200, None)] * len(IMAGES)
    for i in range(len(IMAGES)):
        assert rel_error(batch.embedding[i], eager_batch.embedding[i]) <= TOLERANCE
        assert rel_error(batch.logits[i], eager_batch.logits[i]) <= TOLERANCE
        tags, expected = json.loads(responses[i]), json.loads(eager_responses[i])
        assert [t["index"] for t in tags] == [t["index"] for t in expected]


def test_export_is_skipped_when_up_to_date(weights_dir):
    path = export("onnx", weights_dir)
    stamp = path.with_name(path.name + ".sha256")
    before = path.stat().st_mtime_ns
    assert export("onnx", weights_dir) == path
    assert path.stat().st_mtime_ns == before
    checkpoint = json.loads((weights_dir / "weights_info.json").read_text())["sha256"]
    assert stamp.read_text().strip() == f"{checkpoint} {SERVED_INPUT}"


def test_an_export_made_for_another_input_is_redone(weights_dir, tmp_path):
    """A file exported before the model took uint8 crops (its stamp names the checkpoint
    alone) is stale: exported again, taking uint8."""
    import onnx

    for name in ("resnet50.pt", "weights_info.json"):
        (tmp_path / name).symlink_to(weights_dir / name)
    checkpoint = json.loads((weights_dir / "weights_info.json").read_text())["sha256"]
    stale = tmp_path / "resnet50_dual.onnx"
    stale.write_bytes(b"made for float32 input")
    stale.with_name(stale.name + ".sha256").write_text(checkpoint + "\n")
    path = export("onnx", tmp_path)
    (graph_input,) = onnx.load(str(path)).graph.input
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.UINT8
