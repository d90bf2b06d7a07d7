"""HTTP load against one ``/predictions/{model}`` URL: closed-loop clients and open-loop
Poisson arrivals. Loopback only; every loop is bounded by a duration *and* a request count.

Each function returns the raw ``Sample`` list; ``bench.stats.summarize`` turns it into numbers.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from bench.stats import Sample
from serveshared.wire import BATCH_HEADER

REQUEST_ID_HEADER = "x-request-id"  # set by TorchServe's frontend on every response


@dataclass(frozen=True)
class Endpoint:
    """Where and what to POST: the raw image bytes as the body, with the auth header."""

    url: str
    headers: dict[str, str]
    body: bytes
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        host = urlsplit(self.url).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the benchmark only talks to loopback, not {host!r}")


class Connection:
    """One keep-alive HTTP/1.1 connection per client thread, on ``http.client``.

    The load generator shares the cores with the server under test, so it should cost as
    little CPU as possible: ``http.client`` spends a fraction of what ``requests`` does per
    call. A broken connection is reopened on the next request."""

    def __init__(self, endpoint: Endpoint) -> None:
        parts = urlsplit(endpoint.url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path
        self.timeout = endpoint.timeout_s
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", self.path, body=body, headers=headers)
            response = self.conn.getresponse()
            response.read()  # the whole answer counts in the latency, and frees the connection
            return response.status, {k.lower(): v for k, v in response.getheaders()}
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def post_once(connection: Connection, endpoint: Endpoint, start: float | None = None) -> Sample:
    """One request. ``start`` (monotonic) defaults to now; any non-200 or exception is an
    error sample, never raised."""
    start = time.monotonic() if start is None else start
    try:
        status, headers = connection.post(endpoint.body, endpoint.headers)
    except (OSError, http.client.HTTPException) as exc:
        return Sample(start, time.monotonic(), False, type(exc).__name__)
    end = time.monotonic()
    request_id = headers.get(REQUEST_ID_HEADER, "")
    if status != 200:
        return Sample(start, end, False, f"HTTP {status}", request_id=request_id)
    batch = headers.get(BATCH_HEADER.lower())
    return Sample(
        start,
        end,
        True,
        batch_size=int(batch) if batch and batch.isdigit() else None,
        request_id=request_id,
    )


def closed_loop(
    endpoint: Endpoint, clients: int, duration_s: float, max_requests: int
) -> list[Sample]:
    """``clients`` threads, each sending its next request when the previous answer arrives,
    until ``duration_s`` has passed or ``max_requests`` have been sent in total."""
    samples: list[Sample] = []
    lock = threading.Lock()
    sent = 0
    deadline = time.monotonic() + duration_s

    def client() -> None:
        nonlocal sent
        connection = Connection(endpoint)
        try:
            while time.monotonic() < deadline:
                with lock:
                    if sent >= max_requests:
                        return
                    sent += 1
                sample = post_once(connection, endpoint)
                with lock:
                    samples.append(sample)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        # A request can outlive the deadline by at most its own timeout.
        thread.join(timeout=duration_s + endpoint.timeout_s + 5)
    with lock:
        return list(samples)


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
    """Send requests at Poisson arrival times regardless of answers (an open system).

    Latency runs from each request's *scheduled* time: when all ``max_in_flight`` client
    threads are busy, the wait for one is the server's fault and is counted (no coordinated
    omission)."""
    schedule = poisson_schedule(rate, duration_s, max_requests, seed)
    local = threading.local()
    connections: list[Connection] = []
    connections_lock = threading.Lock()

    def send(scheduled: float) -> Sample:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = Connection(endpoint)
            with connections_lock:
                connections.append(connection)
        return post_once(connection, endpoint, start=scheduled)

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="open-loop") as pool:
        futures = []
        for offset in schedule:
            delay = t0 + offset - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(send, t0 + offset))
        samples = [f.result() for f in futures]  # each bounded by the request timeout
    for connection in connections:
        connection.close()
    return samples
