"""Faults injected into real servers under load: a model's process SIGKILLed on each engine (the
model answers again within ``BACK_WITHIN_S``, its requests in the gap are held or refused as
retryable, the other model answers throughout, readiness is false exactly while the model cannot
answer; the transformer in front of Triton answers the gap as 503 + Retry-After) and a whole
server SIGKILLed in the middle of ``tsctl embed`` (the job ends with every photo exactly once in
its Parquet). docs/operations.md "When a model dies" quotes what these measure."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from dataclasses import dataclass, field

import psutil
import pyarrow.parquet as pq
import pytest
import requests

from serveclient import metrics
from serveclient.errors import TRITON_RELOADING
from tests import imagegen
from tests.served import TSCTL, local_triton, v2_body
from tritonrepo.watchdog import model_of, stub_instances

pytestmark = pytest.mark.integration
TAGGER, EMBEDDING = "resnet50-tagger", "resnet50-embedding"
# A killed model answers again within this. A restarted worker now serves the host's stored
# precision (results/worker-start.md: a worker ready in 4.6 s instead of 8.6 with auto
# measuring), and these tests measured on this 2-core host (2026-11-27): idle, TorchServe's
# new worker 8.2 s and Triton's reload 13.3 s (the 15 s); with two CPU burners beside
# them 12.3 and 23.7 s; once at load average 12-17 (other test suites on the host) 39.3 s for
# TorchServe. The bound is 2.5x the slowest two-burner figure, so a suite on a busy host
# passes; the restart that failed at 60.5 s in a fresh clone measured its precision again.
BACK_WITHIN_S = 60.0
# Triton 2.51 holds a request that was in the dead stub until the model is back: the client's
# own timeout ends it (docs/operations.md).
CLIENT_TIMEOUT_S = 10.0
PHOTO = imagegen.jpeg(160, 120, seed=42)


@dataclass
class Load:
    """Clients sending one photo per request to ``post(model)`` in a loop until ``stop``:
    every answer as (sent, answered, model, status, body head), in ``monotonic`` seconds."""

    post: object
    answers: list = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self, models: list[str]) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._client, args=(m,)) for m in models]
        for thread in threads:
            thread.start()
        return threads

    def _client(self, model: str) -> None:
        while not self.stopping.is_set():
            sent = time.monotonic()
            try:
                status, text = self.post(model)  # type: ignore[operator]
            except requests.RequestException as exc:
                status, text = 0, repr(exc)
            self.answers.append((sent, time.monotonic(), model, status, text[:200]))
            time.sleep(0.3)

    def of(self, model: str, since: float = 0.0) -> list[tuple]:
        return [a for a in self.answers if a[2] == model and a[0] >= since]


class Readiness:
    """``ready()`` every 0.2 s on a thread of its own while in the ``with`` block: every
    answer as (monotonic time it was asked, ready); an error counts as not ready."""

    def __init__(self, ready) -> None:
        self.ready = ready
        self.seen: list[tuple[float, bool]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Readiness:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stopping.is_set():
            asked = time.monotonic()
            try:
                ready = bool(self.ready())
            except requests.RequestException:
                ready = False
            self.seen.append((asked, ready))
            self._stopping.wait(0.2)

    def since(self, t: float) -> list[tuple[float, bool]]:
        return [s for s in self.seen if s[0] >= t]


def wait_back(load: Load, readiness: Readiness, model: str, killed: float) -> None:
    """Until readiness, having been false since the kill, is true again and ``model`` has
    answered 200 to two requests sent after that (and the other clients answered once more),
    or ``BACK_WITHIN_S`` has passed: the test's assertions then say what was missing."""
    deadline = killed + BACK_WITHIN_S + CLIENT_TIMEOUT_S
    while time.monotonic() < deadline:
        seen = readiness.since(killed)
        down = [t for t, r in seen if not r]
        up = [t for t, r in seen if r and down and t > down[-1]]
        if up:
            fine = [a for a in load.answers if a[0] > up[0] and a[3] == 200]
            if sum(a[2] == model for a in fine) >= 2 and any(a[2] != model for a in fine):
                return
        time.sleep(0.2)


def back_after(load: Load, model: str, killed: float) -> float:
    """Seconds from the kill to the first 200 of ``model`` that was sent after a non-200
    (or, when every answer was 200, to the first one sent after the kill)."""
    after = sorted(load.of(model, killed))
    failed = [a for a in after if a[3] != 200]
    start = failed[-1][0] if failed else killed
    first = next(a for a in after if a[3] == 200 and a[0] >= start)
    return first[1] - killed


def kill_under_load(
    load: Load, readiness: Readiness, pid: int, extra: tuple[str, ...] = ()
) -> float:
    """Clients on the tagger (two), the embedding model and ``extra``, readiness watched;
    ``pid`` killed once each client has had an answer; returns when the tagger is back
    (``wait_back``) and the clients stopped: the kill's ``monotonic`` time."""
    threads = load.run([TAGGER, TAGGER, EMBEDDING, *extra])
    try:
        with readiness:
            deadline = time.monotonic() + 60
            while len({a[2] for a in load.answers}) < 2 or len(readiness.seen) < 2:
                assert time.monotonic() < deadline, "no answers before the kill"
                time.sleep(0.1)
            psutil.Process(pid).kill()
            killed = time.monotonic()
            wait_back(load, readiness, TAGGER, killed)
    finally:
        load.stopping.set()
        for thread in threads:
            thread.join(90)
    return killed


def restarts(url: str) -> dict[str, dict[str, float]]:
    """``resnet50_worker_restarts`` by model and slot, as /metrics says; the metric may lag
    an answer (the engines write it from another thread): up to 10 s for every model to
    report one."""
    deadline = time.monotonic() + 10
    while True:
        text = requests.get(url, timeout=10).text
        found: dict[str, dict[str, float]] = {}
        for name, labels, value in metrics.samples(text):
            if name == "resnet50_worker_restarts":
                found.setdefault(labels["model"], {})[labels["slot"]] = value
        if {TAGGER, EMBEDDING} <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def assert_readiness_told_the_truth(
    readiness: Readiness, load: Load, killed: float, back: float
) -> None:
    """Readiness false within 2.5 s of the kill, false until the tagger answered again, and
    true at the end; once it said ready again, no tagger request met the gap's refusal."""
    seen = readiness.since(killed)
    down = [t for t, r in seen if not r]
    assert down and down[0] - killed < 2.5, seen[:5]
    assert seen[-1][1], seen[-5:]
    assert down[-1] - killed < back + 0.5, (down[-1] - killed, back)
    # Not ready again before the tagger answers: the only true samples are the last ones,
    # and a request sent after the first of them (0.5 s: the readiness call's own time) is
    # answered or times out at its client (a reloaded model's first batch can take longer than
    # the probe's 1 s on a busy host), never refused. Not a timing bound: readiness came back
    # 1.7 s before the first answer once on a slower 2-core host, whose first batch was slow.
    first_up = next(t for t, r in seen if r and t > down[0])
    assert first_up > down[-1], (first_up - killed, down[-1] - killed)
    tagger = load.of(TAGGER, first_up + 0.5) + load.of(PROBE, first_up + 0.5)
    refused = [(a[0] - killed, a[3], a[4]) for a in tagger if a[3] not in (0, 200)]
    assert not refused, (first_up - killed, back, refused)


# ---------------------------------------------------------------------------------- Triton


@pytest.fixture(scope="module")
def triton(tmp_path_factory, model_store):
    """A Triton of this module's own: it kills a stub, and the session's Triton serves the
    modules after it (test_lanes reads its metrics)."""
    # A short exit timeout: stopping it does not wait 30 s for the clients' idle connections.
    with local_triton(
        tmp_path_factory.mktemp("faults-triton"), model_store, exit_timeout=2
    ) as server:
        yield server


@pytest.fixture(scope="module")
def transformer(triton, tmp_path_factory):
    """The preprocessing server (transformer/) in front of this module's Triton, as a KServe
    pod runs it beside a Triton predictor."""
    from devtools.transformer import LocalTransformer

    predictor = triton.url.removeprefix("http://")
    with LocalTransformer(TAGGER, predictor, tmp_path_factory.mktemp("faults-tf")) as running:
        yield running


PROBE = "tagger probe"  # a tagger client with a short timeout: it sees the gap's answers
THROUGH = "through the transformer"  # the tagger behind the transformer, the same timeout
# The other model answers throughout, though not fast: on a busy 2-core host, beside the
# tagger's reload, one of its answers took over 10 s (5 runs with two CPU burners, 2026-11-27).
TIMEOUTS = {PROBE: 1.0, THROUGH: 1.0, EMBEDDING: BACK_WITHIN_S}


def test_a_triton_stub_killed_under_load_is_reloaded_and_readiness_says_so(triton, transformer):
    """The stub's gap as each client sees it, Triton's own (404 "no available versions") and
    the transformer's in front of it (503 + Retry-After, what a client retries)."""

    def post(model, timeout=None):
        timeout = timeout or TIMEOUTS.get(model, CLIENT_TIMEOUT_S)
        if model == THROUGH:
            body = {"instances": [{"image": {"b64": base64.b64encode(PHOTO).decode()}}]}
            r = requests.post(
                f"{transformer.url}/v1/models/{TAGGER}:predict", json=body, timeout=timeout
            )
            return r.status_code, f"Retry-After={r.headers.get('Retry-After')} {r.text}"
        r = requests.post(
            f"{triton.url}/v2/models/{TAGGER if model == PROBE else model}/infer",
            json=v2_body([PHOTO], {}),
            timeout=timeout,
        )
        return r.status_code, r.text

    def ready():
        return requests.get(f"{triton.url}/v2/health/ready", timeout=5).status_code == 200

    assert ready() and post(TAGGER)[0] == 200
    # The transformer's first request (its first crop and connection) before the kill, without
    # the gap probe's 1 s timeout: a fresh clone's busy host took longer once.
    through = post(THROUGH, timeout=CLIENT_TIMEOUT_S)
    assert through[0] == 200 and '"predictions"' in through[1], through
    (pid,) = [p for p, i in stub_instances(triton.process.pid).items() if model_of(i) == TAGGER]
    load, readiness = Load(post), Readiness(ready)
    killed = kill_under_load(load, readiness, pid, (PROBE, THROUGH))
    back = back_after(load, TAGGER, killed)
    assert back < BACK_WITHIN_S, back

    # In the gap: Triton's "no available versions" (serveclient's 503) at once; 500 or the
    # client's timeout only for what was in the stub or sent before the watchdog's look, or
    # what met the reloaded model's first batch (over 1 s on a busy host: 5 runs with two CPU
    # burners, 2026-11-27).
    def unanswered_allowed(sent: float) -> bool:
        return sent - killed < 2.0 or sent > killed + back - 2.0

    gap = [a for a in load.of(TAGGER, killed - CLIENT_TIMEOUT_S) if a[1] > killed]
    for sent, _, _, status, text in gap:
        if status in (0, 500):
            assert unanswered_allowed(sent), (sent - killed, back, status, text)
        else:
            assert status == 200 or (status == 404 and TRITON_RELOADING in text), (status, text)
    # The clients above may be held in the dead stub past the whole reload; the probe, whose
    # requests time out in 1 s, asks again during it and meets the gap's answer.
    assert any(a[3] == 404 and TRITON_RELOADING in a[4] for a in load.of(PROBE, killed))
    # The transformer turns that gap into 503 + Retry-After; a request in the dead stub ends
    # at the client's timeout, as on Triton itself.
    fronted = load.of(THROUGH, killed - CLIENT_TIMEOUT_S)
    for sent, _, _, status, text in (a for a in fronted if a[1] > killed):
        if status in (0, 500):
            assert unanswered_allowed(sent), (sent - killed, back, status, text)
        else:
            assert status == 200 or (status == 503 and "ModelUnavailable" in text), (status, text)
    refused = [a[4] for a in fronted if a[3] == 503]
    assert refused and all(not t.startswith("Retry-After=None") for t in refused), refused
    assert {a[3] for a in load.of(EMBEDDING)} == {200}
    assert_readiness_told_the_truth(readiness, load, killed, back)
    assert triton.watchdog.restarts.count == {TAGGER: 1}
    # Triton names the instance, the slot its reload keeps: one restart there.
    counted = restarts(triton.metrics_url)
    assert counted.pop(TAGGER) == {f"{TAGGER}_0_0": 1.0}
    assert counted[EMBEDDING] == {f"{EMBEDDING}_0_0": 0.0}  # and the bulk lane's: none
    assert {v for slots in counted.values() for v in slots.values()} == {0.0}
    assert triton.watchdog.restarts.down_since == {}
    print(f"triton: tagger back {back:.1f} s after its stub was killed")


# ------------------------------------------------------------------------------ TorchServe


def test_a_torchserve_worker_killed_under_load_is_replaced_and_its_requests_held(torchserve):
    client = torchserve.client()
    headers = torchserve.keys.inference_headers()

    def post(model):
        r = requests.post(
            f"{torchserve.inference_url}/predictions/{TAGGER if model == PROBE else model}",
            data=PHOTO,
            headers=headers,
            timeout=CLIENT_TIMEOUT_S if model == PROBE else 60,
        )
        return r.status_code, r.text

    def ready():  # what the KServe runtime's readiness.py asks: minWorkers READY
        entry = client.describe(TAGGER)[0]
        loaded = sum(w["status"] == "READY" for w in entry["workers"])
        return loaded >= max(entry["minWorkers"], 1)

    assert ready() and post(TAGGER)[0] == 200
    (worker,) = [w for w in client.describe(TAGGER)[0]["workers"] if w["status"] == "READY"]
    load, readiness = Load(post), Readiness(ready)
    killed = kill_under_load(load, readiness, int(worker["pid"]), (PROBE,))
    # The probe says when the tagger answers again: TorchServe can lose the requests it held
    # for the dead worker (below), and a client waiting out its 60 s timeout in one asks
    # nothing meanwhile (both tagger clients did in a fresh clone's run, 2026-11-27).
    back = back_after(load, PROBE, killed)
    assert back < BACK_WITHIN_S, back
    statuses = {a[3] for a in load.of(TAGGER, killed)}
    # Held and answered; what was in the dead worker's batch gets TorchServe's 507 or 500, or
    # (seen once in CI on a busy host) no answer at all: the frontend can lose a job it had
    # taken for the dead worker, and only the client's own timeout ends it (status 0 here).
    # Either only for what was sent before the frontend saw the worker gone.
    early = [a for a in load.of(TAGGER, killed - 60) if a[0] < killed + 2 and a[1] > killed]
    lost = [a for a in early if a[3] == 0]
    assert {a[3] for a in early} <= {0, 200, 500, 507}, early
    assert all("ReadTimeout" in a[4] for a in lost), lost
    later = [a for a in load.of(TAGGER, killed + 2) if a[3] not in (200, 503)]
    assert not later, later
    assert {a[3] for a in load.of(EMBEDDING)} == {200}
    assert_readiness_told_the_truth(readiness, load, killed, back)
    # The new worker took the dead one's slot (its socket, named for the worker's id): one
    # restart there, none elsewhere (other tests may have scaled the shared server's workers).
    counted = restarts(f"{torchserve.metrics_url}/metrics")
    port = worker["id"]
    killed_slot = [v for slot, v in counted[TAGGER].items() if slot.rsplit(".", 1)[-1] == port]
    assert killed_slot == [1.0], (worker["id"], counted)
    assert sum(counted[TAGGER].values()) == 1.0 and set(counted[EMBEDDING].values()) == {0.0}
    print(f"torchserve: tagger back {back:.1f} s after its worker was killed; {statuses}")


# ------------------------------------------------------------------ a whole server killed


def test_a_server_killed_mid_embed_then_restarted_leaves_every_photo_once(tmp_path, model_store):
    from devtools.server import LocalTorchServe

    photos = tmp_path / "photos"
    photos.mkdir()
    count = 48  # a part every 4 rows: the kill lands after the first, with most still to do
    for i in range(count):
        (photos / f"p{i:04d}.jpg").write_bytes(imagegen.jpeg(160, 120, seed=900 + i))
    server = LocalTorchServe(tmp_path / "ts", model_store, load_models=[f"{EMBEDDING}.mar"])
    server.start()
    out = tmp_path / "v.parquet"
    parts = tmp_path / "v.parquet.parts"
    # Interactive: a bulk job idle-schedules its own process (tsctl.batchjob), which on a busy
    # host waits for idle CPU by design; the kill and the resume are what is tested here.
    argv = [str(TSCTL), "embed", str(photos), "--out", str(out), "--json", "--part-rows", "4"]
    argv += ["--priority", "interactive"]
    try:
        job = subprocess.Popen(
            [*argv, "--per-request", "2"],
            env=server.cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while not (parts.is_dir() and any(parts.glob("part-*.parquet"))):
            assert job.poll() is None, "finished before the server could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        processes = server.processes()
        for process in processes:
            process.kill()
        _, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive, alive
        server.start()  # the same ports; the job has waited out the outage, or stopped
        stdout, stderr = job.communicate(timeout=300)
        again = subprocess.run(argv, env=server.cli_env(), capture_output=True, text=True)
    finally:
        server.kill()
    assert again.returncode == 0, (stdout, stderr, again.stderr)
    table = pq.read_table(out).to_pandas()
    assert sorted(table["path"]) == sorted(str(p) for p in photos.glob("*.jpg"))
    assert len(table) == count and set(table["status"]) == {"ok"}, table["status"].value_counts()
    summary = json.loads(again.stdout)
    print(f"first run exit {job.returncode}: {stderr.strip()[-300:]}; again: {summary}")
