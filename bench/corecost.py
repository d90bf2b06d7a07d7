"""The core's own cost per image, request form by request form, before and after a change.

    python -m bench.corecost                 # this tree against 399bde5 -> results/core-cost.md
    python -m bench.corecost --before REF    # against another commit (a temporary worktree)

In one process per tree, with the null model (``bench.null``: decode and forward no-ops, the
rest of the core as it serves): each engine's adapter is handed batches of 64 one-image
requests as the engine hands them over (TorchServe's ``handle`` with its own ``Context``;
Triton's ``execute`` with a stand-in for its ``triton_python_backend_utils``, whose own cost
is not ours), for every request form each engine takes and both models. Each row: the CPU
time per image of 20 batches (``time.process_time``), then where it goes, from one more
profiled pass (cProfile, the standard library's): the core's steps ``prepare`` (parse, open
the image's header, admit), ``infer`` (the null forward), ``answer`` (the values of each
reply), ``encode`` (the edge writing each reply: JSON or tensors) and the adapter's own rest.
The profile's times carry cProfile's overhead: read them as shares. Both trees run on the
same host, one after the other, with the same Python and packages.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.layout import IMAGES, REPO, SAMPLES, checked_out, cli, parse
from bench.machine import dated, describe_machine, host
from bench.markdown import bullets, document, publish, table

BEFORE = "399bde5"  # landed main before issue #49's changes
STEPS = ("prepare", "infer", "answer", "encode", "adapter")
# (engine, form) rows: what each engine takes. TorchServe's forms are its HTTP bodies as its
# frontend hands them to the worker; Triton's are its tensors (its frontend parses JSON and
# the binary extension itself, in C++).
FORMS = (
    ("torchserve", "raw body"),
    ("torchserve", "multipart"),
    ("torchserve", "JSON base64"),
    ("torchserve", "v1"),
    ("torchserve", "v2 JSON"),
    ("torchserve", "v2 binary"),
    ("torchserve", "v2 crops"),
    ("triton", "images tensor"),
    ("triton", "crops tensor"),
)

# One tree's measurement, run with that tree as the working folder and first on sys.path:
# argv[1] the JSON of {"image": path, "weights": folder, "batches": n, "forms": FORMS}.
WORKER = r"""
import base64, cProfile, io, json, pstats, sys, time, types
from pathlib import Path
import numpy as np
import torch
plan = json.loads(sys.argv[1])
jpeg = Path(plan["image"]).read_bytes()
from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from bench.null.core import null_core

def ts_handler(task):
    from handlers.resnet_handler import ResNetHandler
    metrics = MetricsCacheYamlImpl("config/metrics.yaml")
    metrics.initialize_cache()
    manifest = {"model": {"modelName": "m", "serializedFile": "resnet50.pt",
                          "handler": "resnet_handler.py", "modelVersion": "1.0"}}
    context = Context("m", plan["weights"], manifest, 64, None, "0.12.0", True, metrics,
                      {"handler": {"task": task}})
    handler = ResNetHandler()
    null_core(lambda: handler.initialize(context), lambda: handler.model)
    return handler, context

class Tensor:
    def __init__(self, name, array): self.name, self.array = name, array
    def as_numpy(self): return self.array
class Response:
    def __init__(self, output_tensors=(), error=None):
        self.tensors, self.error = output_tensors, error
class Error:
    UNAVAILABLE, INVALID_ARG, INTERNAL = 1, 2, 3
    def __init__(self, message, code=3): self.message, self.code = message, code
class Input:  # an input tensor: pb_utils names it by a method
    def __init__(self, name, array): self.given, self.array = name, array
    def name(self): return self.given
    def as_numpy(self): return self.array
class Request:
    def __init__(self, given, rid): self.given, self.rid = given, rid
    def inputs(self): return list(self.given.values())
    def request_id(self): return self.rid
    def parameters(self): return "{}"
    def requested_output_names(self): return []  # none named: every output, as before
class NoFamily:  # a Triton started with --allow-metrics=false: the adapter's metrics off
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    def __init__(self, **_): raise RuntimeError("metrics off")
pb = types.ModuleType("triton_python_backend_utils")
pb.Tensor, pb.InferenceResponse, pb.TritonError = Tensor, Response, Error
pb.MetricFamily = NoFamily
dtypes = {"TYPE_FP32": np.float32, "TYPE_STRING": np.object_, "TYPE_BOOL": np.bool_}
pb.triton_string_to_numpy = dtypes.__getitem__
pb.get_input_tensor_by_name = lambda request, name: request.given.get(name)  # older adapters
sys.modules["triton_python_backend_utils"] = pb

def triton_model(task):
    from tritonrepo import model as adapter
    output = {"embedding": {"name": "embedding", "data_type": "TYPE_FP32", "dims": [2048]},
              "tags": {"name": "tags", "data_type": "TYPE_STRING", "dims": [-1]}}[task]
    outputs = [output, {"name": "precision", "data_type": "TYPE_STRING", "dims": [1]}]
    config = {"name": task, "max_batch_size": 64, "output": outputs, "parameters": {
        "serialized_file": {"string_value": "resnet50.pt"},
        "handler": {"string_value": json.dumps({"task": task})}}}
    instance = adapter.TritonPythonModel()
    args = {"model_config": json.dumps(config), "model_name": task,
            "model_repository": str(Path(plan["weights"]).parent),
            "model_version": Path(plan["weights"]).name, "model_instance_kind": "CPU"}
    null_core(lambda: instance.initialize(args), lambda: instance.model)
    return instance

b64 = base64.b64encode(jpeg).decode()
crop = np.zeros((1, 224, 224, 3), dtype=np.uint8)
def binary(header, data):
    text = json.dumps(header).encode()
    return bytearray(text + data), str(len(text))
def v2_binary(output):
    element = len(jpeg).to_bytes(4, "little") + jpeg
    return binary({"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1, 1],
                   "parameters": {"binary_data_size": len(element)}}],
                   "outputs": [{"name": output, "parameters": {"binary_data": True}}]}, element)
def v2_crops(output):
    return binary({"inputs": [{"name": "crops", "datatype": "UINT8", "shape": [1, 224, 224, 3],
                   "parameters": {"binary_data_size": crop.nbytes}}],
                   "outputs": [{"name": output, "parameters": {"binary_data": True}}]},
                  crop.tobytes())

def ts_rows(form, output):
    headers = {}
    if form == "raw body": row = {"body": bytearray(jpeg)}
    elif form == "multipart": row = {"data": bytearray(jpeg)}
    elif form == "JSON base64": row = {"body": {"data": b64}}
    elif form == "v1": row = {"body": {"instances": [{"data": b64}]}}
    elif form == "v2 JSON": row = {"body": {"inputs": [{"name": "images", "datatype": "BYTES",
                                   "shape": [1, 1], "data": [b64]}], "outputs": [{"name": output}]}}
    else:
        body, length = (v2_binary if form == "v2 binary" else v2_crops)(output)
        row, headers = {"body": body}, {"Inference-Header-Content-Length": length}
    return [dict(row) for _ in range(64)], [dict(headers) for _ in range(64)]

def run_ts(task, form):
    handler, context = ts_handler(task)
    rows, headers = ts_rows(form, task)
    def once():
        context.request_processor = [RequestProcessor(h) for h in headers]
        context.request_ids = {i: f"r{i}" for i in range(len(rows))}
        sent = handler.handle(rows, context)
        statuses = {context.get_response_status(i)[0] for i in range(len(rows))}
        assert statuses <= {200, None}, (form, task, statuses, sent[0][:300])
    return once, "resnet_handler.py:handle", "http.py:http_reply"

def run_triton(task, form):
    instance = triton_model(task)
    if form == "images tensor":
        inputs = {"images": Input("images", np.array([[jpeg]], dtype=np.object_))}
    else:
        inputs = {"crops": Input("crops", crop)}
    requests = [Request(inputs, f"r{i}") for i in range(64)]
    def once():
        answers = instance.execute(requests)
        assert all(a.error is None for a in answers), answers[0].error.message
    return once, "model.py:execute", "tensor.py:encode"

def profile_steps(once, batches, total_name, encode_name):
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(batches):
        once()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    def cumulative(suffix):
        return sum(v[3] for (file, line, name), v in stats.items()
                   if f"{Path(file).name}:{name}" == suffix)
    images = 64 * batches
    total = cumulative(total_name)
    steps = {s: cumulative(f"service.py:{s}") for s in ("prepare", "infer", "answer")}
    steps["encode"] = cumulative(encode_name)
    steps["adapter"] = total - sum(steps.values())
    return {k: 1000 * v / images for k, v in steps.items()}, 1000 * total / images

rows = []
for engine, form in plan["forms"]:
    for task in ("embedding", "tags"):
        runner = run_ts if engine == "torchserve" else run_triton
        once, total_name, encode_name = runner(task, form)
        for _ in range(3):
            once()
        started = time.process_time()
        for _ in range(plan["batches"]):
            once()
        cpu = 1000 * (time.process_time() - started) / (64 * plan["batches"])
        steps, profiled = profile_steps(once, max(2, plan["batches"] // 4), total_name, encode_name)
        rows.append({"engine": engine, "form": form, "model": task, "cpu_ms": cpu,
                     "profiled_ms": profiled, "steps": steps})
print("ROWS " + json.dumps(rows))
"""


def measure(tree: Path, batches: int, forms: list[tuple[str, str]]) -> list[dict]:
    """One tree's rows (a fresh process with ``tree`` first on its path)."""
    plan = {
        "image": str(SAMPLES / IMAGES["small"]),
        "weights": str(REPO / "build" / "weights"),
        "batches": batches,
        "forms": forms,
    }
    run = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(plan)],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("ROWS ")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"measuring {tree} failed:\n{run.stderr[-4000:]}")
    return json.loads(lines[-1].removeprefix("ROWS "))


def report(before: list[dict], after: list[dict], ref: str, machine: dict) -> str:
    old = {(r["engine"], r["form"], r["model"]): r for r in before}
    rows, ratios = [], []
    for r in after:
        b = old.get((r["engine"], r["form"], r["model"]))
        steps = " / ".join(f"{r['steps'][s]:.3f}" for s in STEPS)
        row = [r["engine"], r["form"], r["model"]]
        if b is None:
            rows.append([*row, "not served", f"{r['cpu_ms']:.3f}", "", "", steps])
            continue
        ratios.append(r["cpu_ms"] / b["cpu_ms"])
        steps_before = " / ".join(f"{b['steps'][s]:.3f}" for s in STEPS)
        rows.append([*row, f"{b['cpu_ms']:.3f}", f"{r['cpu_ms']:.3f}", f"{ratios[-1]:.2f}",
                     steps_before, steps])  # fmt: skip
    header = ("engine | request | model | before ms/image | after ms/image | after/before | steps "
              "before (prepare / infer / answer / encode / adapter) | steps after")  # fmt: skip
    return document(
        "The core's cost per image, by request form",
        "Generated by `python -m bench.corecost` (`make bench-core`); bench/corecost.py says "
        "what each row measures.",
        bullets([dated(), host(machine),
                 f"Before: `{ref}`; after: this tree. The null model, batches of 64 one-image "
                 "requests handed to each engine's adapter in-process; CPU ms per image of the "
                 "worker's Python (not the engine's frontend: `make bench-ceiling` measures the "
                 "servers)."]),
        table(header, rows, "lllrrr"),
        f"Median after/before over the rows both trees serve: {statistics.median(ratios):.2f}."
        if ratios
        else None,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.corecost", __doc__)
    parser.add_argument("--before", default=BEFORE, help="the commit to compare with")
    parser.add_argument("--batches", type=int, default=20, help="timed batches of 64 a row")
    args = parse(parser, argv)
    machine = describe_machine()
    forms = [list(f) for f in FORMS]
    with tempfile.TemporaryDirectory(prefix="bench-corecost-") as work:
        with checked_out(args.before, Path(work) / "before") as old_tree:
            # Before: the forms that tree serves (v2 binary outputs and the rest are asked of
            # it all the same; a form it refuses fails its row, left out).
            before = measure(old_tree, args.batches, forms)
        after = measure(REPO, args.batches, forms)
    text = report(before, after, args.before, machine)
    figures = {"machine": machine, "before": before, "after": after}
    return publish(args.out / "core-cost.md", text, figures)


if __name__ == "__main__":
    raise SystemExit(main())
