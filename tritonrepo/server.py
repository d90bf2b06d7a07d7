"""Run Triton on a model repository, on loopback, and stop it cleanly.

    python -m tritonrepo.server [--repository build/triton]     # make serve-triton
    python -m tritonrepo.server --new-keys      # fresh keys first (the only way to rotate)

The one place that knows how the wheel's ``tritonserver`` must be started: the Python backend
stub's interpreter found through ``PATH`` (``tritonrepo.install`` says why), the wheel's
libraries and ``libpython`` on ``LD_LIBRARY_PATH``, every endpoint on 127.0.0.1 (or the
``host`` given: ``0.0.0.0`` in a container, whose pod IP is the way in) at the ports of
``serveshared.ports`` (or the ones given), a shared-memory prefix of its own so two servers on one
host do not meet. Ctrl-C or SIGTERM stops it the way Triton stops: in-flight requests finish,
models unload, the stubs exit.

Keys: Triton's restricted APIs demand a header per API group, the value fixed at start. With
a key file, inference and metadata want the inference key and the repository, configuration,
statistics, trace, logging and shared-memory APIs the management key, as ``Authorization:
Bearer KEY`` over HTTP (what TorchServe's token authorization reads, so clients send the same
header to either) and as gRPC metadata ``triton-grpc-protocol-authorization: Bearer KEY``
(Triton prefixes gRPC's). Health stays open (probes) and so do metrics (their own port).
``server_keys`` keeps them in a key file of TorchServe's format (``tsctl --key-file``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import requests

from serveshared import ports
from serveshared.keys import TRITON_KEY_FILE, Keys
from tritonrepo.install import TritonInstall
from tritonrepo.watchdog import Watchdog

REPO = Path(__file__).resolve().parent.parent
REPOSITORY = REPO / "build" / "triton"
DEFAULT_PORTS = {
    "http": ports.TRITON_HTTP,
    "grpc": ports.TRITON_GRPC,
    "metrics": ports.TRITON_METRICS,
}
# Seconds Triton gives in-flight requests, and clients' open connections, when told to stop;
# then it closes them and unloads. In a pod, below the grace period (kserve/triton-runtime).
EXIT_TIMEOUT = 30
ANY_ADDRESS = "0.0.0.0"
KEY_FILE = REPO / TRITON_KEY_FILE
# Triton's API groups (its RESTRICTED_CATEGORY_NAMES) by the key each wants; "health" open.
RESTRICTED = {
    "inference": ("inference", "metadata"),
    "management": (
        "model-repository",
        "model-config",
        "statistics",
        "trace",
        "logging",
        "shared-memory",
    ),
}
KEY_HEADER = "Authorization"  # gRPC metadata: triton-grpc-protocol-authorization
# The headers Triton hands the model, as a regular expression (RE2): serveshared.wire's
# PRIORITY_HEADER and DEADLINE_HEADER and the W3C trace context (servecore.tracing), written
# out because the launcher runs without the repository's packages on its path (the KServe
# image); tests/test_triton.py holds them equal.
FORWARDED_HEADERS = "(?i)^(X-Priority|X-Deadline|traceparent|tracestate)$"


def server_keys(path: Path = KEY_FILE, new: bool = False) -> Keys:
    """The keys in ``path``, written first (fresh, mode 0600) when it is missing or ``new``: a
    key file as TorchServe writes one, without an expiry (Triton keeps a key until it
    restarts) or an API key (Triton has no rotation API)."""
    path = Path(path)
    if new or not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(
            {kind: {"key": secrets.token_urlsafe(24)} for kind in RESTRICTED}, indent=2
        )
        fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text + "\n")
        os.replace(path.with_suffix(".tmp"), path)  # a reader never meets it half-written
    return Keys.read(path)


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
        host: str = ports.HOST,
        exit_timeout: int = EXIT_TIMEOUT,
        install: TritonInstall = TritonInstall(),
        log: IO | None = None,
        key_file: Path | None = None,
        watch: bool = True,
    ) -> None:
        """``key_file``: where the keys the restricted APIs demand are kept (``server_keys``:
        written when missing); None: every API open, for a server behind a gate of its own
        (KServe's), but the model-repository API off loopback. ``watch``: a ``Watchdog``
        reloads a model whose stub died, and stops Triton when it cannot."""
        self.repository = Path(repository)
        self.host = host  # every endpoint's address
        self.exit_timeout = exit_timeout
        self.ports = {"http": http, "grpc": grpc, "metrics": metrics}
        self.install = install
        self.log = log
        self.key_file = Path(key_file) if key_file is not None else None
        self.keys: Keys | None = server_keys(self.key_file) if self.key_file is not None else None
        # The model-repository API's key without a key file (only off loopback), this run's.
        self.repository_key = secrets.token_urlsafe(24)
        self.watch = watch
        self.watchdog: Watchdog | None = None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The HTTP endpoint as a client on this host reaches it (loopback for 0.0.0.0)."""
        return ports.url(self.ports["http"], self._reach)

    @property
    def metrics_url(self) -> str:
        return ports.url(self.ports["metrics"], self._reach) + "/metrics"

    @property
    def _reach(self) -> str:
        return ports.HOST if self.host == ANY_ADDRESS else self.host

    def command(self) -> list[str]:
        host = self.host
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
            f"--exit-timeout-secs={self.exit_timeout}",
            "--strict-readiness=true",
            # The generated config.pbtxt is complete: no stub started per model to complete it
            # (one Python process importing the core before each instance's own: 7 s a start).
            "--disable-auto-complete-config",
            # Every model loaded at start, as before, and the repository API's load and unload
            # on: the watchdog reloads a model whose stub died (tritonrepo.watchdog says why).
            "--model-control-mode=explicit",
            "--load-model=*",
            # X-Priority and X-Deadline reach the model as request parameters (HTTP: the name as
            # sent; gRPC metadata: lower case), which the adapter reads as TorchServe's does.
            f"--http-header-forward-pattern={FORWARDED_HEADERS}",
            f"--grpc-header-forward-pattern={FORWARDED_HEADERS}",
            *self._restrictions(),
        ]

    def _restrictions(self) -> list[str]:
        """``--http-restricted-api`` / ``--grpc-restricted-protocol`` (2.51's name for gRPC),
        ``GROUP[,GROUP]:HEADER=VALUE``, one per key. Triton reads no key file: the values are
        on its command line (and so in ``ps`` for this host's users)."""
        if self.keys is not None:
            restricted = {g: f"Bearer {self.keys.key(k)}" for k, g in RESTRICTED.items()}
        elif self.host != ports.HOST:
            # Open APIs off loopback (a pod): load and unload stay the watchdog's alone, since
            # a load may carry model files, i.e. code the Python backend would run.
            restricted = {("model-repository",): f"Bearer {self.repository_key}"}
        else:
            return []
        flags = []
        for groups, value in restricted.items():
            flags += [
                f"--http-restricted-api={','.join(groups)}:{KEY_HEADER}={value}",
                f"--grpc-restricted-protocol={','.join(groups)}:{KEY_HEADER.lower()}={value}",
            ]
        return flags

    def repository_headers(self) -> dict[str, str]:
        """What Triton's model-repository API wants of the watchdog."""
        if self.keys is not None:
            return self.keys.management_headers()
        return {KEY_HEADER: f"Bearer {self.repository_key}"}

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
        if self.watch:
            self.watchdog = Watchdog(
                self.process.pid, self.url, self.repository_headers(), self._give_up
            ).start()
        return self

    def _give_up(self, model: str) -> None:
        """A model that could not be loaded again: stop Triton (Triton's way), so that the
        launcher exits 1 and whatever runs it starts a fresh one."""
        print(f"{model} could not be loaded again: stopping Triton", file=sys.stderr)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM (Triton's own graceful stop), SIGKILL to the process group after ``grace``
        seconds (default: the exit timeout + 15 s to unload); the exit code (None if it had
        to be killed)."""
        grace = self.exit_timeout + 15 if grace is None else grace
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.stop()
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


@contextmanager
def running(repository: Path, log_path: Path, **options: Any) -> Iterator[Triton]:
    """A ``Triton(repository, **options)`` started and ready, its output in ``log_path``; a
    start that fails raises with the log's last lines (Triton has stopped itself), and it is
    stopped, Triton's graceful way, on the way out: how the tests and benchmarks run one."""
    with log_path.open("w") as log:
        triton = Triton(repository, log=log, **options)
        try:
            triton.start()
        except (RuntimeError, TimeoutError) as exc:
            log.flush()
            raise RuntimeError(f"{exc}\n{log_path.read_text()[-4000:]}") from None
        try:
            yield triton
        finally:
            triton.stop()


def argument_parser() -> argparse.ArgumentParser:
    """The launcher's options (``make kserve-lint`` checks our Triton runtime's args with it)."""
    parser = argparse.ArgumentParser(
        prog="python -m tritonrepo.server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repository", type=Path, default=REPOSITORY)
    parser.add_argument(
        "--host",
        default=ports.HOST,
        help=f"every endpoint's address (default {ports.HOST}; {ANY_ADDRESS} in a "
        "container: kserve/triton-runtime)",
    )
    for name, port in DEFAULT_PORTS.items():
        parser.add_argument(f"--{name}-port", type=int, default=port)
    parser.add_argument(
        "--exit-timeout-secs",
        type=int,
        default=EXIT_TIMEOUT,
        help="seconds in-flight requests and open client connections get when "
        f"it is told to stop (default {EXIT_TIMEOUT}; in a pod, below the "
        "grace period)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=KEY_FILE,
        help="the keys the restricted APIs demand, written when missing "
        f"(default {KEY_FILE.relative_to(REPO)}; tsctl --key-file)",
    )
    parser.add_argument(
        "--new-keys",
        action="store_true",
        help="write fresh keys into --key-file first (rotation: Triton reads them at start)",
    )
    parser.add_argument(
        "--no-keys",
        action="store_true",
        help="every API open, behind a gate of your own (KServe's: kserve/triton-runtime)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.no_keys and args.new_keys:
        parser.error("--no-keys and --new-keys contradict each other")
    if args.new_keys:
        server_keys(args.key_file, new=True)
    triton = Triton(
        args.repository,
        http=args.http_port,
        grpc=args.grpc_port,
        metrics=args.metrics_port,
        host=args.host,
        exit_timeout=args.exit_timeout_secs,
        key_file=None if args.no_keys else args.key_file,
    )
    # SIGTERM as Ctrl-C: one path that stops Triton and waits for it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        triton.start()
        print(
            f"Triton ready: {triton.url}/v2 (gRPC {args.host}:{args.grpc_port}, metrics "
            f"{triton.metrics_url}); "
            + ("every API open" if triton.keys is None else f"keys in {triton.key_file}")
            + "; Ctrl-C stops it",
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
