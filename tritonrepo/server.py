"""Run Triton on a model repository, on loopback, and stop it cleanly.

    python -m tritonrepo.server [--repository build/triton]     # make serve-triton

The one place that knows how the wheel's ``tritonserver`` must be started: the Python backend
stub's interpreter found through ``PATH`` (``tritonrepo.install`` says why), the wheel's
libraries and ``libpython`` on ``LD_LIBRARY_PATH``, every endpoint on 127.0.0.1 at the ports of
``tsclient.ports`` (or the ones given), a shared-memory prefix of its own so two servers on one
host do not meet. Ctrl-C or SIGTERM stops it the way Triton stops: in-flight requests finish,
models unload, the stubs exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO

import requests

from tritonrepo.install import TritonInstall
from tsclient import ports

REPO = Path(__file__).resolve().parent.parent
REPOSITORY = REPO / "build" / "triton"
DEFAULT_PORTS = {
    "http": ports.TRITON_HTTP,
    "grpc": ports.TRITON_GRPC,
    "metrics": ports.TRITON_METRICS,
}
EXIT_TIMEOUT = 30  # seconds Triton gives in-flight requests when told to stop


class Triton:
    """One ``tritonserver`` process on ``repository``; ``start`` waits until it is ready
    (every model loaded), ``stop`` ends it and its stubs."""

    def __init__(
        self,
        repository: Path = REPOSITORY,
        *,
        http: int = ports.TRITON_HTTP,
        grpc: int = ports.TRITON_GRPC,
        metrics: int = ports.TRITON_METRICS,
        install: TritonInstall = TritonInstall(),
        log: IO | None = None,
    ) -> None:
        self.repository = Path(repository)
        self.ports = {"http": http, "grpc": grpc, "metrics": metrics}
        self.install = install
        self.log = log
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return ports.url(self.ports["http"])

    @property
    def metrics_url(self) -> str:
        return ports.url(self.ports["metrics"]) + "/metrics"

    def command(self) -> list[str]:
        host = ports.HOST
        return [
            str(self.install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.install.server / 'backends'}",
            f"--cache-directory={self.install.server / 'caches'}",
            f"--http-address={host}",
            f"--http-port={self.ports['http']}",
            f"--grpc-address={host}",
            f"--grpc-port={self.ports['grpc']}",
            f"--metrics-address={host}",
            f"--metrics-port={self.ports['metrics']}",
            # Each stub's shared memory is /dev/shm/<prefix>...: one prefix per server.
            f"--backend-config=python,shm-region-prefix-name=rs{os.getpid()}-{uuid.uuid4().hex[:8]}_",
            f"--exit-timeout-secs={EXIT_TIMEOUT}",
            "--strict-readiness=true",
        ]

    def env(self) -> dict[str, str]:
        """This environment with the Triton venv's ``python3`` first on ``PATH`` (the stub's
        interpreter takes its ``sys.path`` from it) and the libraries the binaries link."""
        env = dict(os.environ)
        env["PATH"] = f"{self.install.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        libs = [str(self.install.libs), self.install.python_libdir()]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        env.pop("PYTHONPATH", None)  # the stub's packages are the model folder's own
        return env

    def start(self, timeout: float = 300.0) -> Triton:
        self.install.check()
        self.process = subprocess.Popen(
            self.command(),
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT if self.log else None,
            start_new_session=True,
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float = EXIT_TIMEOUT + 15) -> int | None:
        """SIGTERM (Triton's own graceful stop), SIGKILL to the process group after ``grace``
        seconds; the exit code (None if it had to be killed)."""
        if self.process is None:
            return None
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            return process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
            return None

    def __enter__(self) -> Triton:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait(self) -> int:
        """Until Triton exits on its own; its exit code."""
        if self.process is None:
            raise RuntimeError("Triton was not started")
        return self.process.wait()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None:
                raise RuntimeError("Triton was not started")
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"tritonserver exited with {code} before it was ready (its log says why)"
                )
            try:
                if requests.get(self.url + "/v2/health/ready", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"Triton not ready at {self.url} after {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=REPOSITORY)
    for name, port in DEFAULT_PORTS.items():
        parser.add_argument(f"--{name}-port", type=int, default=port)
    args = parser.parse_args(argv)
    triton = Triton(
        args.repository, http=args.http_port, grpc=args.grpc_port, metrics=args.metrics_port
    )
    # SIGTERM as Ctrl-C: one path that stops Triton and waits for it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        triton.start()
        print(
            f"Triton ready: {triton.url}/v2 (gRPC {ports.HOST}:{args.grpc_port}, metrics "
            f"{triton.metrics_url}); Ctrl-C stops it",
            file=sys.stderr,
        )
        triton.wait()
        return 1  # it stopped on its own: its log says why
    except KeyboardInterrupt:
        print("stopping Triton", file=sys.stderr)
        code = triton.stop()
        return 0 if code == 0 else 1
    finally:
        triton.stop()


if __name__ == "__main__":
    raise SystemExit(main())
