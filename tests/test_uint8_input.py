"""The served input: the intake's uint8 crop and each backend's in-model normalisation, against
torchvision's own transform and model run directly (tests/reference.py)."""

from __future__ import annotations

import pytest
import torch

from buildsteps.export import export
from model_files.artifacts import SERIALIZED
from model_files.recipe import normalize
from servecore.backends import load_backend
from servecore.config import HandlerConfig
from servecore.preprocessor import Preprocessor
from tests import imagegen
from tests.reference import rel_error

# Full-size decoding: the reference decodes without JPEG draft scaling.
PREPROCESS = Preprocessor(HandlerConfig(draft_decode=False))
IMAGES = {
    "jpeg": imagegen.jpeg(320, 240, seed=1),
    "jpeg-portrait": imagegen.jpeg(300, 451, seed=2),
    "png": imagegen.png(640, 480, seed=3),
}
# float32 kernels differ between runtimes: measured ~1e-6 relative (tests/test_backends.py).
TOLERANCE = 1e-4


@pytest.mark.parametrize("name", IMAGES)
def test_the_crop_is_uint8_and_normalises_to_torchvisions_input_exactly(name, reference):
    crop = PREPROCESS(IMAGES[name])
    assert crop.dtype == torch.uint8
    assert crop.shape == (3, 224, 224)
    assert torch.equal(normalize(crop), reference.input(IMAGES[name])[0])


@pytest.mark.parametrize("kind", ["eager", "torchscript", "onnx", "openvino"])
def test_every_backend_normalises_uint8_crops_as_torchvision(kind, weights_dir, reference):
    """The backend is handed the uint8 batch alone: the mean/std is inside the model, and the
    answers are torchvision's model on torchvision's transform."""
    backend = load_backend(
        kind,
        export(kind, weights_dir) if kind != "eager" else weights_dir / SERIALIZED[kind],
        torch.device("cpu"),
        precision="f32",
    )
    batch = torch.stack([PREPROCESS(data) for data in IMAGES.values()])
    embedding, logits = backend(batch)
    for i, data in enumerate(IMAGES.values()):
        expected_embedding, expected_logits = reference(data)
        assert rel_error(embedding[i], expected_embedding) <= TOLERANCE
        assert rel_error(logits[i], expected_logits) <= TOLERANCE
