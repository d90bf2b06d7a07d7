"""Start and stop a real TorchServe on free loopback ports, isolated in its own folder.

Used by the integration tests and the benchmark, and the one place that knows TorchServe's
process layout: each instance gets its own working folder (``key_file.json`` and ``logs/``
land there) and its own ``TMPDIR`` (TorchServe keeps one pid file there, so two servers on one
machine need two of them); the server is that pid's Java frontend plus its descendants (one
Python process per worker).

    with LocalTorchServe(workdir, model_store, load_models=["resnet50-tagger.mar"]) as ts:
        requests.get(ts.inference_url + "/ping", headers=ts.keys.inference_headers())
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import javaproperties
import psutil
import requests

from buildsteps.configgen import rewrite_properties
from serveclient.client import TorchServeClient
from serveshared.errors import KeyFileError
from serveshared.keys import Keys

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "config" / "config.properties"


def free_worker_ports(span: int = 100) -> int:
    """A base for ``initial_worker_port`` whose ``span`` worker sockets are all unused.

    Workers talk to the frontend over Unix sockets ``.ts.sock.<port>`` in the system temp
    folder (``/tmp``, whatever ``TMPDIR`` says), numbered up from ``initial_worker_port``, and a
    starting worker deletes a socket file that is in the way: two servers on the same numbers
    break each other. TorchServe's default base is 9000."""
    rng = random.SystemRandom()
    temp = Path(tempfile.gettempdir())
    for _ in range(100):
        base = rng.randrange(10_000, 60_000, span)
        if not any((temp / f".ts.sock.{base + i}").exists() for i in range(span)):
            return base
    raise RuntimeError(f"no free range of {span} worker sockets in {temp}")


# Ports ``free_port`` handed out lately, by any process on this machine: a port is chosen
# seconds before its server binds it (TorchServe loads its models first), and the suite's
# other pytest process must not choose it meanwhile (a TorchServe of the fault tests failed
# with "Address already in use" on a port the other process had just taken, 2026-11-28).
CLAIMS = Path(tempfile.gettempdir()) / "devtools-port-claims"
CLAIM_S = 600.0  # a claim older than this is free again: its server has bound or gone


def _claimed(port: int) -> bool:
    """Claim ``port`` for this caller; False when another claimed it in the last ``CLAIM_S``."""
    CLAIMS.mkdir(exist_ok=True)
    claim = CLAIMS / str(port)
    with contextlib.suppress(FileNotFoundError):
        if time.time() - claim.stat().st_mtime > CLAIM_S:
            claim.unlink(missing_ok=True)
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that no other caller on
    this machine was handed in the last ``CLAIM_S`` seconds.

    Chosen below Linux's ephemeral range (32768 and up): a port the kernel hands out for
    binding to 0 is also handed to outgoing connections, which on a busy machine took it
    between our choice and TorchServe's bind ("Address already in use")."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20_000, 32_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if _claimed(port):
            return port
    raise RuntimeError("no free TCP port in 20000-32000 on 127.0.0.1")


SERVER_PORTS = ("inference", "management", "metrics", "grpc_inference", "grpc_management")


def free_ports(names: tuple[str, ...] = SERVER_PORTS) -> dict[str, int]:
    """``{name: port}``: a distinct ``free_port`` for each name (two draws can meet)."""
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        port = free_port()
        if port not in ports.values():
            ports[names[len(ports)]] = port
    return ports


def loopback_urls(ports: dict[str, int]) -> dict[str, str]:
    """The inference, management and metrics URLs of a TorchServe on these loopback ports."""
    return {
        name: f"http://127.0.0.1:{ports[name]}" for name in ("inference", "management", "metrics")
    }


def port_properties(ports: dict[str, int]) -> dict[str, str]:
    """config.properties settings that put a TorchServe on these loopback ports, with a fresh
    range of worker ports (sockets of an earlier run may still be there)."""
    urls = loopback_urls(ports)
    return {
        "inference_address": urls["inference"],
        "management_address": urls["management"],
        "metrics_address": urls["metrics"],
        "grpc_inference_port": str(ports["grpc_inference"]),
        "grpc_management_port": str(ports["grpc_management"]),
        "initial_worker_port": str(free_worker_ports()),
    }


def private_env(workdir: Path) -> dict[str, str]:
    """The variables that give one TorchServe its own pid file (``TMPDIR``) and logs."""
    return {
        "TMPDIR": str(workdir / "tmp"),
        "LOG_LOCATION": str(workdir / "logs"),
        "METRICS_LOCATION": str(workdir / "logs"),
    }


def stop_torchserve(torchserve: str, cwd: Path, env: dict[str, str], pids: set[int]) -> None:
    """``torchserve --stop`` (TorchServe's own way: the pid file under ``TMPDIR`` in ``env``),
    then kill whatever of ``pids`` (the frontend and its workers) survived."""
    subprocess.run(
        [torchserve, "--stop"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    stop_processes(pids)


def stop_processes(pids: set[int], grace: float = 30.0) -> None:
    """Wait up to ``grace`` seconds for ``pids`` to exit (after a stop request), then SIGKILL."""
    procs = [p for p in map(_process, pids) if p is not None]
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(alive, timeout=10)


class NotStartedHere(RuntimeError):
    """``LocalTorchServe.attach`` was given a folder no ``LocalTorchServe`` started a server in."""


class LocalTorchServe:
    """A ``torchserve --start`` process on free ports; ``stop()`` always leaves nothing behind.

    ``config``: the config.properties to start from (the repo's by default); addresses, model
    store and metrics config are rewritten to this instance's. ``properties``: more overrides.
    ``model_api``: turn on registering and unregistering models (``enable_model_api``, off in
    the shipped config: config/server.properties says why), for tests and benchmarks that
    register archives. ``ports``: these, not free ones. ``owned``: False for a server another
    process started (``attach``).
    """

    def __init__(
        self,
        workdir: Path,
        model_store: Path,
        *,
        config: Path = DEFAULT_CONFIG,
        load_models: list[str] | None = None,
        properties: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        model_api: bool = False,
        ports: dict[str, int] | None = None,
        owned: bool = True,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.model_store = Path(model_store).resolve()
        self.config = Path(config)
        self.load_models = load_models
        self.properties = {
            **({"enable_model_api": "true"} if model_api else {}),
            **(properties or {}),
        }
        self.extra_env = dict(env or {})
        self.ports = ports or free_ports()
        self.owned = owned
        urls = loopback_urls(self.ports)
        self.inference_url, self.management_url, self.metrics_url = (
            urls["inference"],
            urls["management"],
            urls["metrics"],
        )
        self.tmpdir = self.workdir / "tmp"
        self.pid_file = self.tmpdir / ".model_server.pid"  # written by `torchserve --start`
        self.keys: Keys | None = None
        self._pids: set[int] = set()

    @classmethod
    def attach(cls, workdir: Path) -> LocalTorchServe:
        """The server a ``start`` left running in ``workdir`` (another process's: the suite's
        session server), read from the config.properties and key file it wrote there, to
        measure and leave running: ``start`` only waits until it is ready, ``stop`` and
        ``kill`` do nothing to it (its owner stops it)."""
        workdir = Path(workdir).resolve()
        config = workdir / "config.properties"
        if not config.is_file():
            raise NotStartedHere(
                f"{workdir}: no config.properties, so no server that devtools.server started "
                "there: give the folder a running LocalTorchServe was started in"
            )
        values = javaproperties.loads(config.read_text())
        ports = {
            name: int(values[f"{name}_address"].rsplit(":", 1)[1])
            for name in ("inference", "management", "metrics")
        } | {name: int(values[f"{name}_port"]) for name in ("grpc_inference", "grpc_management")}
        server = cls(workdir, Path(values["model_store"]), ports=ports, owned=False)
        server._expected = _startup_models(values.get("load_models", ""), server.model_store)
        return server

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 300.0) -> LocalTorchServe:
        """Start, then wait until every loaded model has a READY worker (an attached server:
        only the wait)."""
        if not self.owned:
            self._wait_ready(timeout)
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tmpdir.mkdir(exist_ok=True)
        config_path = self.workdir / "config.properties"
        overrides = {
            **port_properties(self.ports),
            "model_store": str(self.model_store),
            "metrics_config": str(REPO / "config" / "metrics.yaml"),
        }
        if self.load_models is not None:
            overrides["load_models"] = ",".join(self.load_models)
        overrides.update(self.properties)
        text = rewrite_properties(self.config.read_text(), overrides)
        values = javaproperties.loads(text)
        # TorchServe unpacks each archive under Java's temp folder and removes it only when it
        # stops itself: this server's own folder, so that kill() can remove what it left.
        java_tmp = f"-Djava.io.tmpdir={self.tmpdir}"
        vmargs = f"{values['vmargs']} {java_tmp}" if values.get("vmargs") else java_tmp
        config_path.write_text(rewrite_properties(text, {"vmargs": vmargs}))
        self._expected = _startup_models(values.get("load_models", ""), self.model_store)
        command = [
            str(Path(sys.executable).parent / "torchserve"),
            "--start",
            "--ncs",
            "--ts-config",
            str(config_path),
        ]
        try:  # a start that fails leaves nothing running (``with`` calls no __exit__ then)
            with open(self.workdir / "torchserve.out", "ab") as out:
                subprocess.run(
                    command,
                    cwd=self.workdir,
                    env=self._env(),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    check=True,
                    timeout=120,
                )
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """``torchserve --stop``, then kill whatever of the server and its workers survived."""
        if not self.owned:
            return
        self._pids |= self._server_pids()
        stop_torchserve(
            str(Path(sys.executable).parent / "torchserve"), self.workdir, self._env(), self._pids
        )

    def kill(self) -> None:
        """SIGKILL the frontend and its workers at once, without TorchServe's drain (3.7 s a
        server here): a teardown's stop, with nothing in flight. ``start`` may follow."""
        if not self.owned:
            return
        self._pids |= self._server_pids()
        stop_processes(self._pids, grace=0)
        self.pid_file.unlink(missing_ok=True)
        shutil.rmtree(self.tmpdir / "models", ignore_errors=True)  # the unpacked archives

    def __enter__(self) -> LocalTorchServe:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()

    # ------------------------------------------------------------------ helpers

    def _env(self) -> dict[str, str]:
        return {**os.environ, **private_env(self.workdir), **self.extra_env}

    def processes(self) -> list[psutil.Process]:
        """The frontend and every descendant (the workers); [] when it is not running."""
        return server_processes(self.pid_file)

    def client(self, timeout: float = 300.0) -> TorchServeClient:
        """The user-facing client for this server: keys from its ``key_file.json``, rotated
        when they expire."""
        return TorchServeClient(
            self.inference_url,
            self.management_url,
            self.metrics_url,
            key_file=self.workdir / "key_file.json",
            timeout=timeout,
        )

    def cli_env(self) -> dict[str, str]:
        """Environment that points ``tsctl`` at this server."""
        return dict(
            os.environ,
            TSCTL_INFERENCE_URL=self.inference_url,
            TSCTL_MANAGEMENT_URL=self.management_url,
            TSCTL_METRICS_URL=self.metrics_url,
            TSCTL_KEY_FILE=str(self.workdir / "key_file.json"),
        )

    def _server_pids(self) -> set[int]:
        return {p.pid for p in self.processes()}

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        key_file = self.workdir / "key_file.json"
        last = "no answer yet"
        while time.monotonic() < deadline:
            self._pids |= self._server_pids()
            if self._pids and not any(_process(p) for p in self._pids):
                break
            try:
                # This loop is the retry: no settling inside Keys.read (missing or half-written
                # while TorchServe starts is read again on the next pass).
                self.keys = Keys.read(key_file, settle_s=0)
                if self._all_ready():
                    return
                last = "workers not READY yet"
            except (requests.RequestException, KeyFileError, ValueError) as exc:
                last = repr(exc)
            time.sleep(0.5)
        raise RuntimeError(
            f"TorchServe in {self.workdir} not ready after {timeout:.0f}s ({last}).\n"
            + tails(self.workdir, ("logs/ts_log.log", "logs/model_log.log"))
        )

    def _all_ready(self) -> bool:
        if self.keys is None:  # the key file is not written yet
            return False
        headers = self.keys.management_headers()
        models = requests.get(f"{self.management_url}/models", headers=headers, timeout=10)
        models.raise_for_status()
        names = [m["modelName"] for m in models.json()["models"]]
        if len(names) < self._expected:
            return False
        for name in names:
            described = requests.get(
                f"{self.management_url}/models/{name}", headers=headers, timeout=10
            )
            described.raise_for_status()
            info = described.json()[0]
            workers = info.get("workers", [])
            if not workers or any(w["status"] != "READY" for w in workers):
                return False
        return True


def _startup_models(load_models: str, model_store: Path) -> int:
    """How many models a config.properties' ``load_models`` value loads at start-up."""
    value = load_models.strip()
    if value == "all":
        return len(list(model_store.glob("*.mar")))
    return len([m for m in value.split(",") if m.strip()])


def tails(folder: Path, names: tuple[str, ...], lines: int = 40) -> str:
    """The last ``lines`` lines of each log file under ``folder``, headed by its name."""
    out = []
    for name in names:
        path = folder / name
        text = path.read_text(errors="replace") if path.exists() else "(missing)"
        out.append(f"--- {name} (tail) ---\n" + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(out)


def server_processes(pid_file: Path) -> list[psutil.Process]:
    """The process in ``pid_file`` (a TorchServe frontend) and all its descendants."""
    try:
        return process_tree(int(Path(pid_file).read_text().strip()))
    except (OSError, ValueError):
        return []


def process_tree(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and all its descendants; [] when it is gone (or a zombie)."""
    root = _process(pid)
    try:
        return [root, *root.children(recursive=True)] if root else []
    except psutil.Error:
        return []


def _process(pid: int) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        return proc if proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None
