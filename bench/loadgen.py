"""Every request a bench tool sends goes through here: an ``Endpoint`` says where and what to
POST; ``Load`` runs the client threads, each on its own keep-alive connection, each taking its
next request from a plan; on it ``closed_loop``, ``scheduled`` (each client's requests due on
a clock), ``each_once`` (every file once, a refused one sent again) and ``warm``;
``open_loop``: Poisson arrivals. Loopback only; every loop is bounded by a duration or a
count. And the bodies the tools send: KServe v2 JSON, the binary tensor extension, crops.

Each returns ``Sample`` lists; ``bench.stats.summarize`` turns them into numbers.
"""

from __future__ import annotations

import base64
import functools
import http.client
import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from bench.stats import Sample
from serveshared.v2binary import binary_body, binary_tensor, bytes_elements
from serveshared.wire import BATCH_HEADER

REQUEST_ID_HEADER = "x-request-id"  # set by TorchServe's frontend on every response
# What a client sends next: the endpoint, and when it is due (monotonic; None: at once).
Step = tuple["Endpoint", "float | None"]
Plan = Callable[[], "Step | None"]  # a client's next step, or None: that client is done


@dataclass(frozen=True)
class Endpoint:
    """Where and what to POST: ``body`` (bytes, or a file read when it is sent) with
    ``headers``."""

    url: str
    headers: dict[str, str]
    body: bytes | Path
    timeout_s: float = 60.0
    where: tuple = field(init=False, repr=False, compare=False)  # (host, port, path)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the benchmark only talks to loopback, not {parts.hostname!r}")
        object.__setattr__(self, "where", (parts.hostname, parts.port or 80, parts.path))


class Connection:
    """One keep-alive HTTP/1.1 connection of a client thread, on ``http.client``.

    The load generator shares the cores with the server under test, so it should cost as
    little CPU as possible: ``http.client`` spends a fraction of what ``requests`` does per
    call. A broken connection is reopened on the next request (and by ``http.client`` after
    an answer that closes it)."""

    def __init__(self) -> None:
        self.conn: http.client.HTTPConnection | None = None
        self.at: tuple = ()

    def send(self, endpoint: Endpoint, due: float | None = None) -> Sample:
        """One request; its latency from ``due`` (monotonic; None: now). Any answer but 200,
        or an exception, is an error sample, never raised."""
        body = endpoint.body if isinstance(endpoint.body, bytes) else endpoint.body.read_bytes()
        host, port, path = endpoint.where
        start = time.monotonic() if due is None else due
        try:
            if self.conn is None or self.at != (host, port):
                self.close()
                self.conn = http.client.HTTPConnection(host, port, timeout=endpoint.timeout_s)
                self.at = (host, port)
            self.conn.request("POST", path, body=body, headers=endpoint.headers)
            response = self.conn.getresponse()
            answer = response.read()  # the whole answer counts in the latency
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return Sample(start, time.monotonic(), False, type(exc).__name__)
        end, status = time.monotonic(), response.status
        request_id = response.getheader(REQUEST_ID_HEADER, "")
        if status != 200:
            return Sample(start, end, False, f"HTTP {status}", status=status,
                          kind=_error_type(answer), request_id=request_id)  # fmt: skip
        batch = response.getheader(BATCH_HEADER)
        size = int(batch) if batch and batch.isdigit() else None
        return Sample(start, end, True, status=200, batch_size=size, request_id=request_id)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _error_type(body: bytes) -> str:
    """The ``type`` an error body names (TorchServe's and our handler's JSON), else empty."""
    try:
        kind = json.loads(body).get("type", "")
    except (ValueError, AttributeError):
        return ""
    return kind if isinstance(kind, str) else ""


class Load:
    """One client thread per plan of ``plans``, each asking its plan for its next ``Step``
    (one plan may be shared by several clients) until it answers None or ``stop()``; each
    request is sent when due, its latency counted from then, so a client held up by the
    server counts the wait. The plans, and ``seen(endpoint, sample)`` with each answer, are
    called under one lock."""

    def __init__(
        self, plans: list[Plan], seen: Callable[[Endpoint, Sample], None] | None = None
    ) -> None:
        self.samples: list[Sample] = []
        self.lock = threading.Lock()
        self.stopped = False
        self.seen = seen
        self.threads = [
            threading.Thread(target=self._client, args=(p,), daemon=True) for p in plans
        ]
        for thread in self.threads:
            thread.start()

    def _client(self, plan: Plan) -> None:
        connection = Connection()
        try:
            while True:
                with self.lock:
                    step = None if self.stopped else plan()
                if step is None:
                    return
                endpoint, due = step
                if due is not None:
                    time.sleep(max(0.0, due - time.monotonic()))
                sample = connection.send(endpoint, due)
                with self.lock:
                    self.samples.append(sample)
                    if self.seen:
                        self.seen(endpoint, sample)
        finally:
            connection.close()

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def answered(self) -> int:
        with self.lock:
            return len(self.samples)

    def stop(self) -> None:
        """No new request from any client; those in flight are waited for."""
        self.stopped = True
        self.join()

    def join(self, timeout_s: float | None = None) -> list[Sample]:
        """Every sample, in the order they ended, once the clients are done (at most
        ``timeout_s``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self.lock:
            return list(self.samples)


def closed_loop(
    endpoint: Endpoint, clients: int, duration_s: float, max_requests: int
) -> list[Sample]:
    """``clients`` clients, each sending its next request when the previous answer arrives,
    until ``duration_s`` has passed or ``max_requests`` have been sent in total."""
    deadline, sent = time.monotonic() + duration_s, itertools.count()

    def plan() -> Step | None:
        return (
            (endpoint, None) if time.monotonic() < deadline and next(sent) < max_requests else None
        )

    # A request can outlive the deadline by at most its own timeout.
    return Load([plan] * clients).join(duration_s + endpoint.timeout_s + 5)


def scheduled(clients: list[list[Endpoint]], period_s: float, seconds: float) -> list[Sample]:
    """One client per list of endpoints, each sending its k-th at ``t0 + offset + k *
    period_s`` (the clients' offsets spread over one period) for ``seconds``: an open loop, a
    late request counting its wait. The samples in the order they were due."""
    t0 = time.monotonic() + 0.05
    plans = []
    for i, mine in enumerate(clients):
        offsets = (i * period_s / len(clients) + k * period_s for k in range(len(mine)))
        steps = [(e, t0 + offset) for e, offset in zip(mine, offsets) if offset < seconds]
        plans.append(functools.partial(next, iter(steps), None))
    return sorted(Load(plans).join(), key=lambda s: s.start)


def each_once(
    endpoints: Iterable[Endpoint], clients: int, limit_s: float, resend_after_s: float | None
) -> Load:
    """Every endpoint sent once (a file each, say), ``clients`` at a time, no new request
    after ``limit_s``; one refused by a full queue (503) sent again ``resend_after_s`` later,
    as tsctl's job does (None: not again). Running when returned."""
    queue: list[Step] = [(endpoint, None) for endpoint in reversed(list(endpoints))]
    until = time.monotonic() + limit_s

    def plan() -> Step | None:
        return queue.pop() if queue and time.monotonic() <= until else None

    def seen(endpoint: Endpoint, sample: Sample) -> None:
        if sample.status == 503 and resend_after_s is not None:
            queue.append((endpoint, time.monotonic() + resend_after_s))

    return Load([plan] * clients, seen)


def warm(endpoint: Endpoint, requests: int, what: str) -> None:
    """``requests`` requests one after another, each of which must answer 200."""
    for sample in closed_loop(endpoint, 1, requests * endpoint.timeout_s, requests):
        if not sample.ok:
            raise RuntimeError(f"{what}: a warm-up request got {sample.error}")


def poisson_schedule(
    rate: float, duration_s: float, max_requests: int, seed: int = 0
) -> list[float]:
    """Arrival offsets (s from the start) of a Poisson process at ``rate`` per second,
    cut at ``duration_s`` or ``max_requests``; seeded so ours and stock get the same one."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = random.Random(seed)
    offsets: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s and len(offsets) < max_requests:
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def open_loop(
    endpoint: Endpoint,
    rate: float,
    duration_s: float,
    max_requests: int,
    max_in_flight: int = 64,
    seed: int = 0,
) -> list[Sample]:
    """Send requests at Poisson arrival times regardless of answers (an open system), on a
    pool that grows a thread (and a connection) only when every one is busy.

    Latency runs from each request's *scheduled* time: when all ``max_in_flight`` client
    threads are busy, the wait for one is the server's fault and is counted (no coordinated
    omission)."""
    local = threading.local()
    connections: list[Connection] = []

    def send(due: float) -> Sample:
        if not hasattr(local, "connection"):
            local.connection = Connection()
            connections.append(local.connection)  # list.append is atomic
        return local.connection.send(endpoint, due)

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="open-loop") as pool:
        futures = []
        for offset in poisson_schedule(rate, duration_s, max_requests, seed):
            time.sleep(max(0.0, t0 + offset - time.monotonic()))
            futures.append(pool.submit(send, t0 + offset))
        samples = [f.result() for f in futures]  # each bounded by the request timeout
    for connection in connections:
        connection.close()
    return samples


def v2_json(
    images: list[bytes], outputs: Iterable[str] = (), name: str = "images", shape=None
) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 JSON body of ``images``, base64 in the BYTES tensor ``name`` (shape
    ``[n, 1]`` unless ``shape``), asking for ``outputs``: what ``TorchServeClient.infer``
    sends. Body and headers."""
    tensor = {"name": name, "datatype": "BYTES", "shape": shape or [len(images), 1],
              "data": [base64.b64encode(i).decode() for i in images]}  # fmt: skip
    request = {
        "inputs": [tensor],
        **({"outputs": [{"name": o} for o in outputs]} if outputs else {}),
    }
    return json.dumps(request).encode(), {"Content-Type": "application/json"}


def v2_binary(
    images: list[bytes], outputs: Iterable[str], binary_out: bool = True
) -> tuple[bytes, dict[str, str]]:
    """``images`` as raw bytes in the binary tensor extension's ``images`` tensor [n, 1],
    asking for ``outputs`` as raw bytes too (what ``tsctl embed`` sends) or, without
    ``binary_out``, as JSON. Body and headers."""
    element = bytes_elements(images)
    header = {
        "inputs": [binary_tensor("images", "BYTES", [len(images), 1], len(element))],
        "outputs": [{"name": o, "parameters": {"binary_data": binary_out}} for o in outputs],
    }
    return binary_body(header, element)
