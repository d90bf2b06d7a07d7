"""The preprocessing server (``python -m transformer``) as a local process in front of a
predictor, for the tests and the benchmark: started on a free loopback port, ready when its
model answers ``/v2/models/NAME/ready``, always stopped.

    with LocalTransformer("resnet50-tagger", "127.0.0.1:8080", workdir) as t:
        requests.post(t.url + "/v1/models/resnet50-tagger:predict", json=...)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import requests

from devtools.server import free_port, stop_processes

REPO = Path(__file__).resolve().parent.parent


class LocalTransformer:
    """``model`` (several: comma-separated) served in front of ``predictor`` (HOST:PORT,
    ``protocol`` v2 or grpc-v2); ``extra``: more arguments of ``python -m transformer``. Its
    log: ``workdir/transformer.log``."""

    def __init__(
        self,
        model: str,
        predictor: str,
        workdir: Path,
        protocol: str = "v2",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.model, self.predictor, self.protocol = model, predictor, protocol
        self.log = workdir / "transformer.log"
        self.extra = extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> LocalTransformer:
        command = [
            sys.executable,
            "-m",
            "transformer",
            f"--model_name={self.model}",
            f"--predictor_host={self.predictor}",
            f"--predictor_protocol={self.protocol}",
            f"--http_port={self.port}",
            "--enable_grpc=false",
            "--workers=1",
            *self.extra,
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the transformer exited: {self.log.read_text()[-3000:]}")
            try:
                first = self.model.split(",")[0]
                ready = requests.get(f"{self.url}/v2/models/{first}/ready", timeout=5)
                if ready.status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the transformer was not ready in {timeout} s: {self.log}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            stop_processes({self.process.pid}, grace=15)
        self.process = None

    def __enter__(self) -> LocalTransformer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
