"""The content cache (issue #37) through a real TorchServe serving the tagger with
``handler.cache_bytes`` on: a repeated photo comes back byte-identical, marked
``X-Cache-Hits``, and the hits and misses show on ``/metrics``."""

from __future__ import annotations

import pytest
import requests

from serveclient import metrics
from tests import imagegen
from tests.corpus import b64
from tests.served import variant_server

pytestmark = pytest.mark.integration
MODEL = "resnet50-tagger"
PHOTO_A = imagegen.jpeg(640, 480, seed=81)
PHOTO_B = imagegen.png(320, 240, seed=82)


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory, model_store):
    with variant_server(
        tmp_path_factory, model_store, MODEL, handler={"cache_bytes": 16 * 1024 * 1024}
    ) as server:
        yield server


def test_a_repeated_photo_is_answered_from_the_cache_with_the_same_bytes(cached_server):
    ts = cached_server
    url, headers = f"{ts.inference_url}/predictions/{MODEL}", ts.keys.inference_headers()

    def post(extra: dict | None = None, **kwargs) -> requests.Response:
        response = requests.post(url, headers={**headers, **(extra or {})}, timeout=120, **kwargs)
        assert response.status_code == 200, response.text[:300]
        return response

    first, again = post(data=PHOTO_A), post(data=PHOTO_A)
    assert (first.headers["X-Cache-Hits"], again.headers["X-Cache-Hits"]) == ("0", "1")
    assert again.content == first.content
    other_topk = post({"X-Top-K": "2"}, data=PHOTO_A)
    assert other_topk.headers["X-Cache-Hits"] == "0" and len(other_topk.json()) == 2
    v1 = {"instances": [{"data": b64(PHOTO_A)}, {"data": b64(PHOTO_B)}]}
    both = post(json=v1)
    assert both.headers["X-Cache-Hits"] == "1"
    assert both.json()["predictions"][0] == first.json()
    text = requests.get(f"{ts.metrics_url}/metrics", timeout=30).text
    counted = {
        s.name: s.value
        for s in metrics.samples(text)
        if s.labels.get("model") == MODEL and s.name.startswith("resnet50_cache")
    }
    # Images: A, A (hit), A with topk 2, then A (hit) and B.
    assert counted["resnet50_cache_hits"] == 2
    assert counted["resnet50_cache_misses"] == 3
    assert 0 < counted["resnet50_cache_bytes"] <= 16 * 1024 * 1024
