"""The benchmark's pure helpers: statistics, arrival schedules, log parsing, targets, report.

No server, no model: these run in well under a second.
"""

from __future__ import annotations

import json
import math

import javaproperties
import pytest
import yaml

from bench.batchlog import batches_by_request
from bench.ingestion import batch_times, run_batches, split
from bench.loadgen import Endpoint, poisson_schedule
from bench.report import render_markdown
from bench.stats import Sample, find_run, percentile, ratio, summarize
from bench.stock import MODEL_NAME, stock_config
from bench.targets import evaluate, served_kind
from tests.conftest import REPO


def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="range"):
        percentile(values, 101)


def test_summarize_counts_errors_and_uses_only_successes_for_latency():
    samples = [
        Sample(0.0, 0.1, True, batch_size=1),
        Sample(0.0, 0.3, True, batch_size=3),
        Sample(0.5, 1.0, True, batch_size=3),
        Sample(0.2, 2.0, False, "HTTP 503"),
        Sample(0.2, 0.4, False, "ConnectionError"),
    ]
    stats = summarize(samples)
    assert (stats.requests, stats.ok, stats.errors) == (5, 3, 2)
    assert stats.duration_s == pytest.approx(2.0)  # first start to last end, failures included
    assert stats.throughput == pytest.approx(1.5)
    assert stats.p50_ms == pytest.approx(300.0)
    assert stats.batch_mean == pytest.approx(7 / 3)
    assert stats.batch_max == 3
    assert stats.error_kinds == {"HTTP 503": 1, "ConnectionError": 1}


def test_summarize_of_nothing_is_zero_throughput_and_nan_latency():
    stats = summarize([])
    assert stats.requests == 0 and stats.throughput == 0.0 and math.isnan(stats.p99_ms)
    assert math.isnan(summarize([Sample(0, 1, True)]).batch_mean)


def test_ratio_and_find_run():
    assert ratio(3.0, 2.0) == 1.5
    assert math.isnan(ratio(1.0, 0.0)) and math.isnan(ratio(math.nan, 1.0))
    runs = [{"image": "small", "clients": 1}, {"image": "small", "clients": 16}]
    assert find_run(runs, image="small", clients=16) is runs[1]
    assert find_run(runs, image="12mp") is None


def test_poisson_schedule_is_seeded_sorted_and_bounded():
    first = poisson_schedule(20.0, 10.0, 1000, seed=3)
    assert first == poisson_schedule(20.0, 10.0, 1000, seed=3)
    assert first == sorted(first) and all(0 < t < 10.0 for t in first)
    assert 120 < len(first) < 280  # 200 expected; far outside means a wrong rate
    assert len(poisson_schedule(1000.0, 10.0, 50)) == 50
    with pytest.raises(ValueError, match="rate must be positive"):
        poisson_schedule(0.0, 1.0, 10)


def test_endpoint_refuses_anything_but_loopback():
    Endpoint("http://127.0.0.1:8080/predictions/m", {}, b"")
    with pytest.raises(ValueError, match="only talks to loopback"):
        Endpoint("http://example.com/predictions/m", {}, b"")


LOG = """\
2026-11-22T04:31:39,616 [INFO ] W-9000-resnet50-stock_1.0-stdout org.pytorch.serve.wlm.\
WorkerLifeCycle - result=[METRICS]PredictionTime.Milliseconds:2485.75|#ModelName:resnet50-stock,\
Level:Model|#type:GAUGE|#hostname:vm,1795321899,aa-1,bb-2,cc-3, pattern=[METRICS]
2026-11-22T04:31:39,700 [INFO ] W-9000-resnet50-stock_1.0-stdout org.pytorch.serve.wlm.\
WorkerLifeCycle - result=[METRICS]PredictionTime.Milliseconds:12.5|#ModelName:resnet50-stock,\
Level:Model|#type:GAUGE|#hostname:vm,1795321900,dd-4, pattern=[METRICS]
2026-11-22T04:31:39,800 [INFO ] W-9001-other_1.0-stdout org.pytorch.serve.wlm.WorkerLifeCycle - \
result=[METRICS]PredictionTime.Milliseconds:1.0|#ModelName:other,Level:Model|#type:GAUGE|\
#hostname:vm,1795321900,ee-5,ff-6, pattern=[METRICS]
2026-11-22T04:31:39,900 [INFO ] W-9000-resnet50-stock_1.0 ACCESS_LOG - /127.0.0.1:1 "POST ..."
"""


def test_batch_sizes_come_from_prediction_time_lines_of_the_model():
    sizes = batches_by_request(LOG.splitlines(), "resnet50-stock")
    assert sizes == {"aa-1": 3, "bb-2": 3, "cc-3": 3, "dd-4": 1}


def _ts_log(
    model: str, backend_ms: int, handler_ms: float, decode_ms: float, ids: tuple[str, ...] = ()
) -> list[str]:
    """One batch's lines as TorchServe 0.12 writes them to ts_log.log (each twice)."""
    ids = ids or (f"a31699fc-67fd-4b96-b5aa-{backend_ms:012d}",)
    stdout = (
        f"2026-11-22T12:14:26,790 [INFO ] W-49201-{model}_1.0-stdout "
        "org.pytorch.serve.wlm.WorkerLifeCycle - result=[METRICS]"
    )
    lines = [
        f"{stdout}resnet50_decode_ms_total.Milliseconds:{decode_ms}|#model:{model},"
        "engine:torchserve|#type:COUNTER|#hostname:vm,1795349665, pattern=[METRICS]",
        f"{stdout}HandlerTime.Milliseconds:{handler_ms}|#ModelName:{model},Level:Model"
        f"|#type:GAUGE|#hostname:vm,1795349666,{','.join(ids)}, pattern=[METRICS]",
        _backend_line(model, backend_ms),
    ]
    return [line for line in lines for _ in range(2)]


def _backend_line(model: str, ms: int) -> str:
    return (
        f"2026-11-22T12:14:26,792 [INFO ] W-49201-{model}_1.0 "
        f"org.pytorch.serve.wlm.WorkerThread - Backend response time: {ms}"
    )


def test_ingestion_split_reads_each_batch_once_and_only_its_model():
    # Each worker's first "Backend response time" is its model load, not a batch.
    loads = [_backend_line("resnet50-tagger", 4911), _backend_line("resnet50-embedding", 4000)]
    lines = (
        _ts_log("resnet50-tagger", 44, 39.5, 15.0)
        + _ts_log("resnet50-embedding", 900, 1, 1)
        + _ts_log("resnet50-tagger", 60, 50.5, 25.0)
    )
    # The second copies are not always next to the first (seen in real logs under load).
    lines = loads + lines[:1] + lines[2:4] + lines[1:2] + lines[4:] + loads
    times = batch_times(lines, "resnet50-tagger")
    assert {k: v for k, v in times.items() if k != "ids"} == {
        "backend": [44.0, 60.0],
        "handler": [39.5, 50.5],
        "decode": [15.0, 25.0],
        "forward": [],
        "open": [],
        "answer": [],
    }
    assert [len(ids) for ids in times["ids"]] == [1, 1]
    parts = split(times, wall_s=0.208)
    assert parts["batches"] == 2
    assert parts["transport_ms"] == pytest.approx(52.0 - 45.0)
    assert parts["worker_busy"] == pytest.approx(0.5)
    assert math.isnan(parts["forward_ms"])


def test_ingestion_does_not_count_a_describe_as_a_batch():
    """A customized describe reaches the handler (HandlerTime, a backend time) without a
    batch's stages: counted, it would pair each batch's decode with the previous handler."""
    model = "resnet50-tagger"
    describe = [
        line
        for line in _ts_log(model, 2, 1.37, 0.0, ids=("d1",))
        if "resnet50_decode_ms_total" not in line
    ]
    times = batch_times(
        [
            _backend_line(model, 4911),
            *describe,
            *_ts_log(model, 44, 39.5, 15.0),
            *_ts_log(model, 60, 50.5, 25.0),
        ],
        model,
    )
    assert (times["backend"], times["handler"], times["decode"]) == (
        [44.0, 60.0],
        [39.5, 50.5],
        [15.0, 25.0],
    )
    assert len(times["ids"]) == 2


def test_ingestion_keeps_the_stages_aligned_past_a_batch_that_decoded_nothing():
    """A batch whose images were all refused once opened (a long-running server's log: the
    suite's, after hostile clients) has an open time and no decode: the next batch's decode
    stays its own, not the refused one's."""
    model = "resnet50-tagger"
    refused = [
        line.replace("resnet50_decode_ms_total", "resnet50_open_ms_total")
        for line in _ts_log(model, 3, 2.5, 0.4, ids=("r1",))
    ]
    times = batch_times(
        [_backend_line(model, 4911), *refused, *_ts_log(model, 44, 39.5, 15.0, ids=("b1",))],
        model,
    )
    assert (times["handler"], times["decode"], times["open"]) == (
        [2.5, 39.5],
        [None, 15.0],
        [0.4, None],
    )
    assert run_batches(times, {"b1"})["decode"] == [15.0]
    assert split(run_batches(times, {"b1"}), wall_s=1.0)["decode_ms"] == 15.0


def test_ingestion_does_not_count_a_restarted_workers_load_as_a_batch():
    """A worker killed and restarted by the frontend (the suite's long-running server) loads
    the model again under the same name: that backend time is a load, and the batches after it
    keep their own backend times."""
    model = "resnet50-tagger"
    retry = (
        f"2026-11-22T12:14:27,000 [INFO ] W-49201-{model}_1.0 "
        "org.pytorch.serve.wlm.WorkerThread - Retry worker: 49201 in 1 seconds."
    )
    times = batch_times(
        [
            _backend_line(model, 4911),
            *_ts_log(model, 44, 39.5, 15.0, ids=("a1",)),
            retry,
            retry,
            _backend_line(model, 3076),
            *_ts_log(model, 60, 50.5, 25.0, ids=("b1",)),
        ],
        model,
    )
    assert (times["backend"], times["handler"]) == ([44.0, 60.0], [39.5, 50.5])
    assert run_batches(times, {"b1"})["backend"] == [60.0]


def test_ingestion_finds_a_run_by_its_request_ids():
    model = "resnet50-tagger"  # request ids are UUIDs (hex and dashes) in a real log
    warm_up = _ts_log(model, 30, 25.0, 5.0, ids=("a1", "a2", "a3")) + _ts_log(
        model, 31, 26.0, 6.0, ids=("a4", "a5")
    )
    run = _ts_log(model, 70, 60.0, 20.0, ids=("b1", "b2", "b3", "b4"))
    later = _ts_log(model, 80, 70.0, 30.0, ids=("c1",))
    times = batch_times([_backend_line(model, 4911), *warm_up, *run, *later], model)
    assert times["ids"] == [("a1", "a2", "a3"), ("a4", "a5"), ("b1", "b2", "b3", "b4"), ("c1",)]
    # A refused request's id is never logged; it does not widen the run.
    measured = run_batches(times, {"b1", "b2", "b3", "b4", "refused-by-the-frontend"})
    assert measured == {
        "backend": [70.0],
        "handler": [60.0],
        "decode": [20.0],
        "forward": [],
        "open": [],
        "answer": [],
        "ids": [("b1", "b2", "b3", "b4")],
    }
    assert run_batches(times, {"a2", "a5"})["backend"] == [30.0, 31.0]
    assert run_batches(times, {"never-answered"})["backend"] == []


def test_stock_config_copies_the_tagger_frontend_settings(tmp_path):
    out = stock_config(tmp_path / "stock.properties")
    shipped = yaml.safe_load((REPO / "config" / "models" / "resnet50-tagger.yaml").read_text())
    properties = javaproperties.loads(out.read_text())
    entry = json.loads(properties["models"])[MODEL_NAME]["1.0"]
    assert properties["load_models"] == f"{MODEL_NAME}.mar"
    assert entry["marName"] == f"{MODEL_NAME}.mar"
    for key in ("batchSize", "maxBatchDelay", "minWorkers", "maxWorkers"):
        assert entry[key] == shipped[key], key


def _run(**fields) -> dict:
    base = {
        "requests": 10,
        "ok": 10,
        "errors": 0,
        "duration_s": 1.0,
        "throughput": 10.0,
        "p50_ms": 100.0,
        "p95_ms": 120.0,
        "p99_ms": 130.0,
        "batch_mean": 1.0,
        "batch_max": 1,
        "error_kinds": {},
        "rss_server_mb": 1000.0,
        "rss_worker_mb": 500.0,
    }
    return {**base, **fields}


def _results(ours_small16=40.0, stock_small16=10.0, errors=0, kind="HTTP 503") -> dict:
    raw = {
        "onnx": {
            "forward": [{"batch": 1, "images_per_s": 15.0}, {"batch": 8, "images_per_s": 40.0}],
            "single_image": {"small": {"p50_ms": 50.0}, "12mp": {"p50_ms": 60.0}},
        }
    }
    settings = {"batchSize": 8, "maxBatchDelay": 5, "workers": 1}

    def served(name, small16, large16, errs):
        return {
            "model": name,
            "backend": "onnx",
            "settings": settings,
            "closed": [
                _run(image="small", clients=1, p50_ms=60.0),
                _run(
                    image="small",
                    clients=16,
                    throughput=small16,
                    errors=errs,
                    error_kinds={kind: errs} if errs else {},
                ),
                _run(image="12mp", clients=1),
                _run(image="12mp", clients=16, throughput=large16),
            ],
            "open": [_run(rate=5.0)],
        }

    return {
        "raw": raw,
        "served": {
            "ours": served("resnet50-tagger", ours_small16, 30.0, errors),
            "stock": served("resnet50-stock", stock_small16, 5.0, 0),
        },
    }


def test_targets_pass_and_miss_from_the_numbers():
    results = _results()
    targets = {
        t.key: t
        for t in evaluate(
            results["raw"], "onnx", results["served"]["ours"], results["served"]["stock"]
        )
    }
    assert targets["a1"].value == pytest.approx(4.0) and targets["a1"].passed
    assert targets["a2"].value == pytest.approx(1.0) and targets["a2"].passed
    assert targets["b"].value == pytest.approx(6.0) and targets["b"].passed
    assert targets["c"].value == pytest.approx(1.2) and targets["c"].passed
    assert targets["d"].passed

    results = _results(ours_small16=15.0, errors=2, kind="ConnectionError")
    targets = {
        t.key: t
        for t in evaluate(
            results["raw"], "onnx", results["served"]["ours"], results["served"]["stock"]
        )
    }
    assert not targets["a1"].passed and not targets["a2"].passed and not targets["d"].passed
    # 503 is what a server answers beyond its capacity: counted beside the target, not in it.
    results = _results(errors=2)
    targets = {
        t.key: t
        for t in evaluate(
            results["raw"], "onnx", results["served"]["ours"], results["served"]["stock"]
        )
    }
    assert targets["d"].passed and "besides 2 HTTP 503" in targets["d"].detail


def test_a_target_without_its_measurement_is_a_miss():
    results = _results()
    targets = {
        t.key: t
        for t in evaluate(
            results["raw"], "torchscript", results["served"]["ours"], results["served"]["stock"]
        )
    }
    assert math.isnan(targets["a2"].value) and not targets["a2"].passed
    assert not targets["c"].passed


def test_markdown_report_renders_every_section():
    results = _results(errors=1)
    results["meta"] = {
        "command": "python -m bench",
        "elapsed_s": 300.0,
        "loadavg_at_end": [2.0, 1.5, 1.0],
        "machine": {
            "date": "2026-01-01T00:00:00+00:00",
            "cpu": "Test CPU",
            "cores": 2,
            "memory_gb": 8.0,
            "os": "Linux",
            "loadavg_at_start": [0.1, 0.2, 0.3],
            "cpu_busy_percent_before": 3.0,
        },
        "versions": {"torch": "x"},
        "weights": {
            "source": "seeded-untrained",
            "trained": False,
            "sha256": "ab" * 32,
            "detail": "seed 0",
        },
        "plan": {
            "warmup_s": 3.0,
            "closed_s": 12.0,
            "closed_max_requests": 3000,
            "open_s": 10.0,
            "open_max_in_flight": 64,
            "open_image": "small",
        },
    }
    results["targets"] = [
        t.to_dict()
        for t in evaluate(
            results["raw"], "onnx", results["served"]["ours"], results["served"]["stock"]
        )
    ]
    markdown = render_markdown(results)
    assert "**untrained**" in markdown and "Test CPU" in markdown
    assert "**MISS**" in markdown  # target d: one error
    assert "**1** (HTTP 503: 1)" in markdown
    for heading in ("## Targets", "## Raw model", "closed loop", "open loop"):
        assert heading in markdown


def test_noisy_photo_stock_latency_and_pipeline_targets():
    results = _results()
    ours, stock = results["served"]["ours"], results["served"]["stock"]
    ours["closed"].append(_run(image="12mp-noisy", clients=16, throughput=20.0))
    stock["closed"].append(_run(image="12mp-noisy", clients=16, throughput=4.0))
    stock["closed"][0]["p50_ms"] = 150.0  # stock, small JPEG, 1 client (ours: 60 ms)
    targets = {
        t.key: t
        for t in evaluate(results["raw"], "onnx", ours, stock, pipeline={"images_per_s": 50.0})
    }
    assert targets["b2"].value == pytest.approx(5.0) and targets["b2"].passed
    assert targets["c2"].value == pytest.approx(0.4) and targets["c2"].passed
    assert targets["e"].value == pytest.approx(0.8) and targets["e"].passed
    missing = {t.key: t for t in evaluate(results["raw"], "onnx", ours, stock)}
    assert not missing["e"].passed


@pytest.mark.parametrize(
    ("precision", "flags", "kind", "a1"),
    [
        ("f32", {"avx512_vnni": True}, "f32", 2.0),
        ("bf16", {"avx512_vnni": True, "avx512_bf16": True}, "bf16", 3.0),
        ("int8+bf16", {"avx512_vnni": True, "avx512_bf16": True}, "int8-vnni", 4.5),
        ("int8+f32", {"avx_vnni": True}, "int8-vnni", 4.5),
        ("int8+f32", {"avx512_vnni": False}, "int8", 3.0),
        ("int8+f32", None, "int8", 3.0),
    ],
)
def test_a1_asks_more_where_int8_is_served_on_vnni_units(precision, flags, kind, a1):
    """Issue #27: 4.5x stock where int8 runs on VNNI, 3x on a host without such units."""
    results = _results()
    ours, stock = results["served"]["ours"], results["served"]["stock"]
    ours["precision"] = precision
    assert served_kind(precision, flags) == kind
    targets = {t.key: t for t in evaluate(results["raw"], "onnx", ours, stock, cpu_flags=flags)}
    assert targets["a1"].threshold == a1
    assert (f"threshold where {kind} is served" in targets["a1"].detail) == (a1 != 3.0)


def test_auto_is_held_to_the_raw_forward_of_this_host():
    """p1: what auto served against the fastest precision it could serve; p2: against f32;
    a1/b2 need less where auto served f32 (issue #17)."""
    results = _results()
    raw = {
        "openvino-f32": {"forward": [{"batch": 16, "images_per_s": 30.0}]},
        "openvino-bf16": {"forward": [{"batch": 16, "images_per_s": 20.0}]},
        "openvino-int8": {"file": "resnet50_dual_int8.xml", "skipped": "not built"},
    }
    ours, stock = results["served"]["ours"], results["served"]["stock"]
    choice = {
        "candidates": [
            {"precision": "f32"},
            {"precision": "bf16"},
            {"precision": "int8+f32", "excluded": "not in the archive"},
        ]
    }
    ours.update(backend="openvino", precision="f32", precision_choice=choice)
    targets = {t.key: t for t in evaluate(raw, "openvino-f32", ours, stock, raw_batch=16)}
    assert targets["p1"].value == pytest.approx(1.0) and targets["p1"].passed
    assert targets["p2"].value == pytest.approx(1.0) and targets["p2"].passed
    assert targets["a1"].threshold == 2.0 and targets["b2"].threshold == 3.0
    ours.update(precision="bf16")
    targets = {t.key: t for t in evaluate(raw, "openvino-bf16", ours, stock, raw_batch=16)}
    assert targets["p1"].value == pytest.approx(2 / 3) and not targets["p1"].passed
    assert "vs openvino-f32 30.0" in targets["p1"].detail
    assert not targets["p2"].passed
    assert targets["a1"].threshold == 3.0 and targets["b2"].threshold == 4.0
