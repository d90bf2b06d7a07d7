"""model_files.recipe, the served input's recipe without torchvision, against torchvision's own:
the constants are the weights' transform's, and the crop is the pixels torchvision's functional
calls give, on shapes that take each branch (portrait, landscape, already the resize's size,
upscaled, odd sizes, grey)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import ResNet50_Weights
from torchvision.transforms import functional as F

from model_files import recipe

TRANSFORM = ResNet50_Weights.IMAGENET1K_V2.transforms()


def test_the_constants_are_the_weights_transforms():
    assert recipe.RESIZE == TRANSFORM.resize_size[0] == 232
    assert recipe.CROP == TRANSFORM.crop_size[0] == 224
    assert tuple(TRANSFORM.mean) == recipe.MEAN
    assert tuple(TRANSFORM.std) == recipe.STD
    assert TRANSFORM.interpolation.value == recipe.INTERPOLATION
    assert TRANSFORM.antialias is True and recipe.PREPROCESSING["antialias"] is True


@pytest.mark.parametrize(
    "size",
    [(451, 300), (300, 451), (232, 232), (232, 400), (400, 232), (224, 224), (17, 9), (1001, 999)],
)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_the_crop_is_torchvisions(size, mode):
    rng = np.random.default_rng(sum(size))
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    expected = F.pil_to_tensor(
        F.center_crop(
            F.resize(
                image,
                [TRANSFORM.resize_size[0]],
                interpolation=TRANSFORM.interpolation,
                antialias=TRANSFORM.antialias,
            ),
            [TRANSFORM.crop_size[0]],
        )
    )
    got = recipe.crop(image)
    assert got.dtype == torch.uint8 and got.shape == expected.shape
    assert torch.equal(got, expected)
    # Written into a batch's row (what the intake does): the same pixels, in that row.
    batch = torch.full((2, *expected.shape), 7, dtype=torch.uint8)
    recipe.crop(image, batch[1])
    assert torch.equal(batch[1], expected) and bool((batch[0] == 7).all())


def test_normalize_is_the_float_transform_after_the_crop():
    image = Image.fromarray(np.random.default_rng(7).integers(0, 256, (300, 451, 3), np.uint8))
    float_input = TRANSFORM(image)
    torch.testing.assert_close(recipe.normalize(recipe.crop(image)), float_input)
