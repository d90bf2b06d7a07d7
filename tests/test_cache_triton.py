"""The content cache (issue #37) through a real Triton serving the generated repository with
``handler.cache_bytes`` on: the ``cached`` output marks the image answered before, whose tags
are the same, and the hits and misses show on Triton's metrics port."""

from __future__ import annotations

import pytest
import requests

from serveclient import metrics
from tests import imagegen
from tests.served import local_triton, v2_body

pytestmark = pytest.mark.integration
MODEL = "resnet50-tagger"
PHOTO_A = imagegen.jpeg(640, 480, seed=91)
PHOTO_B = imagegen.png(320, 240, seed=92)


def test_the_cached_output_marks_the_image_answered_before(tmp_path, model_store):
    with local_triton(tmp_path, model_store, handler={"cache_bytes": 16 * 1024 * 1024}) as triton:
        url = f"{triton.url}/v2/models/{MODEL}/infer"

        def infer(images: list[bytes]) -> dict:
            response = requests.post(url, json=v2_body(images, {}), timeout=120)
            assert response.status_code == 200, response.text[:300]
            return {o["name"]: o["data"] for o in response.json()["outputs"]}

        first, both = infer([PHOTO_A]), infer([PHOTO_A, PHOTO_B])
        text = requests.get(triton.metrics_url, timeout=30).text
    assert (first["cached"], both["cached"]) == ([False], [True, False])
    assert both["tags"][:5] == first["tags"]  # A's 5 tags, then B's
    counted = {
        s.name: s.value
        for s in metrics.samples(text)
        if s.labels.get("model") == MODEL and s.name.startswith("resnet50_cache")
    }
    assert (counted["resnet50_cache_hits"], counted["resnet50_cache_misses"]) == (1, 2)
    assert 0 < counted["resnet50_cache_bytes"] <= 16 * 1024 * 1024
