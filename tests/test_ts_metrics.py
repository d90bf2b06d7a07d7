"""handlers.ts_metrics writes our metrics as TorchServe's own metric objects write them (the
lines its frontend parses), a batch's lines in one log record."""

from __future__ import annotations

import logging

import pytest
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

from handlers.ts_metrics import TorchServeMetrics
from servecore.metrics import METRICS, BatchMetrics
from tests.conftest import REPO


@pytest.fixture
def cache():
    loaded = MetricsCacheYamlImpl(str(REPO / "config" / "metrics.yaml"))
    loaded.initialize_cache()
    return loaded


def metric_lines(records) -> list[str]:
    return [
        line.rsplit(",", 1)[0]  # the line without its Unix time, which may tick between them
        for record in records
        for line in record.getMessage().splitlines()
        if line.startswith("[METRICS]")
    ]


def test_each_line_is_the_line_torchserves_own_metric_object_writes(cache, caplog):
    values = [(m, 2.5 if m.kind.name != "COUNTER" else 3, ("x",) * len(m.labels)) for m in METRICS]
    with caplog.at_level("INFO", logger="ts.metrics"):
        for metric, value, labels in values:
            cache.get_metric(metric.name, MetricTypes[metric.kind.name]).add_or_update(
                value, ["tagger", "torchserve", *labels]
            )
        theirs = metric_lines(caplog.records)
        caplog.clear()
        sink = TorchServeMetrics(cache, "tagger")
        for metric, value, labels in values:
            sink.add(metric, value, labels)
        assert caplog.records == []  # held until the batch is done
        sink.flush()
    assert len(caplog.records) == 1
    assert metric_lines(caplog.records) == theirs and len(theirs) == len(METRICS)


def test_a_batch_goes_out_as_one_record_and_a_bad_value_is_logged_not_raised(cache, caplog):
    sink = TorchServeMetrics(cache, "tagger")
    metrics = BatchMetrics(sink, "f32", "tagger_0", 1)
    with caplog.at_level("INFO", logger="ts.metrics"):
        metrics.batch(requests=2, images=3, open_ms=0.5, decode_ms=1.5)
        metrics.forward(4.0)
        metrics.answer(0.5)
        sink.add(METRICS[0], 1.0, ("one label too many",))
        metrics.flush()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "Failed to update metric" in errors[0].getMessage()
    batch = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(batch) == 1
    lines = metric_lines(batch)
    assert any(line.startswith("[METRICS]resnet50_images_total.Count:3|") for line in lines)
    assert any(line.startswith("[METRICS]resnet50_forward_ms_total.") for line in lines)
