"""The handler driven directly, compared with torchvision's resnet50 and transform run directly."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from torchvision.models import ResNet50_Weights

from tests import imagegen
from tests.handler_context import make_handler, run_batch
from tests.reference import rel_error

CATEGORIES = ResNet50_Weights.IMAGENET1K_V2.meta["categories"]
TOLERANCE = 1e-4  # relative, ||a - b|| / ||b||


@pytest.fixture(scope="module")
def tagger(weights_dir):
    # Full decoding, so the handler sees exactly the pixels torchvision sees (draft decoding
    # is a separate, documented approximation tested in test_images.py).
    return make_handler(weights_dir, task="tags", draft_decode=False)


@pytest.fixture(scope="module")
def embedder(weights_dir):
    return make_handler(weights_dir, task="embedding", draft_decode=False)


@pytest.fixture(scope="module")
def raw_embedder(weights_dir):
    return make_handler(
        weights_dir, task="embedding", normalize_embedding=False, draft_decode=False
    )


IMAGES = {
    "jpeg-320x240": imagegen.jpeg(320, 240, seed=1),
    "png-500x375": imagegen.png(500, 375, seed=2),
    "jpeg-1024x768": imagegen.jpeg(1024, 768, seed=3),
    "png-200x300": imagegen.png(200, 300, seed=4),
}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_embedding_and_logits_match_torchvision(tagger, reference, name):
    handler, context = tagger
    _, statuses, batch = run_batch(handler, context, [{"body": IMAGES[name]}])
    assert statuses == [(200, None)]
    embedding, logits = reference(IMAGES[name])
    assert batch.embedding.shape == (1, 2048) and batch.logits.shape == (1, 1000)
    assert rel_error(batch.embedding[0], embedding) <= TOLERANCE
    assert rel_error(batch.logits[0], logits) <= TOLERANCE


def test_raw_embedding_answer_is_the_pooled_vector(raw_embedder, reference):
    handler, context = raw_embedder
    responses, statuses, _ = run_batch(handler, context, [{"body": IMAGES["jpeg-320x240"]}])
    answer = json.loads(responses[0])
    expected, _ = reference(IMAGES["jpeg-320x240"])
    assert statuses == [(200, None)]
    assert len(answer["embedding"]) == 2048
    assert rel_error(answer["embedding"], expected) <= TOLERANCE


def test_embedding_answer_is_l2_normalised_pooled_vector(embedder, reference):
    handler, context = embedder
    responses, _, _ = run_batch(handler, context, [{"body": IMAGES["png-500x375"]}])
    vector = torch.tensor(json.loads(responses[0])["embedding"])
    expected, _ = reference(IMAGES["png-500x375"])
    assert abs(float(vector.norm()) - 1.0) < 1e-5
    assert rel_error(vector, expected / expected.norm()) <= TOLERANCE


def test_tags_are_the_reference_top_k(tagger, reference):
    handler, context = tagger
    image = IMAGES["jpeg-1024x768"]
    responses, _, _ = run_batch(handler, context, [{"body": image}, {"data": image, "topk": b"12"}])
    default, twelve = (json.loads(r) for r in responses)
    _, logits = reference(image)
    probabilities = torch.softmax(logits, 0)
    top = probabilities.topk(12)
    assert len(default) == 5 and len(twelve) == 12
    assert [t["index"] for t in twelve] == top.indices.tolist()
    for tag, p in zip(twelve, top.values.tolist()):
        assert tag["label"] == CATEGORIES[tag["index"]]
        assert tag["probability"] == pytest.approx(p, rel=1e-4, abs=1e-6)
    assert default == twelve[:5]
    ps = [t["probability"] for t in twelve]
    assert ps == sorted(ps, reverse=True) and all(0 <= p <= 1 for p in ps) and sum(ps) <= 1 + 1e-6


def test_item_in_batch_equals_item_alone(tagger):
    handler, context = tagger
    images = [IMAGES[name] for name in sorted(IMAGES)]
    _, _, together = run_batch(handler, context, [{"body": image} for image in images])
    assert together.embedding.shape == (len(images), 2048)
    for i, image in enumerate(images):
        _, _, alone = run_batch(handler, context, [{"body": image}])
        assert rel_error(together.embedding[i], alone.embedding[0]) <= TOLERANCE
        assert rel_error(together.logits[i], alone.logits[0]) <= TOLERANCE
    # Different images give different answers (the comparison above is not vacuous).
    assert rel_error(together.embedding[0], together.embedding[1]) > 0.01


def test_bad_request_fails_alone_in_its_batch(tagger, caplog):
    handler, context = tagger
    good = IMAGES["jpeg-320x240"]
    rows = [
        {"body": good},
        {"body": b"this is not an image"},
        {"body": good, "topk": b"0"},
        {"data": good},
    ]
    with caplog.at_level("INFO", logger="ts.metrics"):
        responses, statuses, _ = run_batch(handler, context, rows)
    assert [s[0] for s in statuses] == [200, 400, 400, 200]
    error = json.loads(responses[1])
    assert error["code"] == 400 and error["type"] == "InvalidImage"
    assert "not a JPEG, PNG, WebP, GIF, BMP or TIFF image" in error["message"]
    assert json.loads(responses[2])["type"] == "InvalidParameter"
    assert "topk" in json.loads(responses[2])["message"]
    assert json.loads(responses[0]) == json.loads(responses[3])
    # Only the good images reached the model: the batch's metric an operator reads.
    assert _emitted(caplog.records, "HandlerImagesPerBatch") == [2.0]


def test_every_request_bad_gives_no_forward_pass(tagger, caplog):
    handler, context = tagger
    with caplog.at_level("INFO", logger="ts.metrics"):
        responses, statuses, _ = run_batch(handler, context, [{"body": b""}, {"body": b"{"}])
    assert _emitted(caplog.records, "HandlerImagesPerBatch") == [0.0]
    assert "HandlerForwardMs" not in "\n".join(r.getMessage() for r in caplog.records)
    assert [s[0] for s in statuses] == [400, 400]
    assert [json.loads(r)["type"] for r in responses] == ["InvalidRequest", "InvalidRequest"]


def test_top_k_header(tagger):
    handler, context = tagger
    responses, _, _ = run_batch(
        handler, context, [{"body": IMAGES["png-200x300"]}], headers=[{"X-Top-K": "3"}]
    )
    assert len(json.loads(responses[0])) == 3


def _emitted(records, name: str) -> list[float]:
    """Values of metric ``name`` in the lines TorchServe's metric objects emit (the worker prints
    them; the frontend turns them into the Prometheus series)."""
    values = []
    for record in records:
        match = re.search(
            rf"\[METRICS\]{name}\.Count:([0-9.]+)\|#ModelName:resnet50-tagger", record.getMessage()
        )
        if match:
            values.append(float(match.group(1)))
    return values


def test_batch_metrics_are_emitted_with_requests_good_images_errors_and_time(tagger, caplog):
    handler, context = tagger
    rows = [
        {"body": IMAGES["png-200x300"]},
        {"body": b"not an image"},
        {"body": IMAGES["png-200x300"]},
    ]
    with caplog.at_level("INFO", logger="ts.metrics"):
        run_batch(handler, context, rows)
    assert _emitted(caplog.records, "HandlerBatchSize") == [3.0]
    assert _emitted(caplog.records, "HandlerImagesPerBatch") == [2.0]
    # The counters a dashboard uses (histogram buckets are fixed in TorchServe 0.12).
    assert _emitted(caplog.records, "HandlerBatches") == [1.0]
    assert _emitted(caplog.records, "HandlerRequests") == [3.0]
    assert _emitted(caplog.records, "HandlerImages") == [2.0]
    lines = "\n".join(r.getMessage() for r in caplog.records)
    assert re.search(
        r"\[METRICS\]HandlerBatchesBySize\.Count:1(\.0)?\|#ModelName:resnet50-tagger,"
        r"Level:Model,BatchSize:3\|",
        lines,
    ), lines
    assert re.search(
        r"\[METRICS\]HandlerErrors\.Count:1(\.0)?\|#ModelName:resnet50-tagger,"
        r"Level:Model,ErrorType:InvalidImage\|",
        lines,
    ), lines
    for name in ("HandlerOpenMs", "HandlerDecodeMs", "HandlerForwardMs", "HandlerAnswerMs"):
        spent = re.search(rf"\[METRICS\]{name}\.\w+:([0-9.]+)\|", lines)
        assert spent and float(spent.group(1)) > 0, name
    # What the worker serves and holds: the precision as a label, its RSS in MiB.
    assert re.search(
        r"\[METRICS\]HandlerPrecision\.\w+:1(\.0)?\|#ModelName:resnet50-tagger,"
        r"Level:Model,Precision:f32\|",
        lines,
    ), lines
    rss = re.search(
        r"\[METRICS\]HandlerWorkerRssMB\.\w+:([0-9.]+)\|#ModelName:resnet50-tagger,"
        rf"Level:Model,WorkerPid:{os.getpid()}\|",
        lines,
    )
    assert rss and 50 < float(rss.group(1)) < 64 * 1024, lines


def test_describe_reports_weights(tagger, weights_dir):
    handler, _ = tagger
    described = json.loads(handler.describe_handle())
    info = json.loads((weights_dir / "weights_info.json").read_text())
    assert described["weights"] == info
    assert described["handler"]["task"] == "tags"
    assert described["backend"] == "eager"


def test_undeclared_metrics_do_not_fail_batches(weights_dir, caplog):
    import ts
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    from handlers.resnet_handler import ResNetHandler
    from tests.handler_context import make_context

    context = make_context(weights_dir, {"task": "tags"})
    # TorchServe's own metrics.yaml, which does not declare our histograms.
    stock = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    stock.initialize_cache()
    context.metrics = stock
    handler = ResNetHandler()
    with caplog.at_level("WARNING"):
        handler.initialize(context)
    assert any("metric HandlerBatchSize off" in r.getMessage() for r in caplog.records)
    _, statuses, _ = run_batch(handler, context, [{"body": IMAGES["png-200x300"]}])
    assert statuses == [(200, None)]


@pytest.mark.parametrize("header", ["++5", "²", "0", "x"])
def test_bad_top_k_header_is_a_400_for_that_request_only(tagger, header):
    handler, context = tagger
    good = IMAGES["png-200x300"]
    responses, statuses, _ = run_batch(
        handler, context, [{"body": good}, {"body": good}], headers=[{"X-Top-K": header}, {}]
    )
    assert statuses[0][0] == 400 and json.loads(responses[0])["type"] == "InvalidParameter"
    assert statuses[1] == (200, None)


def test_top_k_in_the_request_wins_over_a_bad_header(tagger):
    handler, context = tagger
    responses, statuses, _ = run_batch(
        handler,
        context,
        [{"data": IMAGES["png-200x300"], "topk": b"2"}],
        headers=[{"X-Top-K": "junk"}],
    )
    assert statuses == [(200, None)] and len(json.loads(responses[0])) == 2
