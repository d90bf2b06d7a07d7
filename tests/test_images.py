"""Decoding what people upload, and refusing what they should not, without TorchServe."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from servecore.edges.bodies import status_of
from servecore.errors import RequestError
from servecore.images import decode_image
from tests import corpus, imagegen
from tests.handler_context import make_handler, run_batch
from tests.reference import assert_same_tags, rel_error

GOOD = corpus.good_images()
BAD = corpus.bad_inputs()
LIMITS = {"max_pixels": 40_000_000, "max_bytes": 30 * 1024 * 1024}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_image_decodes_to_the_expected_pixels(name):
    case = GOOD[name]
    decoded = np.asarray(decode_image(case.data, **LIMITS))
    assert decoded.dtype == np.uint8 and decoded.shape == case.expected.shape
    diff = np.abs(decoded.astype(int) - case.expected.astype(int))
    assert diff.max() == 0, f"max |diff| {diff.max()}"


@pytest.fixture(scope="module")
def tagger(weights_dir):
    return make_handler(weights_dir, task="tags")


def test_bad_inputs_fail_alone_in_a_batch_of_good_ones(tagger):
    """Every bad input, each between two good images in one batch: its own status, type and
    message; the good ones still get the answer they get alone."""
    handler, context = tagger
    good = GOOD["png-rgb"].data
    (alone,), _, _ = run_batch(handler, context, [{"body": good}])
    assert len(BAD) >= 20
    for name, case in BAD.items():
        rows = [{"body": good}, corpus.handler_row(case), {"body": good}]
        responses, statuses, _ = run_batch(handler, context, rows)
        error = json.loads(responses[1])
        assert statuses[1][0] == case.status, (name, error)
        assert error["code"] == case.status and error["type"] == case.kind, (name, error)
        assert case.message in error["message"], (name, error)
        assert statuses[0] == statuses[2] == (200, None), name
        for response in (responses[0], responses[2]):
            assert_same_tags(json.loads(response), json.loads(alone))


def test_draft_decoding_stays_close_to_full_decoding(weights_dir):
    """A 12 MP photo decoded in JPEG draft mode (DCT downscale, here 1/8, keeping the shorter
    side >= 232) against full decoding. Tolerance: relative embedding error <= 2% and cosine
    >= 0.9995, with the same top-1 class. Why that is enough: the model sees the photo after a
    resize to 232 px anyway; the difference is resampling detail below what that resize keeps,
    and it is under a tenth of the distance between two different photos."""
    from devtools.samples import photo

    full, full_context = make_handler(weights_dir, draft_decode=False, normalize_embedding=False)
    draft, draft_context = make_handler(weights_dir, draft_decode=True, normalize_embedding=False)
    embeddings = {}
    for name in ("chelsea", "coffee"):
        image = photo(name).resize((4242, 2828), Image.Resampling.BICUBIC)
        data = imagegen.encode(image, "JPEG", quality=90)
        _, _, exact = run_batch(full, full_context, [{"body": data}])
        _, _, fast = run_batch(draft, draft_context, [{"body": data}])
        error = rel_error(fast.embedding[0], exact.embedding[0])
        cosine = torch.nn.functional.cosine_similarity(fast.embedding, exact.embedding).item()
        assert error <= 0.02 and cosine >= 0.9995, (name, error, cosine)
        assert fast.logits.argmax() == exact.logits.argmax()
        embeddings[name] = (exact.embedding[0], error)
    between_photos = rel_error(embeddings["coffee"][0], embeddings["chelsea"][0])
    assert max(e for _, e in embeddings.values()) < between_photos / 10


def test_draft_decoding_is_exact_below_twice_the_resize_size():
    data = imagegen.jpeg(460, 300, seed=3)  # 1/2 scale would give a side < 232
    drafted = np.asarray(decode_image(data, draft_size=232, **LIMITS))
    full = np.asarray(decode_image(data, **LIMITS))
    assert np.array_equal(drafted, full)


def test_mutated_images_never_escape_as_other_errors():
    """Bit flips and cuts in every accepted format: each either decodes or is a RequestError."""
    rng = np.random.default_rng(0)
    source = imagegen.photo(120, 80, seed=9)
    seeds = [imagegen.encode(source, fmt) for fmt in ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")]
    outcomes = {"decoded": 0, "refused": 0}
    for data in seeds:
        for _ in range(60):
            mutated = bytearray(data)
            for _ in range(int(rng.integers(1, 8))):
                mutated[int(rng.integers(0, len(mutated)))] = int(rng.integers(0, 256))
            if rng.random() < 0.3:
                mutated = mutated[: int(rng.integers(1, len(mutated)))]
            try:
                image = decode_image(bytes(mutated), **LIMITS)
                assert image.mode == "RGB"
                outcomes["decoded"] += 1
            except RequestError as error:
                assert status_of(error) in (400, 413, 415)
                outcomes["refused"] += 1
    assert outcomes["decoded"] > 0 and outcomes["refused"] > 0


def test_pixel_limit_is_checked_before_decoding():
    big = imagegen.encode(Image.new("RGB", (3000, 2000)), "PNG")
    with pytest.raises(RequestError) as caught:
        decode_image(big, max_pixels=5_000_000, max_bytes=LIMITS["max_bytes"])
    assert status_of(caught.value) == 413
    assert "3000x2000 = 6000000 pixels" in caught.value.message
