"""A bounded soak of a real server: every kind of client at once, for minutes.

    python -m bench.soak [--minutes 10] [--quick] [--engine torchserve|triton]
    make soak [SOAK_MINUTES=10] [SOAK_ENGINE=triton]

One server with the shipped config and both models, loopback only: TorchServe
(``devtools.server.LocalTorchServe``) or Triton on the generated repository
(``tritonrepo``). Each traffic class below is a few closed-loop clients with a pause of their
own: ordinary photos, the embedding model, v2 requests of 8 images, explanations (where the
engine serves them), bad inputs, and the floods of issue #16 (v2 requests of 8 tiny images
from 6 clients, 1 MB tensor names, JSON nested 20,000 deep). A sampler records, every few
seconds, the RSS of the frontend and of each worker and the workers' pids (a changed pid is a
restart). Writes ``results/soak.md`` (``soak-triton.md`` for Triton: per-class latency
percentiles and statuses, restarts, memory at start and end) and ``soak[-triton].png`` (RSS
over time).

What a healthy run shows: no 5xx but 503 (``Overloaded`` from the handler's budgets or a full
queue), no worker restart, memory flat after the first minute. ``--quick`` is a 6 s smoke
run (the numbers mean little).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import logging
import random
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from bench import machine, report
from bench.layout import (
    BUILD,
    EMBEDDING,
    MODEL_STORE,
    RESULTS,
    SAMPLES,
    TAGGER,
    fresh_dir,
    setup_cli,
)
from bench.memory import _rss
from bench.stats import percentile
from devtools.server import LocalTorchServe

log = logging.getLogger("bench.soak")
SAMPLE_EVERY_S = 5.0  # memory, at most this far apart (a short run: four samples in all)
QUICK_S = 6.0  # --quick: every class sends a few times
TIMEOUT_S = 180.0
V2_IMAGES = 8  # max_images_per_request
FLOOD_CLIENTS = 6


def _tiny_png() -> bytes:
    from io import BytesIO

    from PIL import Image

    out = BytesIO()
    Image.new("RGB", (8, 8), (30, 200, 30)).save(out, "PNG")
    return out.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _v2(images: list[bytes], name: str = "images", shape: list[int] | None = None) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": shape or [len(images)],
                    "data": [_b64(i) for i in images],
                }
            ]
        }
    ).encode()


def _multipart(fields: dict[str, bytes]) -> tuple[bytes, str]:
    boundary = "soak-boundary-7d1f"
    parts = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'
            + ('; filename="image.jpg"' if name == "data" else "")
            + "\r\n\r\n"
        )
        parts.append(value)
        parts.append(b"\r\n")
    parts.append(f"--{boundary}--\r\n")
    body = b"".join(p.encode() if isinstance(p, str) else p for p in parts)
    return body, f"multipart/form-data; boundary={boundary}"


@dataclass(frozen=True)
class TrafficClass:
    """``clients`` closed-loop clients sending ``body`` to ``path``, each pausing
    ``pause_s`` between requests; ``expect``: the statuses a healthy server answers; ``note``:
    what the report says of this class on this engine (an engine's own answer we cannot
    change, say)."""

    name: str
    path: str
    body: bytes
    content_type: str
    clients: int
    pause_s: float
    expect: tuple[int, ...]
    note: str = ""


def _photos(samples: Path) -> tuple[bytes, bytes]:
    """The two sample photos both mixes send: a cat (the tagger's) and coffee (the embedder's)."""
    return (samples / "chelsea.jpg").read_bytes(), (samples / "coffee.jpg").read_bytes()


def _floods(item_shape: tuple[int, ...]) -> list[TrafficClass]:
    """The floods of issue #16 both engines take on the tagger's v2 route: requests of
    ``V2_IMAGES`` tiny images from ``FLOOD_CLIENTS`` clients without pause, and a 1 MB tensor
    name. ``item_shape``: each image's dimensions after the first (TorchServe ``()``, so
    ``[n]``; Triton ``(1,)``, so ``[n, 1]``)."""
    tiny = _tiny_png()
    path = f"/v2/models/{TAGGER}/infer"
    return [
        TrafficClass(
            "row flood",
            path,
            _v2([tiny] * V2_IMAGES, shape=[V2_IMAGES, *item_shape]),
            "application/json",
            FLOOD_CLIENTS,
            0.0,
            (200, 503),
        ),
        TrafficClass(
            "1 MB name",
            path,
            _v2([tiny], name="n" * 1_000_000, shape=[2, *item_shape]),
            "application/json",
            1,
            2.0,
            (400,),
        ),
    ]


def traffic(samples: Path) -> list[TrafficClass]:
    """TorchServe's mix: what users send, and what hostile clients send beside them."""
    photo, other = _photos(samples)
    explain, explain_type = _multipart({"data": photo, "n_steps": b"16"})
    json_type = "application/json"
    return [
        TrafficClass("photo", f"/predictions/{TAGGER}", photo, "image/jpeg", 2, 0.2, (200,)),
        TrafficClass("embedding", f"/predictions/{EMBEDDING}", other, "image/jpeg", 1, 0.5, (200,)),
        TrafficClass(
            "v2 x8",
            f"/v2/models/{TAGGER}/infer",
            _v2([photo, other] * 4),
            json_type,
            1,
            1.0,
            (200, 503),
        ),
        TrafficClass(
            "explanation", f"/explanations/{TAGGER}", explain, explain_type, 1, 3.0, (200, 503)
        ),
        TrafficClass(
            "bad image",
            f"/predictions/{TAGGER}",
            b"not an image" * 100,
            "application/octet-stream",
            1,
            1.0,
            (400,),
        ),
        *_floods(()),
        TrafficClass(
            "deep JSON", f"/predictions/{TAGGER}", _deep_json(), json_type, 1, 2.0, (400,)
        ),
    ]


def triton_traffic(samples: Path) -> list[TrafficClass]:
    """The same mix as Triton takes it: every request is v2 (images ``[n, 1]``), and the
    classes TorchServe answers on its own routes (photos, bad images, deep JSON) go to
    ``/v2/models/<model>/infer``. Explanations are left out where Triton serves none."""
    photo, other = _photos(samples)
    json_type = "application/json"

    def v2(images: list[bytes]) -> bytes:
        return _v2(images, shape=[len(images), 1])

    def infer(model: str) -> str:
        return f"/v2/models/{model}/infer"

    return [
        TrafficClass("photo", infer(TAGGER), v2([photo]), json_type, 2, 0.2, (200,)),
        TrafficClass("embedding", infer(EMBEDDING), v2([other]), json_type, 1, 0.5, (200,)),
        TrafficClass("v2 x8", infer(TAGGER), v2([photo, other] * 4), json_type, 1, 1.0, (200, 503)),
        TrafficClass(
            "bad image", infer(TAGGER), v2([b"not an image" * 100]), json_type, 1, 1.0, (400,)
        ),
        *_floods((1,)),
        TrafficClass(
            "deep JSON",
            infer(TAGGER),
            _deep_json(),
            json_type,
            1,
            2.0,
            (400,),
            note="Triton 2.51's own HTTP frontend answers 500 to any request JSON it "
            "cannot parse (nested or merely cut short), before a model sees it: "
            "docs/triton.md",
        ),
    ]


def _deep_json() -> bytes:
    return (b'{"data": ' * 20_000) + b'"x"' + b"}" * 20_000


@dataclass
class Record:
    """What one class saw: latencies (ms) and outcomes (``"200"``, ``"503 Overloaded"``,
    ``"ConnectionResetError"``, ...)."""

    latencies: list[float] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)
    unexpected: Counter = field(default_factory=Counter)


def _outcome(status: int, body: bytes) -> str:
    if status == 200:
        return "200"
    try:
        kind = json.loads(body).get("type", "")
    except (ValueError, AttributeError):
        kind = ""
    return f"{status} {kind}".strip()


def run_class(
    cls: TrafficClass,
    port: int,
    headers: dict[str, str],
    deadline: float,
    record: Record,
    lock: threading.Lock,
) -> None:
    """One client of ``cls`` until ``deadline`` (monotonic)."""
    rng = random.Random()
    time.sleep(rng.uniform(0, max(cls.pause_s, 0.2)))  # the clients do not start in step
    conn: http.client.HTTPConnection | None = None
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
            conn.request(
                "POST",
                cls.path,
                body=cls.body,
                headers={**headers, "Content-Type": cls.content_type},
            )
            response = conn.getresponse()
            body = response.read()
            status, outcome = response.status, _outcome(response.status, body)
            if response.getheader("connection", "").lower() == "close":
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException) as exc:
            status, outcome = 0, type(exc).__name__
            if conn is not None:
                conn.close()
            conn = None
        with lock:
            record.latencies.append((time.monotonic() - start) * 1000)
            record.outcomes[outcome] += 1
            if status not in cls.expect:
                record.unexpected[outcome] += 1
        time.sleep(cls.pause_s)
    if conn is not None:
        conn.close()


@dataclass
class MemorySeries:
    """RSS (MiB) of the frontend and each worker over time, and every worker pid seen."""

    t: list[float] = field(default_factory=list)
    frontend: list[float] = field(default_factory=list)
    workers: dict[str, list[float]] = field(default_factory=dict)
    pids: dict[str, set[int]] = field(default_factory=dict)


class Target(Protocol):
    """A server under soak: ``start``/``stop`` it, where to send (``port``, ``headers``), the
    mix it takes, and one memory sample (frontend RSS, each model's worker pids and RSS)."""

    engine: str
    stem: str
    port: int
    headers: dict[str, str]

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def classes(self, samples: Path) -> list[TrafficClass]: ...

    def sample(self, series: MemorySeries, t0: float) -> None: ...


def record_sample(
    series: MemorySeries,
    t0: float,
    frontend: psutil.Process | None,
    workers: dict[str, list[psutil.Process]],
) -> None:
    """One sample: the frontend's RSS, and each model's worker pids and summed RSS."""
    series.t.append(time.monotonic() - t0)
    series.frontend.append(_rss(frontend) / 2**20 if frontend else 0.0)
    for model, processes in workers.items():
        series.pids.setdefault(model, set()).update(p.pid for p in processes)
        series.workers.setdefault(model, []).append(sum(_rss(p) for p in processes) / 2**20)


class TorchServeTarget:
    """The shipped TorchServe config and archives; workers found through describe.
    ``attach``: the folder of a running ``LocalTorchServe`` to soak instead of a fresh one."""

    engine, stem = "TorchServe", "soak"

    def __init__(self, attach: Path | None = None) -> None:
        self.server = (
            LocalTorchServe.attach(attach)
            if attach
            else LocalTorchServe(fresh_dir(BUILD / "soak"), MODEL_STORE)
        )
        self.port, self.headers = 0, {}

    def start(self) -> None:
        self.server.start()
        self.port = int(self.server.inference_url.rsplit(":", 1)[1])
        self.headers = self.server.keys.inference_headers()

    def stop(self) -> None:
        self.server.kill()

    def classes(self, samples: Path) -> list[TrafficClass]:
        return traffic(samples)

    def sample(self, series: MemorySeries, t0: float) -> None:
        client = self.server.client(timeout=30)
        tree = self.server.processes()  # the frontend first, then its descendants
        processes = {p.pid: p for p in tree}
        workers = {}
        for model in (TAGGER, EMBEDDING):
            try:
                pids = [w["pid"] for w in client.describe(model)[0]["workers"] if w.get("pid")]
            except Exception:  # noqa: BLE001 - a missed sample is skipped, not the soak
                pids = []
            workers[model] = [processes[p] for p in pids if p in processes]
        record_sample(series, t0, tree[0] if tree else None, workers)


class TritonTarget:
    """Triton on a repository generated from the shipped configs and archives; each model's
    Python-backend stubs are its workers (a stub's model.py path names its model)."""

    engine, stem = "Triton", "soak-triton"

    def __init__(self) -> None:
        from tritonrepo.generate import generate

        self.work = fresh_dir(BUILD / "soak-triton")
        generate(self.work / "repository", model_store=MODEL_STORE)
        self.running = ExitStack()
        self.port, self.headers = 0, {}

    def start(self) -> None:
        from bench.triton import triton_serving

        serving = triton_serving(self.work / "repository", self.work / "triton.log")
        self.triton = self.running.enter_context(serving)
        self.port = self.triton.ports["http"]

    def stop(self) -> None:
        self.running.close()

    def classes(self, samples: Path) -> list[TrafficClass]:
        return triton_traffic(samples)

    def sample(self, series: MemorySeries, t0: float) -> None:
        if self.triton.process is None:
            return
        root = psutil.Process(self.triton.process.pid)
        stubs = root.children(recursive=True)
        workers = {
            model: [p for p in stubs if _is_stub_of(p, model)] for model in (TAGGER, EMBEDDING)
        }
        record_sample(series, t0, root, workers)


def _is_stub_of(process: psutil.Process, model: str) -> bool:
    try:
        return any(f"/{model}/" in arg for arg in process.cmdline()[1:2])
    except psutil.Error:  # it exited between listing and reading
        return False


TARGETS = {"torchserve": TorchServeTarget, "triton": TritonTarget}


def soak(
    duration_s: float, out_dir: Path, engine: str = "torchserve", attach: Path | None = None
) -> dict:
    """Run the engine's mix for ``duration_s`` against a fresh server (``attach``: the running
    TorchServe in that folder); write the reports; return the summary."""
    target: Target = TorchServeTarget(attach) if attach else TARGETS[engine]()
    classes = target.classes(SAMPLES)
    records = {cls.name: Record() for cls in classes}
    series = MemorySeries()
    lock = threading.Lock()
    try:
        target.start()
        t0 = time.monotonic()
        deadline = t0 + duration_s
        threads = [
            threading.Thread(
                target=run_class,
                daemon=True,
                args=(cls, target.port, target.headers, deadline, records[cls.name], lock),
            )
            for cls in classes
            for _ in range(cls.clients)
        ]
        for thread in threads:
            thread.start()
        log.info(
            "soak %s: %d clients in %d classes for %.0f s",
            target.engine,
            len(threads),
            len(classes),
            duration_s,
        )
        while time.monotonic() < deadline:
            target.sample(series, t0)
            every = min(SAMPLE_EVERY_S, duration_s / 4)
            time.sleep(min(every, max(0.0, deadline - time.monotonic())))
        for thread in threads:
            thread.join(timeout=TIMEOUT_S + 10)
        target.sample(series, t0)
    finally:
        target.stop()
    summary = {
        "engine": target.engine,
        **summarize(classes, records, series, duration_s),
        "notes": {cls.name: cls.note for cls in classes if cls.note},
        "provenance": machine.dated(),
    }
    write_reports(summary, series, out_dir, target.stem)
    return summary


def summarize(
    classes: list[TrafficClass], records: dict[str, Record], series: MemorySeries, duration_s: float
) -> dict:
    """Per class: count, latency percentiles, outcomes, unexpected outcomes; the server's
    restarts, 5xx other than 503, and memory at the start, end and peak."""
    rows = {}
    for cls in classes:
        record = records[cls.name]
        lat = record.latencies
        rows[cls.name] = {
            "requests": len(lat),
            "p50_ms": percentile(lat, 50) if lat else None,
            "p95_ms": percentile(lat, 95) if lat else None,
            "p99_ms": percentile(lat, 99) if lat else None,
            "max_ms": max(lat, default=None),
            "outcomes": dict(record.outcomes),
            "unexpected": dict(record.unexpected),
        }
    five_hundreds = {
        k: n
        for r in rows.values()
        for k, n in r["outcomes"].items()
        if k[:1] == "5" and not k.startswith("503")
    }
    # The first sample is taken before any request: "start" is the first one after a minute
    # (or half-way through a short run), when caches and pools are warm.
    warm = next((i for i, t in enumerate(series.t) if t >= min(60.0, duration_s / 2)), 0)

    def memory(values: list[float]) -> dict:
        return {
            "start_mib": values[warm] if values else None,
            "end_mib": values[-1] if values else None,
            "max_mib": max(values, default=None),
        }

    return {
        "duration_s": duration_s,
        "classes": rows,
        "restarts": {m: len(p) - 1 for m, p in series.pids.items()},
        "five_hundreds_not_503": five_hundreds,
        "memory": {
            "frontend": memory(series.frontend),
            **{f"{m} worker": memory(v) for m, v in series.workers.items()},
        },
    }


def render_markdown(summary: dict) -> str:
    engine = summary.get("engine", "TorchServe")
    rows = []
    for name, r in summary["classes"].items():
        outcomes = ", ".join(f"{k}: {n}" for k, n in sorted(r["outcomes"].items()))
        unexpected = ", ".join(f"{k}: {n}" for k, n in sorted(r["unexpected"].items())) or "-"
        rows.append(
            [
                name,
                str(r["requests"]),
                report.fmt(r["p50_ms"], 0),
                report.fmt(r["p95_ms"], 0),
                report.fmt(r["p99_ms"], 0),
                report.fmt(r["max_ms"], 0),
                outcomes,
                unexpected,
            ]
        )
    memory = [
        [
            name,
            report.fmt(m["start_mib"], 0),
            report.fmt(m["end_mib"], 0),
            report.fmt(m["max_mib"], 0),
        ]
        for name, m in summary["memory"].items()
    ]
    restarts = ", ".join(f"{m}: {n}" for m, n in summary["restarts"].items())
    lines = [
        f"# Soak: {engine}",
        "",
        summary.get("provenance", ""),
        "",
        f"`python -m bench.soak` (`make soak`): {summary['duration_s'] / 60:.1f} minutes of every "
        f"traffic class at once against one local {engine} (shipped config, both models). "
        "Latency in ms per request, from send to the last byte of the answer. Memory is RSS "
        "in MiB; start is the first sample after a minute (or half-way through a short run).",
        "",
        *report.table(
            ["class", "requests", "p50", "p95", "p99", "max", "outcomes", "unexpected"], rows
        ),
        "",
        f"- worker restarts: {restarts}",
        "- 5xx other than 503: "
        + (", ".join(f"{k}: {n}" for k, n in summary["five_hundreds_not_503"].items()) or "none"),
        "",
        *(f"- {name}: {note}" for name, note in summary.get("notes", {}).items()),
        "",
        *report.table(["process", "start", "end", "max"], memory),
        "",
        f"RSS over time: `results/{'soak' if engine == 'TorchServe' else 'soak-triton'}.png` "
        "(not in git).",
    ]
    return "\n".join(lines) + "\n"


def render_plot(series: MemorySeries, path: Path, engine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    minutes = [t / 60 for t in series.t]
    ax.plot(
        minutes,
        series.frontend,
        label="frontend (JVM)" if engine == "TorchServe" else "tritonserver",
    )
    for model, values in series.workers.items():
        ax.plot(minutes, values, label=f"{model} worker")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"Soak ({engine}): memory of the frontend and the workers")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_reports(summary: dict, series: MemorySeries, out_dir: Path, stem: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.md").write_text(render_markdown(summary))
    report.write_json(summary, out_dir / f"{stem}.json")
    render_plot(series, out_dir / f"{stem}.png", summary.get("engine", "TorchServe"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--quick", action="store_true", help="6 s, a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--engine", choices=sorted(TARGETS), default="torchserve")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--attach",
        type=Path,
        metavar="DIR",
        help="soak the TorchServe devtools.server started in DIR and leave it running",
    )
    args = parser.parse_args(argv)
    setup_cli("soak", args.quiet)
    if not 0 < args.minutes <= 60:
        parser.error("--minutes must be in (0, 60]: the soak is bounded")
    if args.attach and args.engine != "torchserve":
        parser.error("--attach: a TorchServe's folder (--engine torchserve)")
    duration_s = QUICK_S if args.quick else args.minutes * 60
    summary = soak(duration_s, args.out, args.engine, args.attach)
    print(render_markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
