"""The client and tsctl without a server: name checks, key files, error mapping, key rotation
with retry-once, exit codes, the metrics summary."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import ClassVar

import pytest
import requests

from devtools.server import free_port
from serveclient import cli, errors, metrics
from serveclient.client import MAX_NAME, TorchServeClient, check_archive, check_name, connect
from serveclient.engine import Engine, detect
from serveclient.progress import waiting
from serveshared import ports
from serveshared.keys import Keys
from serveshared.v2binary import HEADER_LENGTH
from tests.conftest import REPO


def _key_file(path, inference="inf-1", management="man-1", minutes=60):
    expires = (datetime.now(timezone.utc) + timedelta(minutes=minutes)).isoformat()
    path.write_text(
        json.dumps(
            {
                "management": {
                    "key": management,
                    "expiration time": expires.replace("+00:00", "Z"),
                },
                "inference": {"key": inference, "expiration time": expires.replace("+00:00", "Z")},
                "API": {"key": "api-1"},
            }
        )
    )
    return path


def _response(status: int, body: dict | list | str = "") -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = (body if isinstance(body, str) else json.dumps(body)).encode()
    return response


@pytest.mark.parametrize("name", ["resnet50-tagger", "a", "v2.0", "A_b-c.1", "x" * MAX_NAME])
def test_routable_names_pass(name):
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a/b",
        "../../x",
        "..",
        "a..b",
        "-lead",
        ".hidden",
        "sp ace",
        "x" * (MAX_NAME + 1),
        "a%2Fb",
        "ünï",
    ],
)
def test_unroutable_names_are_refused_with_the_rule(name):
    with pytest.raises(errors.UsageError) as refused:
        check_name(name)
    assert "cannot be routed" in refused.value.message
    assert "letters, digits" in refused.value.hint


def test_archive_paths_are_refused_and_urls_left_to_the_server():
    with pytest.raises(errors.UsageError) as refused:
        check_archive("/etc/passwd")
    assert "copy it into the server's model store" in refused.value.hint
    assert "tsctl register passwd" in refused.value.hint
    for url in ("file:///etc/passwd", "http://127.0.0.1:8082/metrics", "HTTPS://x/y.mar"):
        assert check_archive(url) == url
    assert check_archive("resnet50-tagger-2.0.mar") == "resnet50-tagger-2.0.mar"


def test_client_and_tsctl_default_to_the_same_ports(monkeypatch):
    for name in (
        "TSCTL_INFERENCE_URL",
        "TSCTL_MANAGEMENT_URL",
        "TSCTL_METRICS_URL",
        "TSCTL_KEY_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    args = cli.parser().parse_args(["list"])
    client = TorchServeClient()
    expected = {
        "inference": f"http://127.0.0.1:{ports.INFERENCE}",
        "management": f"http://127.0.0.1:{ports.MANAGEMENT}",
        "metrics": f"http://127.0.0.1:{ports.METRICS}",
    }
    assert client.urls == expected
    made = cli.make_client(args)  # without --url: the local TorchServe, asked nothing
    assert made.urls == expected and made.key_file == client.key_file
    assert made.engine is Engine.TORCHSERVE


def test_key_file_expiry_is_read(tmp_path):
    keys = Keys.read(_key_file(tmp_path / "key_file.json", minutes=30))
    assert (keys.inference, keys.management, keys.api) == ("inf-1", "man-1", "api-1")
    left = (keys.inference_expires - datetime.now(timezone.utc)).total_seconds()
    assert 29 * 60 < left <= 30 * 60
    assert not keys.expired("inference") and keys.expired("inference", margin_s=31 * 60)


def test_a_key_file_caught_mid_rewrite_is_read_again(tmp_path, monkeypatch):
    """TorchServe rotates by truncating key_file.json and writing it anew: a reader between
    the two sees an empty or half-written file and must read again, not fail."""
    key_file = _key_file(tmp_path / "key_file.json")
    whole = key_file.read_text()
    torn = ["", whole[: len(whole) // 2]]  # what the first two reads see
    real_read = Path.read_text
    monkeypatch.setattr(
        Path, "read_text", lambda self, *a, **k: torn.pop(0) if torn else real_read(self, *a, **k)
    )
    assert Keys.read(key_file).inference == "inf-1"
    assert not torn  # both torn reads were served and read past
    monkeypatch.undo()
    key_file.write_text(whole[:40])  # broken for good: an error with a hint, soon
    with pytest.raises(errors.KeyFileError) as broken:
        Keys.read(key_file, settle_s=0.1)
    assert "token authorization" in broken.value.hint


def test_missing_key_file_says_where_it_comes_from(tmp_path):
    with pytest.raises(errors.KeyFileError) as missing:
        Keys.read(tmp_path / "key_file.json")
    assert "folder it was started from" in missing.value.hint


@pytest.mark.parametrize(
    ("status", "body", "kind", "hint"),
    [
        (
            404,
            {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: x"},
            errors.NotFound,
            "tsctl list",
        ),
        (
            404,
            {
                "code": 404,
                "type": "ModelNotFoundException",
                "message": "Given URL file:///etc/passwd does not match any allowed URL(s)",
            },
            errors.Refused,
            "allowed_urls",
        ),
        (
            403,
            {
                "code": 403,
                "type": "InvalidModelVersionException",
                "message": "Cannot remove default version for model m",
            },
            errors.Refused,
            "tsctl set-default",
        ),
        (
            400,
            {"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed"},
            errors.KeyRejected,
            "key_file.json",
        ),
        (
            503,
            {"code": 503, "type": "ServiceUnavailableException", "message": "no worker"},
            errors.ApiError,
            "retry later",
        ),
        # Triton's own answers: {"error": text}.
        (
            503,
            {"error": "[request id: <id_unknown>] Exceeds maximum queue size"},
            errors.ApiError,
            "max_queue_size",
        ),
        (
            403,
            {"error": "This API is restricted, expecting header 'Authorization'"},
            errors.KeyRejected,
            "--new-keys",
        ),
    ],
)
def test_error_answers_map_to_one_error_each(status, body, kind, hint):
    error = errors.from_response(_response(status, body), "do it")
    assert type(error) is kind and error.status == status and hint in error.hint


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (500, "Stub process 'resnet50-tagger_0_0' is not healthy."),
        (404, "Request for unknown model: 'resnet50-tagger' has no available versions"),
    ],
)
def test_a_triton_model_whose_process_is_down_reads_as_a_retryable_503(status, message):
    """Triton's answers while a dead stub's model is down or loading again, as a client and
    the transformer (tests/test_transformer.py) read them; any other 500 or 404 is not one."""
    error = errors.from_response(_response(status, {"error": message}), "infer m")
    assert (error.status, error.type) == (503, "ModelUnavailable")  # a bulk job retries a 503
    other = errors.from_response(_response(status, {"error": "something else"}), "infer m")
    assert other.status == status


def test_tritons_error_answers_read_as_the_cores():
    """Triton's HTTP frontend answers ``{"error": "<message>"}``; this project's models put
    the core's JSON body in the message, Triton's own errors are plain text."""
    core = {"code": 400, "type": "InvalidImage", "message": "image 1 of 1: not an image"}
    error = errors.from_response(_response(400, {"error": json.dumps(core)}), "infer m")
    assert (error.status, error.type, error.server_message) == (
        400,
        "InvalidImage",
        "infer m: image 1 of 1: not an image",
    )
    plain = errors.from_response(
        _response(400, {"error": "unexpected inference input 'x'"}), "infer m"
    )
    assert (plain.type, plain.server_message) == ("", "infer m: unexpected inference input 'x'")
    not_found = errors.from_response(_response(404, {"error": "Not Found"}), "register x")
    assert not_found.message == "HTTP 404: register x: Not Found"


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("3", 3.0), ("soon", None), (None, None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)
def test_a_503_carries_its_retry_after_in_seconds(header, seconds):
    response = _response(503, {"code": 503, "type": "Overloaded", "message": "busy"})
    if header is not None:
        response.headers["Retry-After"] = header
    assert errors.from_response(response, "infer").retry_after == seconds


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_slow_call_shows_its_label_and_elapsed_time_on_a_terminal_only():
    def refused():
        raise errors.ApiError(503, "ServiceUnavailableException", "no worker")

    terminal, log = _Terminal(), io.StringIO()
    assert waiting("registering x.mar", lambda: 42, stream=terminal) == 42
    assert "registering x.mar waiting 00:00" in terminal.getvalue()
    assert terminal.getvalue().endswith("\n")  # the next output starts on its own line
    assert waiting("scaling m", lambda: "ok", stream=log) == "ok" and log.getvalue() == ""
    with pytest.raises(errors.ApiError, match="no worker"):
        waiting("scaling m", refused, stream=terminal)


class FakeServer:
    """Stands in for ``TorchServeClient._send``: refuses keys that are not current, rotates
    the key file on ``/token`` as TorchServe does."""

    def __init__(self, key_file, expired: set[str]):
        self.key_file, self.expired, self.calls = key_file, expired, []

    def __call__(self, method, port, path, params, auth, **kwargs):
        self.calls.append((method, path, auth.get("Authorization")))
        if path == "/token":
            data = json.loads(self.key_file.read_text())
            data[params["type"]]["key"] = data[params["type"]]["key"] + "-rotated"
            self.key_file.write_text(json.dumps(data))
            return _response(200, "\n")
        token = auth.get("Authorization", "").removeprefix("Bearer ")
        if token in self.expired:
            return _response(
                400,
                {
                    "code": 400,
                    "type": "InvalidKeyException",
                    "message": "Token Authorization failed.",
                },
            )
        return _response(200, {"models": [{"modelName": "m", "modelUrl": "m.mar"}]})


def test_an_expired_key_is_rotated_once_and_the_call_retried(tmp_path):
    key_file = _key_file(tmp_path / "key_file.json")
    client = TorchServeClient(key_file=key_file)
    client._send = fake = FakeServer(key_file, expired={"man-1"})
    assert client.list_models() == [{"modelName": "m", "modelUrl": "m.mar"}]
    assert [c[1:] for c in fake.calls] == [
        ("/models", "Bearer man-1"),
        ("/token", "Bearer api-1"),
        ("/models", "Bearer man-1-rotated"),
    ]
    assert Keys.read(key_file).management == "man-1-rotated" and client.rotations == 1


def test_a_key_still_refused_after_rotation_is_an_error_not_a_loop(tmp_path):
    key_file = _key_file(tmp_path / "key_file.json")
    client = TorchServeClient(key_file=key_file)
    client._send = fake = FakeServer(key_file, expired={"man-1", "man-1-rotated"})
    with pytest.raises(errors.KeyRejected):
        client.list_models()
    assert len(fake.calls) == 3


def test_a_key_rotated_by_someone_else_is_picked_up_without_rotating(tmp_path):
    key_file = _key_file(tmp_path / "key_file.json")
    client = TorchServeClient(key_file=key_file)
    fake = FakeServer(key_file, expired={"man-1"})

    def rotated_meanwhile(*args, **kwargs):
        answer = fake(*args, **kwargs)
        if len(fake.calls) == 1:
            _key_file(key_file, management="man-2")
        return answer

    client._send = rotated_meanwhile
    client.list_models()
    assert [c[2] for c in fake.calls] == ["Bearer man-1", "Bearer man-2"]
    assert client.rotations == 0


def _tsctl(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _tsctl_at(capsys, tmp_path, port: int, *argv: str):
    """``_tsctl`` against the management API at 127.0.0.1:``port`` with a key file of its own."""
    url, keys = f"http://127.0.0.1:{port}", str(_key_file(tmp_path / "k.json"))
    return _tsctl(capsys, "--management-url", url, "--key-file", keys, *argv)


def test_tsctl_without_a_server_says_how_to_start_one(capsys, tmp_path):
    port = free_port()
    code, _, err = _tsctl_at(capsys, tmp_path, port, "list")
    assert code == errors.ServerNotRunning.exit_code == 3
    assert f"no TorchServe answers at http://127.0.0.1:{port}" in err and "make serve" in err


def test_tsctl_without_a_key_file_exits_4(capsys, tmp_path):
    code, out, err = _tsctl(capsys, "--json", "--key-file", str(tmp_path / "none.json"), "list")
    assert code == 4 and "no key file" in json.loads(out)["error"] and "hint:" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["describe", "../../x"],
        ["scale", "a/b", "--min", "1"],
        ["unregister", "resnet50-tagger", "1/2"],
        ["register", "/etc/passwd"],
        ["register", "x.mar", "--name", "../x"],
    ],
)
def test_tsctl_refuses_unroutable_names_before_sending(capsys, tmp_path, argv):
    port = free_port()  # nothing listens: a request would exit 3, not 2
    code, _, err = _tsctl_at(capsys, tmp_path, port, *argv)
    assert code == 2 and "hint:" in err


def test_metrics_summary_from_prometheus_text():
    text = "\n".join(
        [
            "# HELP resnet50_batches_total x",
            "# TYPE resnet50_batches_total counter",
            'resnet50_batches_total{model="m",engine="torchserve",Hostname="h",} 4.0',
            'resnet50_requests_total{model="m",engine="torchserve",Hostname="h",} 22.0',
            'resnet50_images_total{model="m",engine="torchserve",Hostname="h",} 21.0',
            'resnet50_batches_by_size_total{model="m",engine="torchserve",batch_size="16",'
            'Hostname="h",} 1.0',
            'resnet50_batches_by_size_total{model="m",engine="torchserve",batch_size="2",'
            'Hostname="h",} 3.0',
            'resnet50_errors_total{model="m",engine="torchserve",error_type="InvalidImage",'
            'Hostname="h",} 1.0',
            'resnet50_decode_ms_total{model="m",engine="torchserve",Hostname="h",} 42.0',
            'resnet50_forward_ms_total{model="m",engine="torchserve",Hostname="h",} 400.0',
            'ts_inference_requests_total{model_name="m",model_version="default",'
            'hostname="h",} 22.0',
            'ts_inference_latency_microseconds{model_name="m",model_version="default",'
            'hostname="h",} 2200000.0',
            'Requests2XX{Level="Host",Hostname="h",} 21.0',
            'Requests4XX{Level="Host",Hostname="h",} 1.0',
        ]
    )
    assert metrics.frontend_statuses(text) == {"2XX": 21, "4XX": 1, "5XX": 0}
    assert metrics.summarise(text) == {
        "m": {
            "batches": 4,
            "requests_in_batches": 22,
            "images": 21,
            "mean_batch_size": 5.5,
            "batch_sizes": {"2": 3, "16": 1},
            "errors": {"InvalidImage": 1},
            "decode_ms_per_image": 2.0,
            "forward_ms_per_batch": 100.0,
            "requests": 22,
            "mean_latency_ms": 100.0,
        }
    }


def test_counters_read_the_same_with_or_without_type_lines():
    """TorchServe declares its counters (``# TYPE ... counter``), ours named with ``_total``,
    its own without; prometheus_client adds ``_total`` where it is missing. Either way a counter
    goes by one name."""
    typed = (
        "# TYPE resnet50_batches_total counter\n"
        'resnet50_batches_total{model="m",engine="torchserve",Hostname="h",} 4.0\n'
        "# TYPE ts_inference_requests_total counter\n"
        'ts_inference_requests_total{model_name="m",model_version="default",} 22.0\n'
        "# TYPE resnet50_batch_size histogram\n"
        'resnet50_batch_size_sum{model="m",} 22.0\n'
    )
    assert [(s.name, s.value) for s in metrics.samples(typed)] == [
        ("resnet50_batches", 4.0),
        ("ts_inference_requests", 22.0),
        ("resnet50_batch_size_sum", 22.0),
    ]
    assert [s.name for s in metrics.samples(typed.replace("# TYPE", "# X"))] == [
        "resnet50_batches",
        "ts_inference_requests",
        "resnet50_batch_size_sum",
    ]


@pytest.mark.parametrize(
    "cut",
    [
        len('resnet50_batches_total{model="m",Lev'),
        len('resnet50_batches_total{model="m",engine="torchserve",} '),
    ],
)
def test_a_scrape_cut_short_is_a_clear_error(cut):
    line = 'resnet50_batches_total{model="m",engine="torchserve",} 4.0\n'
    text = "# TYPE resnet50_batches_total counter\n" + line + line[:cut]
    with pytest.raises(errors.MetricsUnreadable, match=r"ends mid-line .* cut short") as caught:
        metrics.summarise(text)
    assert caught.value.exit_code == 1 and "read it again" in caught.value.hint
    with pytest.raises(errors.MetricsUnreadable, match="not Prometheus text format"):
        metrics.samples("<html>502 Bad Gateway</html>\n")


class _Recorder(__import__("http.server").server.BaseHTTPRequestHandler):
    """Answers every GET with ``{"status": "Healthy"}`` and records what it was asked."""

    seen: ClassVar[list] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"status": "Healthy"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(seen: list):
    import http.server
    import threading

    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_keys_to_a_loopback_server_never_go_through_a_proxy(tmp_path, monkeypatch):
    """HTTP_PROXY set (and no NO_PROXY): a loopback server is called directly, the proxy sees
    nothing; a remote host still goes through the proxy (requests' default)."""
    to_server, to_proxy = [], []
    server, proxy = _serve(to_server), _serve(to_proxy)
    try:
        proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
            monkeypatch.setenv(name, proxy_url)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = TorchServeClient(url, url, url, key_file=_key_file(tmp_path / "k.json"))
        assert client.health() == {"status": "Healthy"}
        assert to_server == [("/ping", "Bearer inf-1")] and to_proxy == []
        remote = TorchServeClient(
            "http://ts.example.invalid:8080", url, url, key_file=_key_file(tmp_path / "k.json")
        )
        assert remote.health() == {"status": "Healthy"}  # answered by the "proxy"
        assert to_proxy == [("http://ts.example.invalid:8080/ping", "Bearer inf-1")]
    finally:
        server.shutdown()
        proxy.shutdown()


def test_the_engine_is_asked_once_without_a_key():
    """``connect``: Triton's server metadata names it (tests/test_triton.py); anything else at
    ``/v2`` is TorchServe; no key goes out before the engine is known."""
    seen = []
    server = _serve(seen)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = connect(url, keys=Keys("inf", "mgmt"))
        assert client.engine is Engine.TORCHSERVE and client.engine is Engine.TORCHSERVE
        assert seen == [("/v2", None)]
    finally:
        server.shutdown()
    with pytest.raises(errors.ServerNotRunning):
        detect(f"http://127.0.0.1:{free_port()}")


def test_each_port_keeps_its_session_and_connect_verifies_them_all(monkeypatch, tmp_path):
    """A loopback port's calls skip the proxy, a remote one's keep it (chosen per URL, not per
    call); ``connect``'s CA bundle holds for the detection and every later call."""
    client = TorchServeClient(
        "https://127.0.0.1:8443",
        "https://ts.example.invalid:8444",
        "http://[::1]:8082",
        key_file=_key_file(tmp_path / "k.json"),
    )
    assert {port: s.trust_env for port, s in client._sessions.items()} == {
        "inference": False,
        "management": True,
        "metrics": False,
    }
    asked = []
    monkeypatch.setattr(
        "serveclient.client.detect",
        lambda url, session: asked.append((session.trust_env, session.verify)) or Engine.TRITON,
    )
    triton = connect("https://127.0.0.1:8000", keys=Keys("inf", "mgmt"), verify="ca.pem")
    assert asked == [(False, "ca.pem")]
    assert [triton._sessions[port].verify for port in ("inference", "management")] == [
        "ca.pem",
        "ca.pem",
    ]
    assert not triton._sessions["inference"].trust_env


def test_tritons_own_series_are_summarised_per_model():
    """``tsctl metrics --url`` on Triton: its nv_inference_* counters per model."""
    from serveclient import triton

    text = "".join(
        f'# TYPE {name} counter\n{name}{{model="m",{labels}version="1"}} {value}\n'
        for name, labels, value in (
            ("nv_inference_request_success", "", 4),
            ("nv_inference_request_failure", 'reason="REJECTED",', 2),
            ("nv_inference_count", "", 12),
            ("nv_inference_exec_count", "", 3),
            ("nv_inference_request_duration_us", "", 80000),
            ("nv_inference_queue_duration_us", "", 20000),
            ("nv_inference_compute_infer_duration_us", "", 40000),
        )
    )
    assert triton.summarise(text + "# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization 0.5\n") == {
        "m": {
            "requests": 4,
            "failed": {"REJECTED": 2},
            "images": 12,
            "batches": 3,
            "mean_batch_images": 4.0,
            "mean_latency_ms": 20.0,
            "mean_queue_ms": 5.0,
            "compute_ms_per_request": 10.0,
        }
    }
    assert triton.metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8002"
    assert triton.metrics_url("https://[::1]:9000/x") == "https://[::1]:8002"


# ------------------------------------------------------------------ class, deadline, cache


class _Wire:
    """Stands in for ``TorchServeClient._send``: records what goes out (headers, v2 body) and
    answers each image with a 2-number embedding, ``headers`` and ``outputs`` added."""

    def __init__(self, headers: dict | None = None, cached: list[bool] | None = None):
        self.sent: list[dict] = []
        self.headers, self.cached = headers or {}, cached

    def __call__(self, method, port, path, params, auth, headers=None, **kwargs):
        data, length = kwargs.get("data") or "{}", (headers or {}).get(HEADER_LENGTH)
        body = json.loads(data if length is None else data[: int(length)])  # the JSON header
        self.sent.append({"path": path, "headers": headers or {}, "body": body})
        if method == "GET":  # Triton's model metadata: which outputs the model has
            return _response(200, {"outputs": [{"name": "embedding"}, {"name": "cached"}]})
        if "instances" in body:
            predictions = [{"embedding": [1.0, 2.0]} for _ in body["instances"]]
            answer = _response(200, {"predictions": predictions})
        else:
            n = body["inputs"][0]["shape"][0]
            outputs = [{"name": "embedding", "shape": [n, 2], "data": [1.0, 2.0] * n}]
            if self.cached is not None:
                outputs.append({"name": "cached", "shape": [n, 1], "data": self.cached})
            answer = _response(200, {"outputs": outputs})
        answer.headers.update(self.headers)
        return answer


def _clients(wire: _Wire) -> dict[str, TorchServeClient]:
    from serveclient.triton import TritonClient

    ours = TorchServeClient(keys=Keys("inf", "mgmt"), engine=Engine.TORCHSERVE)
    theirs = TritonClient("http://127.0.0.1:8000")
    for client in (ours, theirs):
        client._send = wire
    return {"torchserve": ours, "triton": theirs}


def test_a_bulk_request_with_a_deadline_in_each_engines_words():
    """TorchServe: ``X-Priority``/``X-Deadline`` headers and v2's ``priority``; Triton: v2's
    ``priority`` and ``timeout`` (microseconds left, by the injected clock), headers too."""
    from serveclient.traffic import Traffic

    wire = _Wire()
    clients = _clients(wire)
    traffic = Traffic.within("bulk", deadline_ms=250, clock=lambda: 1764067200.0)
    assert traffic.deadline == 1764067200.25
    for client in clients.values():
        client.infer("m", [b"a", b"b"], traffic=traffic)
    ours, theirs = wire.sent[0], wire.sent[-1]
    expected_headers = {"X-Priority": "bulk", "X-Deadline": "1764067200.250"}
    assert ours["headers"].items() >= expected_headers.items()
    assert ours["body"]["parameters"] == {"priority": 2}
    assert theirs["headers"].items() >= expected_headers.items()
    assert theirs["body"]["parameters"] == {"priority": 2, "timeout": 250_000}
    # Plain and v1 requests have no parameters: the headers alone.
    clients["torchserve"].infer("m", [b"a"], protocol="v1", traffic=traffic)
    assert wire.sent[-1]["headers"].items() >= expected_headers.items()
    assert "parameters" not in wire.sent[-1]["body"] or not wire.sent[-1]["body"]["parameters"]


def test_a_deadline_already_past_still_expires_on_triton():
    """Triton reads ``timeout: 0`` as "none": a deadline gone by is sent as 1 µs."""
    from serveclient.traffic import Traffic

    wire = _Wire()
    past = Traffic("interactive", deadline=1000.0, clock=lambda: 1001.0)
    _clients(wire)["triton"].infer("m", [b"a"], traffic=past)
    assert wire.sent[-1]["body"]["parameters"] == {"priority": 1, "timeout": 1}


def test_a_plain_request_says_nothing_of_class_or_deadline():
    wire = _Wire()
    for client in _clients(wire).values():
        client.infer("m", [b"a"])
    for sent in wire.sent:
        assert not {"X-Priority", "X-Deadline"} & set(sent["headers"])
        assert "parameters" not in sent["body"]


def test_what_the_client_sends_the_server_parses_back_to_the_same_class_and_moment():
    from serveclient import traffic as client
    from servecore import priority as server

    for name in ("interactive", "bulk"):
        sent = client.Traffic(name, deadline=1764067200.25)
        assert server.parse_priority(sent.headers()["X-Priority"]) is server.Priority[name.upper()]
        parameter = sent.parameters()["priority"]
        assert server.parse_priority(parameter) is server.Priority[name.upper()]
        assert server.parse_deadline(sent.headers()["X-Deadline"]) == 1764067200.25
    with pytest.raises(ValueError, match="bulk"):
        client.Traffic("urgent")


def test_only_triton_is_sent_the_microseconds_left_as_its_timeout_parameter():
    from serveclient import traffic
    from serveclient.triton import TritonClient

    sent = traffic.Traffic("bulk", deadline=100.5, clock=lambda: 100.0)
    assert TritonClient.SENDS_TIMEOUT and not TorchServeClient.SENDS_TIMEOUT
    assert sent.parameters(timeout=True) == {"priority": 2, "timeout": 500_000}
    assert sent.parameters() == {"priority": 2}
    expired = traffic.Traffic(deadline=99.0, clock=lambda: 100.0)
    assert expired.parameters(timeout=True) == {"timeout": 1}  # 0 would mean "none" to Triton


@pytest.mark.parametrize(
    ("header", "cached", "hits"),
    [
        (None, (False, False, False), 0),  # the cache is off: no header
        ("0", (False, False, False), 0),
        ("3", (True, True, True), 3),
        ("1", (None, None, None), 1),  # one of three: which one is not said
    ],
)
def test_torchserve_cache_hits_per_image(header, cached, hits):
    wire = _Wire(headers={"X-Cache-Hits": header} if header is not None else {})
    answers = _clients(wire)["torchserve"].infer_answers("m", [b"a", b"b", b"c"])
    assert (answers.cached, answers.cache_hits) == (cached, hits)


def test_triton_names_its_cached_images():
    wire = _Wire(cached=[True, False])
    answers = _clients(wire)["triton"].infer_answers("m", [b"a", b"b"])
    assert (answers.cached, answers.cache_hits) == ((True, False), 1)
    asked = [o["name"] for o in wire.sent[-1]["body"]["outputs"]]
    assert asked == ["embedding", "precision", "cached"]


class _TaggingServer:
    """Stands in for a client reached by ``--url``: describes nothing, tags every image with
    one class, computed in ``precision``."""

    urls: ClassVar[dict] = {"inference": "http://example.invalid"}
    bytes_sent = 0  # Client's count of request bodies: nothing goes on a wire here
    reaches_management = False  # a TorchServe behind KServe: no describe

    def __init__(self, precision: str):
        self.precision = precision

    def describe(self, model, version=None, customized=False):
        raise errors.NotFound(404, "NotFound", f"no describe here: {model}")

    def infer_answers(self, model, images, **kwargs):
        from serveclient.client import Answers

        tag = {"label": "tabby", "index": 281, "probability": 0.9}
        return Answers([[tag] for _ in images], self.precision)


def tag_apart(server, args):
    """``tsctl tag`` in this process, on a thread of its own: a bulk job leaves its thread
    under SCHED_IDLE for good, which would slow every test after it in the same process."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(cli.batch.cmd_tag, server, args).result()


def test_tag_json_says_the_precision_of_each_answer(tmp_path):
    """``tsctl --json tag`` keeps each file's list of tags and names in every tag the precision
    the answer came with, as the Parquet rows record it."""
    photos = [tmp_path / f"p{i}.jpg" for i in range(2)]
    for photo in photos:
        photo.write_bytes(b"bytes the fake does not read")
    args = cli.parser().parse_args(
        ["tag", *map(str, photos), "--url", "http://example.invalid", "--preprocess", "server"]
    )
    data, text, code = tag_apart(_TaggingServer("bf16"), args)
    assert code == 0 and list(data) == [str(p) for p in photos]
    for tags in data.values():
        assert tags == [{"label": "tabby", "index": 281, "probability": 0.9, "precision": "bf16"}]
    assert text.splitlines()[0] == f"{photos[0]}: tabby 0.900"


class _DescribingServer(_TaggingServer):
    """A Triton reached by ``--url``: it describes each model (our preprocessing recipe) over
    its inference API, and answers crops made here."""

    reaches_management = True

    def __init__(self, precision: str):
        super().__init__(precision)
        self.crops: list = []

    def describe(self, model, version=None, customized=False):
        from model_files.recipe import PREPROCESSING

        return [{"modelName": model, "customizedMetadata": {"preprocessing": PREPROCESSING}}]

    def infer_crops(self, model, crops, **kwargs):
        self.crops.append(crops.shape)
        return self.infer_answers(model, list(crops))


def test_tag_preprocesses_here_for_a_server_that_describes_by_url(tmp_path):
    """``tsctl tag --url TRITON --preprocess client`` crops by the recipe Triton describes
    (refused as "not described" before: describe was only asked of a management API)."""
    from PIL import Image

    photo = tmp_path / "p.jpg"
    Image.new("RGB", (320, 240), (200, 120, 40)).save(photo)
    args = cli.parser().parse_args(
        ["tag", str(photo), "--url", "http://example.invalid", "--preprocess", "client"]
    )
    server = _DescribingServer("f32")
    data, _, code = tag_apart(server, args)
    assert code == 0 and server.crops == [(1, 224, 224, 3)]
    assert data[str(photo)][0]["label"] == "tabby"


@pytest.mark.parametrize("command", ["register", "scale", "set-default", "unregister", "keys"])
def test_only_torchserves_client_manages(command):
    """TorchServe's management commands live on its client alone; tsctl asks whether a client
    manages, and Triton's refuses before anything is sent, saying what to do instead."""
    from serveclient.base import Client
    from serveclient.cli.common import managing
    from serveclient.triton import TritonClient

    assert not {"register", "scale", "set_default", "unregister", "rotate"} & set(vars(Client))
    torchserve = TorchServeClient(keys=Keys("i", "m"))
    assert managing(torchserve, command) is torchserve
    with pytest.raises(errors.NotOnTriton, match=f"not available on Triton: {command}") as refused:
        managing(TritonClient(f"http://127.0.0.1:{free_port()}"), command)
    assert refused.value.hint


def test_the_old_package_name_still_imports_the_same_client_with_a_warning():
    """``tsclient`` (the package's name before issue #50), for one release: its modules are
    ``serveclient``'s own objects, and importing it says what to import instead."""
    script = (
        "import warnings; warnings.simplefilter('always')\n"
        "import tsclient, serveclient, serveclient.torchserve as new\n"
        "from tsclient.torchserve import TorchServeClient\n"
        "from tsclient.errors import ServeError, TsError\n"
        "assert TorchServeClient is new.TorchServeClient, 'two classes'\n"
        "assert tsclient.connect is serveclient.connect and TsError is ServeError\n"
        "assert new.__spec__.name == 'serveclient.torchserve', new.__spec__\n"
        "import tsclient.cli.common as old_common, serveclient.cli.common as new_common\n"
        "assert old_common is new_common, 'a second copy of a deep module'\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "DeprecationWarning: the tsclient package is now serveclient" in run.stderr


def test_the_root_errors_old_name_is_the_same_class_with_a_warning():
    """``TsError``, ``ServeError``'s name before, for one release: what a script catches by it
    is every client error still, and reading it says what to catch instead."""
    import serveclient

    for module in (serveclient, errors):
        with pytest.warns(DeprecationWarning, match="TsError is now ServeError"):
            assert module.TsError is errors.ServeError
    assert issubclass(errors.UsageError, errors.ServeError)


def test_no_module_of_the_repository_imports_the_old_package_name():
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout.split()
    found = [
        name
        for name in tracked
        if not name.startswith("tsclient/")
        and re.search(r"^\s*(from|import) tsclient\b", (REPO / name).read_text(), re.MULTILINE)
    ]
    assert found == []


def test_a_port_handed_out_is_not_handed_out_again_while_its_claim_lasts(tmp_path, monkeypatch):
    """The suite's two pytest processes choose ports seconds before their servers bind them:
    a port ``free_port`` gave one caller is refused to any other until its claim is old."""
    from devtools import server

    monkeypatch.setattr(server, "CLAIMS", tmp_path / "claims")
    first = server.free_port()
    assert not server._claimed(first)  # another caller, now
    claim = tmp_path / "claims" / str(first)
    old = time.time() - server.CLAIM_S - 1
    os.utime(claim, (old, old))
    assert server._claimed(first)  # the claim expired: free again
    assert len(set(server.free_ports())) == len(server.SERVER_PORTS)


class ScalingServer:
    """Stands in for ``TorchServeClient._send`` as TorchServe 0.12 answers a synchronous scale:
    OK at once, while describe shows the new worker UNLOADING for the first ``lagging`` calls
    (its thread has not recorded the state it reported)."""

    def __init__(self, lagging: int):
        self.lagging, self.calls = lagging, []

    def __call__(self, method, port, path, params, auth, **kwargs):
        self.calls.append((method, path))
        if method == "POST":  # a second version registered: 1.0 stays the default
            return _response(
                200, {"status": 'Model "m" Version: 2.0 registered with 1 initial workers'}
            )
        if method == "PUT":
            return _response(200, {"status": "Workers scaled to 2 for model: m"})
        second = "UNLOADING" if self.lagging > 0 else "READY"
        self.lagging -= 1
        workers = [{"status": "READY"}, {"status": second}]
        return _response(200, [{"minWorkers": 2, "workers": workers}])


def test_scale_returns_when_describe_shows_every_worker_ready(tmp_path):
    client = TorchServeClient(key_file=_key_file(tmp_path / "key_file.json"))
    client._send = fake = ScalingServer(lagging=2)
    assert client.scale("m", 2) == {"status": "Workers scaled to 2 for model: m"}
    # Two describes saw the lagging worker, the third both READY, and then it returned.
    assert fake.calls == [("PUT", "/models/m"), *[("GET", "/models/m")] * 3]


def test_scale_says_so_when_a_started_worker_never_becomes_ready(tmp_path, monkeypatch):
    monkeypatch.setattr("serveclient.torchserve.READY_WAIT_S", 0.3)
    client = TorchServeClient(key_file=_key_file(tmp_path / "key_file.json"))
    client._send = ScalingServer(lagging=10**6)
    with pytest.raises(errors.Unhealthy, match=r"m: 1 of 2 workers READY 0 s after"):
        client.scale("m", 2)
    client._send = fake = ScalingServer(lagging=10**6)
    client.scale("m", 0)  # nothing to wait for: no describe
    assert fake.calls == [("PUT", "/models/m")]


def test_register_scales_and_waits_for_the_version_it_registered(tmp_path):
    """The version TorchServe's answer names, not the default (``/models/m`` scales 1.0)."""
    client = TorchServeClient(key_file=_key_file(tmp_path / "key_file.json"))
    client._send = fake = ScalingServer(lagging=1)
    assert client.register("m-2.0.mar", workers=2)["model"] == "m"
    assert fake.calls == [
        ("POST", "/models"),
        ("PUT", "/models/m/2.0"),
        *[("GET", "/models/m/2.0")] * 2,
    ]
    # Without workers: the version's minWorkers as described, READY before it returns.
    # (The first describe reads minWorkers 2 and sees one READY; two more, and both are.)
    client._send = fake = ScalingServer(lagging=2)
    client.register("m-2.0.mar")
    assert fake.calls == [("POST", "/models"), *[("GET", "/models/m/2.0")] * 3]
