"""The frontend under a burst of maximum-size bodies, on a real TorchServe with the shipped
JVM settings (``vmargs`` and ``job_queue_size`` in config/server-base.properties).

Every request of the burst is refused on its own (the handler's 413 for a body over
``max_image_bytes``, 503 beyond the queue, or, once the frontend's direct memory is taken by
bodies still arriving, 507 or a reset connection for that upload), and afterwards the same
frontend and the same workers answer ordinary photos with 200.
"""

from __future__ import annotations

import http.client
import os
import threading
from collections import Counter

import pytest
import requests

from tests.conftest import MODELS, REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# Concurrent uploads, each twice (bounded, loopback only): 12 x 32 MiB in flight fits the
# frontend's 1 GiB of direct memory with room for its worker channels. 24 once starved the
# embedding worker's channel until responseTimeout restarted it (an open point of #16).
CLIENTS = 12
MAX_REQUEST = 32 * 2**20  # max_request_size
REFUSALS = {413, 503, 507}


@pytest.fixture(scope="module")
def server(torchserve):
    """The session's TorchServe: the shipped settings, as the burst needs, and the test itself
    proves it leaves that server answering with the same frontend and workers."""
    return torchserve


def _post(port: int, model: str, body: bytes, headers: dict) -> int | str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        connection.request("POST", f"/predictions/{model}", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        connection.close()


def _pids(ts) -> dict[str, list[int]]:
    client = ts.client()
    return {m: [w["pid"] for w in client.describe(m)[0]["workers"]] for m in MODELS}


def test_a_burst_of_maximum_size_bodies_leaves_the_frontend_answering(server):
    frontend = server.processes()[0].pid
    workers = _pids(server)
    assert "-XX:+ExitOnOutOfMemoryError" in " ".join(server.processes()[0].cmdline())
    body = os.urandom(MAX_REQUEST - 4096)  # just under the frontend's limit
    headers = {**server.keys.inference_headers(), "Content-Type": "application/octet-stream"}
    port = int(server.inference_url.rsplit(":", 1)[1])
    outcomes: Counter = Counter()
    lock = threading.Lock()

    def client(i: int) -> None:
        for _ in range(2):
            status = _post(port, MODELS[i % len(MODELS)], body, headers)
            with lock:
                outcomes[status] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    print(f"\nburst of {2 * CLIENTS} x 32 MiB: {dict(outcomes)}")
    assert sum(outcomes.values()) == 2 * CLIENTS
    assert 200 not in outcomes  # random bytes are never an image
    unexpected = {k: n for k, n in outcomes.items() if isinstance(k, int) and k not in REFUSALS}
    assert not unexpected, outcomes
    assert any(k in REFUSALS for k in outcomes)  # the server answered, not only dropped

    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    for model in MODELS:
        answer = requests.post(
            f"{server.inference_url}/predictions/{model}",
            data=photo,
            headers=server.keys.inference_headers(),
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
    assert server.processes()[0].pid == frontend
    assert _pids(server) == workers  # no worker restarted
