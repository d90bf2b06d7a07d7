"""Start TorchServe the way our ClusterServingRuntime starts it in a pod, on this machine.

The command, args and env come from the runtime's ``kserve-container`` (as rendered from
``kserve/runtime``); the only changes are the ones a pod gets for free:

- ``/mnt/models`` (where KServe's storage initializer puts the bundle) is the local download
  folder, in the args and in the bundle's config.properties;
- the addresses and ports of config.properties are free loopback ports (a pod has its own
  network namespace; this machine does not), and so is ``initial_worker_port``;
- ``TMPDIR`` and the working folder are private (a pod has its own filesystem).

The port-remapped config.properties is written to the working folder, never into the bundle
(``/mnt/models`` is read-only in a pod). Readiness is the runtime's own readinessProbe, run
the way the kubelet would.

    with RuntimePod(runtime_container, mount=download_dir, workdir=tmp) as pod:
        requests.post(pod.inference_url + "/v1/models/resnet50-tagger:predict", json=...)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from buildsteps.configgen import rewrite_properties
from devtools.server import (
    free_ports,
    loopback_urls,
    port_properties,
    private_env,
    process_tree,
    stop_torchserve,
    tails,
)

MOUNT = "/mnt/models"
BUNDLE_CONFIG = f"{MOUNT}/config/config.properties"


def http_probe(base_url: str, spec: dict, timeout: float) -> bool:
    """An ``httpGet`` probe as the kubelet judges it: a 2xx or 3xx answer in time."""
    try:
        status = requests.get(
            base_url + spec["httpGet"].get("path", "/"), timeout=timeout
        ).status_code
    except requests.RequestException:
        return False
    return 200 <= status < 400


class RuntimePod:
    """The runtime's container command on free loopback ports; ``stop()`` leaves nothing."""

    def __init__(self, container: dict, mount: Path, workdir: Path) -> None:
        self.container = container
        self.mount = Path(mount).resolve()
        self.workdir = Path(workdir).resolve()
        self.tmpdir = self.workdir / "tmp"
        ports = free_ports()
        urls = loopback_urls(ports)
        self.inference_url, self.management_url, self.metrics_url = (
            urls["inference"],
            urls["management"],
            urls["metrics"],
        )
        self.port_overrides = port_properties(ports)
        self.container_port = (container.get("ports") or [{}])[0].get("containerPort", 8080)
        self.process: subprocess.Popen | None = None
        self.readiness: list[bool] = []  # every readinessProbe result while starting
        self._pids: set[int] = set()

    # ------------------------------------------------------------------ the container

    def remap(self, word: str) -> str:
        """One command word as this machine runs it: the bundle's config.properties is the
        port-remapped copy, anything else under /mnt/models is under the download folder."""
        return word.replace(BUNDLE_CONFIG, str(self.config_path)).replace(MOUNT, str(self.mount))

    def command(self) -> list[str]:
        """The container's command + args, remapped."""
        words = [*(self.container.get("command") or []), *(self.container.get("args") or [])]
        return [self.remap(word) for word in words]

    @property
    def bundle_config(self) -> Path:
        """The bundle's own config.properties (what the pod reads at /mnt/models)."""
        return Path(BUNDLE_CONFIG.replace(MOUNT, str(self.mount)))

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.properties"

    def config_text(self) -> str:
        """The bundle's config.properties with /mnt/models and the ports remapped."""
        text = self.bundle_config.read_text().replace(MOUNT, str(self.mount))
        return rewrite_properties(text, self.port_overrides)

    def env(self) -> dict[str, str]:
        """This environment + the container's env (values only) + private TMPDIR and logs.
        The container's first command word is looked up next to this Python first."""
        container_env = {}
        for item in self.container.get("env") or []:
            if "value" not in item:
                raise ValueError(f"env {item.get('name')}: only plain values are supported")
            container_env[item["name"]] = str(item["value"])
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "PATH": path, **container_env, **private_env(self.workdir)}

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 300.0) -> RuntimePod:
        """Start the container command and wait until its readinessProbe passes."""
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())
        with open(self.workdir / "container.log", "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def probe(self, kind: str = "readinessProbe") -> bool:
        """Whether one of the container's probes passes, judged as the kubelet does: an exec
        probe by its exit code (the command remapped, in the container's environment), an
        httpGet probe by a 2xx/3xx answer on the container port."""
        spec = self.container[kind]
        timeout = spec.get("timeoutSeconds", 1)
        if "exec" in spec:
            command = [self.remap(word) for word in spec["exec"]["command"]]
            try:
                return (
                    subprocess.run(
                        command,
                        cwd=self.workdir,
                        env=self.env(),
                        capture_output=True,
                        timeout=timeout,
                    ).returncode
                    == 0
                )
            except subprocess.TimeoutExpired:
                return False
        if spec["httpGet"].get("port", self.container_port) != self.container_port:
            raise ValueError(
                f"{kind} probes port {spec['httpGet']['port']}, not the container's port"
            )
        return http_probe(self.inference_url, spec, timeout)

    def wait_ready(self, timeout: float) -> None:
        """Poll the readinessProbe every second, as the kubelet would, until it passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._pids |= self._tree()
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the container exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            self.readiness.append(self.probe())
            if self.readiness[-1]:
                return
            time.sleep(1)
        raise RuntimeError(f"readinessProbe not passing after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """``torchserve --stop`` (TorchServe's own way), then kill whatever survived."""
        if self.process is None:
            return
        self._pids |= self._tree()
        stop_torchserve("torchserve", self.workdir, self.env(), self._pids)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> RuntimePod:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _tree(self) -> set[int]:
        return {p.pid for p in process_tree(self.process.pid)}

    def log_tail(self, lines: int = 40) -> str:
        return tails(
            self.workdir, ("container.log", "logs/ts_log.log", "logs/model_log.log"), lines
        )
