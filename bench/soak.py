"""A bounded soak of a real server: every kind of client at once, for minutes.

    python -m bench.soak [--minutes 10] [--quick] [--engine torchserve|triton]
    make soak [SOAK_MINUTES=10] [SOAK_ENGINE=triton]

One server with the shipped config and both models, loopback only: TorchServe (or Triton on
the generated repository), each traffic class (``traffic``) a few paced clients, and the
frontend's and workers' memory sampled meanwhile (bench/README.md says what is reported).
Writes ``results/soak.{md,json,png}`` (``soak-triton.*`` for Triton). ``--quick``: 6 s.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench import layout, machine
from bench.layout import BUILD, EMBEDDING, MODEL_STORE, SAMPLES, TAGGER, cli, fresh_dir
from bench.loadgen import Endpoint, Load, Step, v2_json
from bench.markdown import bullets, document, fmt, publish, table
from bench.memory import rss
from bench.stats import Sample, percentile

log = logging.getLogger("bench.soak")
SAMPLE_EVERY_S = 5.0  # memory, at most this far apart (a short run: four samples in all)
QUICK_S = 6.0  # --quick: every class sends a few times
TIMEOUT_S = 180.0
V2_IMAGES = 8  # max_images_per_request
FLOOD_CLIENTS = 6
ENGINES = ("torchserve", "triton")


@dataclass(frozen=True)
class TrafficClass:
    """``clients`` closed-loop clients POSTing ``body`` (with ``headers``) to ``path``, each
    pausing ``pause_s`` between requests; ``expect``: the statuses a healthy server answers;
    ``note``: what the report says of this class on this engine (an engine's own answer we
    cannot change, say)."""

    name: str
    clients: int
    pause_s: float
    expect: tuple[int, ...]
    path: str
    body: bytes
    headers: dict[str, str]
    note: str = ""


def _tiny_png() -> bytes:
    from io import BytesIO

    from PIL import Image

    out = BytesIO()
    Image.new("RGB", (8, 8), (30, 200, 30)).save(out, "PNG")
    return out.getvalue()


def _multipart(fields: dict[str, bytes]) -> tuple[bytes, dict[str, str]]:
    boundary = "soak-boundary-7d1f"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'.encode()
        + (b'; filename="image.jpg"' if name == "data" else b"")
        + b"\r\n\r\n" + value + b"\r\n"
        for name, value in fields.items()
    ]  # fmt: skip
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def traffic(samples: Path, engine: str) -> list[TrafficClass]:
    """The engine's mix: what users send, and what hostile clients send beside them (the
    floods of issue #16 on the tagger's v2 route: requests of ``V2_IMAGES`` tiny images from
    ``FLOOD_CLIENTS`` clients without pause, a 1 MB tensor name, JSON nested 20,000 deep).
    Triton takes every request as v2 (images ``[n, 1]``): the classes TorchServe answers on
    its own routes (photos, bad images, deep JSON) go to ``/v2/models/<model>/infer``, and
    explanations are left out, where Triton serves none."""
    photo, other = (samples / "chelsea.jpg").read_bytes(), (samples / "coffee.jpg").read_bytes()
    tiny, bad, ts = _tiny_png(), b"not an image" * 100, engine == "torchserve"
    item = () if ts else (1,)  # each image's dimensions after the first

    def v2(images: list[bytes], name: str = "images", shape: list[int] | None = None) -> tuple:
        return v2_json(images, name=name, shape=shape or [len(images), *item])

    def route(model: str) -> str:
        return f"/predictions/{model}" if ts else f"/v2/models/{model}/infer"

    def image(model: str, data: bytes, content_type: str) -> tuple:
        """``data`` as one image to ``model``: the raw body on TorchServe, v2 on Triton."""
        return route(model), *(v2([data]) if not ts else (data, {"Content-Type": content_type}))

    tagger_v2, json_type = f"/v2/models/{TAGGER}/infer", {"Content-Type": "application/json"}
    deep = (b'{"data": ' * 20_000) + b'"x"' + b"}" * 20_000
    mix = [
        TrafficClass("photo", 2, 0.2, (200,), *image(TAGGER, photo, "image/jpeg")),
        TrafficClass("embedding", 1, 0.5, (200,), *image(EMBEDDING, other, "image/jpeg")),
        TrafficClass("v2 x8", 1, 1.0, (200, 503), tagger_v2, *v2([photo, other] * 4)),
        TrafficClass("bad image", 1, 1.0, (400,), *image(TAGGER, bad, "application/octet-stream")),
        TrafficClass("row flood", FLOOD_CLIENTS, 0.0, (200, 503), tagger_v2,
                     *v2([tiny] * V2_IMAGES)),
        TrafficClass("1 MB name", 1, 2.0, (400,), tagger_v2, *v2([tiny], "n" * 10**6, [2, *item])),
        TrafficClass("deep JSON", 1, 2.0, (400,), route(TAGGER), deep, json_type, note="" if ts
                     else "Triton 2.51's own HTTP frontend answers 500 to any request JSON it "
                     "cannot parse (nested or merely cut short), before a model sees it: "
                     "docs/triton.md"),
    ]  # fmt: skip
    if ts:
        explain = _multipart({"data": photo, "n_steps": b"16"})
        mix.insert(3, TrafficClass("explanation", 1, 3.0, (200, 503), f"/explanations/{TAGGER}",
                                   *explain))  # fmt: skip
    return mix


def paced(endpoint: Endpoint, pause_s: float, deadline: float) -> Callable[[], Step | None]:
    """A client's plan: after a random start (the clients do not start in step), a request
    ``pause_s`` after each answer, until ``deadline``."""
    due = [time.monotonic() + random.uniform(0, max(pause_s, 0.2))]

    def plan() -> Step | None:
        when, due[0] = due[0], None
        when = time.monotonic() + pause_s if when is None else when
        return (endpoint, when) if when < deadline else None

    return plan


@dataclass
class MemorySeries:
    """RSS (MiB) of the frontend and each worker over time, and every worker pid seen."""

    t: list[float] = field(default_factory=list)
    frontend: list[float] = field(default_factory=list)
    workers: dict[str, list[float]] = field(default_factory=dict)
    pids: dict[str, set[int]] = field(default_factory=dict)

    def sample(self, t: float, frontend, workers: dict[str, list[psutil.Process]]) -> None:
        """One sample at ``t``: the frontend's RSS, each model's worker pids and summed RSS."""
        self.t.append(t)
        self.frontend.append(rss(frontend) / 2**20 if frontend else 0.0)
        for model, processes in workers.items():
            self.pids.setdefault(model, set()).update(p.pid for p in processes)
            self.workers.setdefault(model, []).append(sum(rss(p) for p in processes) / 2**20)


@dataclass
class Served:
    """A server under soak: where to send (``url``, ``headers``), and its processes now (the
    frontend, each model's workers)."""

    url: str
    headers: dict[str, str]
    processes: Callable[[], tuple[psutil.Process | None, dict[str, list[psutil.Process]]]]


@contextmanager
def torchserve(attach: Path | None) -> Iterator[Served]:
    """The shipped TorchServe config and archives (``attach``: the running one in that
    folder); workers found through describe."""
    with layout.torchserve(attach, BUILD / "soak") as server:
        client = server.client(timeout=30)

        def processes():
            tree = server.processes()  # the frontend first, then its descendants
            by_pid, workers = {p.pid: p for p in tree}, {}
            for model in (TAGGER, EMBEDDING):
                try:
                    pids = [w["pid"] for w in client.describe(model)[0]["workers"] if w.get("pid")]
                except Exception:  # noqa: BLE001 - a missed sample is skipped, not the soak
                    pids = []
                workers[model] = [by_pid[p] for p in pids if p in by_pid]
            return (tree[0] if tree else None), workers

        yield Served(server.inference_url, server.keys.inference_headers(), processes)


@contextmanager
def triton() -> Iterator[Served]:
    """Triton on a repository generated from the shipped configs and archives; each model's
    Python-backend stubs are its workers (a stub's model.py path names its model)."""
    from bench.triton import stubs_of, triton_serving
    from tritonrepo.generate import generate

    work = fresh_dir(BUILD / "soak-triton")
    generate(work / "repository", model_store=MODEL_STORE)
    with triton_serving(work / "repository", work / "triton.log") as server:
        root = psutil.Process(server.process.pid)

        def processes():
            return root, {model: stubs_of(root, model) for model in (TAGGER, EMBEDDING)}

        yield Served(server.url, {}, processes)


def soak(duration_s: float, out_dir: Path, engine: str = "torchserve", attach=None) -> dict:
    """Run the engine's mix for ``duration_s`` against a fresh server (``attach``: the running
    TorchServe in that folder); write the reports; return the summary."""
    classes = traffic(SAMPLES, engine)
    series = MemorySeries()
    with torchserve(attach) if engine == "torchserve" else triton() as served:
        t0 = time.monotonic()
        deadline, loads = t0 + duration_s, {}
        for cls in classes:
            headers = {**served.headers, **cls.headers}
            endpoint = Endpoint(served.url + cls.path, headers, cls.body, TIMEOUT_S)
            plans = [paced(endpoint, cls.pause_s, deadline) for _ in range(cls.clients)]
            loads[cls.name] = Load(plans)
        log.info("soak %s: %d clients in %d classes for %.0f s", engine,
                 sum(c.clients for c in classes), len(classes), duration_s)  # fmt: skip
        while time.monotonic() < deadline:
            series.sample(time.monotonic() - t0, *served.processes())
            every = min(SAMPLE_EVERY_S, duration_s / 4)
            time.sleep(min(every, max(0.0, deadline - time.monotonic())))
        samples = {name: load.join(TIMEOUT_S + 10) for name, load in loads.items()}
        series.sample(time.monotonic() - t0, *served.processes())
    summary = {
        "engine": "TorchServe" if engine == "torchserve" else "Triton",
        **summarize(classes, samples, series, duration_s),
        "notes": {cls.name: cls.note for cls in classes if cls.note},
        "provenance": machine.dated(),
    }
    stem = "soak" if engine == "torchserve" else "soak-triton"
    publish(out_dir / f"{stem}.md", render_markdown(summary), summary)
    render_plot(series, out_dir / f"{stem}.png", summary["engine"])
    return summary


def summarize(
    classes: list[TrafficClass], samples: dict[str, list[Sample]], series: MemorySeries,
    duration_s: float,
) -> dict:  # fmt: skip
    """Per class: count, latency percentiles, outcomes, unexpected outcomes; the server's
    restarts, 5xx other than 503, and memory at the start, end and peak."""
    rows = {}
    for cls in classes:
        lat = [s.latency_ms for s in samples[cls.name]]
        outcomes = Counter(s.outcome for s in samples[cls.name])
        unexpected = Counter(s.outcome for s in samples[cls.name] if s.status not in cls.expect)
        rows[cls.name] = {
            "requests": len(lat),
            **{f"p{q}_ms": percentile(lat, q) if lat else None for q in (50, 95, 99)},
            "max_ms": max(lat, default=None),
            "outcomes": dict(outcomes),
            "unexpected": dict(unexpected),
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


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()))


def render_markdown(summary: dict) -> str:
    engine = summary["engine"]
    rows = [
        [name, str(r["requests"]), *(fmt(r[f"{k}_ms"], 0) for k in ("p50", "p95", "p99", "max")),
         _counts(r["outcomes"]), _counts(r["unexpected"]) or "-"]
        for name, r in summary["classes"].items()
    ]  # fmt: skip
    memory = [[name, *(fmt(v, 0) for v in m.values())] for name, m in summary["memory"].items()]
    restarts = ", ".join(f"{m}: {n}" for m, n in summary["restarts"].items())
    return document(
        f"Soak: {engine}",
        summary["provenance"],
        f"`python -m bench.soak` (`make soak`): {summary['duration_s'] / 60:.1f} minutes of every "
        f"traffic class at once against one local {engine} (shipped config, both models). "
        "Latency in ms per request, from send to the last byte of the answer. Memory is RSS "
        "in MiB; start is the first sample after a minute (or half-way through a short run).",
        table("class | requests | p50 | p95 | p99 | max | outcomes | unexpected", rows),
        bullets([f"worker restarts: {restarts}",
                 f"5xx other than 503: {_counts(summary['five_hundreds_not_503']) or 'none'}"]),
        bullets(f"{name}: {note}" for name, note in summary["notes"].items()),
        table("process | start | end | max", memory),
        f"RSS over time: `results/{'soak' if engine == 'TorchServe' else 'soak-triton'}.png` "
        "(not in git).",
    )  # fmt: skip


def render_plot(series: MemorySeries, path: Path, engine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    minutes = [t / 60 for t in series.t]
    frontend = "frontend (JVM)" if engine == "TorchServe" else "tritonserver"
    ax.plot(minutes, series.frontend, label=frontend)
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


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.soak", __doc__, attach="torchserve")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--quick", action="store_true", help="6 s, a smoke run")
    parser.add_argument("--engine", choices=ENGINES, default="torchserve")
    args = layout.parse(parser, argv)
    if not 0 < args.minutes <= 60:
        parser.error("--minutes must be in (0, 60]: the soak is bounded")
    if args.attach and args.engine != "torchserve":
        parser.error("--attach: a TorchServe's folder (--engine torchserve)")
    soak(QUICK_S if args.quick else args.minutes * 60, args.out, args.engine, args.attach)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
