"""Run the runtime image the way a pod runs our ClusterServingRuntime's ``kserve-container``.

From the rendered container (``kserve_tools.render``): its command (the entrypoint) and args,
its env, ``securityContext`` (``runAsUser``, dropped capabilities, no privilege escalation, a
read-only root file system when it asks for one; tmpfs at the ``emptydirs`` given), its
``emptyDir`` volume mounts (the runtime's ``volumes``: tmpfs, or the container's shared-memory
size for ``/dev/shm``), the memory and CPU limits, and its port, published on 127.0.0.1 only
(with any other ``publish`` ports: a pod's IP reaches every port its server listens on,
declared or not). ``/mnt/models`` is the bundle,
bind-mounted read-only (KServe's storage initializer leaves it read-only for the server).
Probes run as the kubelet runs them: an exec probe with ``<engine> exec`` inside the container,
an httpGet probe on the published port. Stopping is the kubelet's: SIGTERM, then SIGKILL after
the grace period. ``ModelcarPod``: the same runtime reading the bundle from a modelcar image
instead, through the modelcar process's root, as KServe wires a pod for ``storageUri: oci://``.

    with RuntimeContainer(container, image, bundle_folder) as pod:
        requests.post(pod.inference_url + "/v1/models/resnet50-tagger:predict", json=...)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from kubernetes.utils import parse_quantity

from kserve_tools.engine import base_command, limit_flags
from kserve_tools.pod import http_probe

MOUNT = "/mnt/models"
GRACE_SECONDS = 30  # Kubernetes' default terminationGracePeriodSeconds (the runtime sets none)


def cpus(quantity: str) -> str:
    """A Kubernetes CPU quantity (``1``, ``500m``) as ``--cpus`` takes it (``1``, ``0.5``)."""
    return f"{parse_quantity(quantity):f}".rstrip("0").rstrip(".")


class RuntimeContainer:
    """The image started as the pod would start it; ``stop()`` always removes the container."""

    def __init__(
        self,
        container: dict,
        image: str,
        bundle: Path,
        *,
        emptydirs: tuple = (),
        volumes: list[dict] | None = None,
        publish: tuple[int, ...] = (),
        grace: int = GRACE_SECONDS,
    ) -> None:
        self.container = container
        self.image = image
        self.bundle = Path(bundle).resolve()
        self.emptydirs = tuple(emptydirs)  # paths the manifest mounts emptyDir volumes at
        self.volumes = {v["name"]: v for v in volumes or []}  # the runtime's spec.volumes
        self.grace = grace
        self.name = f"kserve-runtime-{uuid.uuid4().hex[:8]}"
        self.engine = base_command()
        self.container_port = container["ports"][0]["containerPort"]
        self.publish = (self.container_port, *publish)
        self.inference_url: str | None = None
        self.readiness: list[bool] = []  # every readinessProbe result while starting
        self.reasons: list[str] = []  # what each failing exec probe printed
        self.started_at: float | None = None
        self.ready_after: float | None = None  # seconds from `run` to the first passing probe

    # ------------------------------------------------------------------ the run command

    def run_command(self) -> list[str]:
        """``<engine> run`` with everything the pod spec decides."""
        c = self.container
        security = c.get("securityContext") or {}
        limits = (c.get("resources") or {}).get("limits") or {}
        flags = ["--detach", "--name", self.name, *limit_flags(), *self.mount_flags()]
        for port in self.publish:
            flags += ["-p", f"127.0.0.1::{port}"]
        if c.get("command"):
            flags += ["--entrypoint", json.dumps(c["command"])]
        for item in c.get("env") or []:
            flags += ["-e", f"{item['name']}={item['value']}"]
        if "runAsUser" in security:
            flags += ["--user", str(security["runAsUser"])]
        for cap in (security.get("capabilities") or {}).get("drop") or []:
            flags += ["--cap-drop", cap]
        if security.get("allowPrivilegeEscalation") is False:
            flags += ["--security-opt", "no-new-privileges"]
        if security.get("readOnlyRootFilesystem"):
            flags += ["--read-only", "--read-only-tmpfs=false"]
        for path in self.emptydirs:
            uid = security.get("runAsUser", 0)
            flags += ["--tmpfs", f"{path}:rw,mode=1777,uid={uid}"]
        flags += self.volume_flags(security.get("runAsUser", 0))
        if "memory" in limits:
            memory = str(int(parse_quantity(limits["memory"])))
            flags += ["--memory", memory, "--memory-swap", memory]
        if "cpu" in limits:
            flags += ["--cpus", cpus(limits["cpu"])]
        return [*self.engine, "run", *flags, self.image, *(c.get("args") or [])]

    def mount_flags(self) -> list[str]:
        """How the bundle reaches ``/mnt/models``: read-only, as the storage initializer leaves
        it."""
        return ["-v", f"{self.bundle}:{MOUNT}:ro"]

    def volume_flags(self, uid: int) -> list[str]:
        """The container's ``emptyDir`` mounts: ``/dev/shm`` as the engine's shared memory of
        the volume's ``sizeLimit`` (Kubernetes mounts a memory-backed emptyDir over the
        container's 64 MB one), any other path as a tmpfs. Other volume kinds are refused."""
        flags = []
        for mount in self.container.get("volumeMounts") or []:
            volume = self.volumes.get(mount["name"], {})
            if "emptyDir" not in volume:
                raise ValueError(
                    f"volume {mount['name']!r} at {mount['mountPath']}: only "
                    "emptyDir volumes are run here"
                )
            limit = (volume["emptyDir"] or {}).get("sizeLimit")
            size = str(int(parse_quantity(limit))) if limit else None
            if mount["mountPath"] == "/dev/shm":
                flags += ["--shm-size", size or "64m"]
            else:
                flags += [
                    "--tmpfs",
                    f"{mount['mountPath']}:rw,mode=1777,uid={uid}"
                    + (f",size={size}" if size else ""),
                ]
        return flags

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 600.0) -> RuntimeContainer:
        """Run the container and wait until its readinessProbe passes."""
        self.started_at = time.monotonic()
        try:
            self.launch()
            self.inference_url = f"http://{self.published(self.container_port)}"
            self.wait_ready(timeout)
        except BaseException:
            self.remove()
            raise
        return self

    def launch(self) -> None:
        """Start the pod's containers (here the runtime's alone)."""
        subprocess.run(self.run_command(), check=True, capture_output=True, text=True)

    def published(self, port: int) -> str:
        """``127.0.0.1:<host port>`` the container's ``port`` is published on."""
        out = self._engine("port", self.name, f"{port}/tcp", check=False).stdout.split()
        if not out:  # an exited container publishes nothing
            raise RuntimeError(f"the container exited: {self.state()}\n{self.logs()}")
        return out[0].replace("0.0.0.0:", "127.0.0.1:")

    def exec(self, command: list[str], timeout: float) -> subprocess.CompletedProcess:
        """A command inside the container, as the container's user (a kubelet exec probe)."""
        return subprocess.run(
            [*self.engine, "exec", self.name, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def probe(self, kind: str = "readinessProbe") -> bool:
        """Whether one of the container's probes passes, judged as the kubelet does."""
        spec = self.container[kind]
        timeout = spec.get("timeoutSeconds", 1)
        if "exec" in spec:
            try:
                done = self.exec(spec["exec"]["command"], timeout)
            except subprocess.TimeoutExpired:
                self.reasons.append(f"timed out after {timeout}s")
                return False
            if done.returncode != 0:
                self.reasons.append(done.stderr.strip())
            return done.returncode == 0
        return http_probe(self.inference_url, spec, timeout)

    def running(self) -> bool:
        return self.state().get("Running", False)

    def state(self) -> dict:
        done = self._engine("inspect", "--format", "{{json .State}}", self.name, check=False)
        return json.loads(done.stdout) if done.returncode == 0 else {}

    def wait_ready(self, timeout: float) -> None:
        """Poll the readinessProbe every second until it passes (records ``ready_after``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError(f"the container exited: {self.state()}\n{self.logs()}")
            self.readiness.append(self.probe())
            if self.readiness[-1]:
                self.ready_after = time.monotonic() - self.started_at
                return
            time.sleep(1)
        raise RuntimeError(f"readinessProbe not passing after {timeout:.0f}s:\n{self.logs()}")

    def stop(self) -> tuple[int, float]:
        """The kubelet's stop: SIGTERM, SIGKILL after the grace period. (exit code, seconds)."""
        began = time.monotonic()
        self._engine("stop", "--time", str(self.grace), self.name, check=False)
        return self.state().get("ExitCode", -1), time.monotonic() - began

    def remove(self) -> None:
        """Remove the container, running or not (idempotent)."""
        self._engine("rm", "--force", "--time", "0", self.name, check=False)

    def logs(self, lines: int = 60) -> str:
        """The container's last ``lines`` of output, stdout and stderr together (Triton logs
        to stderr)."""
        return subprocess.run(
            [*self.engine, "logs", "--tail", str(lines), self.name],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
        ).stdout

    def __enter__(self) -> RuntimeContainer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.remove()

    def _engine(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.engine, *args], check=check, capture_output=True, text=True, timeout=120
        )


# KServe's modelcar containers (kserve/kserve pkg/utils, CreateModelcarContainer and
# CreateModelcarInitContainer), their args as the shell receives them: KServe writes "$$$$" and
# the kubelet's $$-escape leaves the shell's own "$$", its pid.
MODELCAR_ARGS = ["sh", "-c", f"ln -sf /proc/$$/root/models {MOUNT} && sleep infinity"]
MODELCAR_CHECK = ["sh", "-c", '[ -d /models ] && [ "$(ls -A /models)" ]']
MODELCAR_LIMITS = ["--memory", "15m", "--cpus", "0.01"]  # KServe's cpuModelcar, memoryModelcar


class ModelcarPod(RuntimeContainer):
    """The runtime beside a modelcar, wired as KServe's webhook wires a pod whose storageUri is
    ``oci://`` (``ConfigureModelcarToContainer``): the modelcar image's check of ``/models``
    first (its init container); then one process namespace for the pod
    (``shareProcessNamespace``: here a pause container holds it, as the kubelet's does), an
    ``emptyDir`` at ``/mnt`` in both containers, ``MODEL_INIT_MODE=async`` in the runtime's env,
    and the containers in the pod spec's order: the runtime, then the modelcar, whose shell
    links ``/mnt/models`` to its own ``/models`` through ``/proc/<its pid>/root``. ``remove()``
    removes all of it."""

    def __init__(self, container: dict, image: str, modelcar: str, **kwargs) -> None:
        env = [*(container.get("env") or []), {"name": "MODEL_INIT_MODE", "value": "async"}]
        self.mnt = Path(tempfile.mkdtemp(prefix="modelcar-mnt-"))
        self.mnt.chmod(0o777)  # an emptyDir's mode
        super().__init__({**container, "env": env}, image, self.mnt, **kwargs)
        self.modelcar = modelcar
        self.pause, self.sidecar = f"{self.name}-pause", f"{self.name}-modelcar"

    def mount_flags(self) -> list[str]:
        return ["--pid", f"container:{self.pause}", "-v", f"{self.mnt}:/mnt"]

    def launch(self) -> None:
        run = [*self.engine, "run", *limit_flags()]
        for command in (
            [*run, "--rm", self.modelcar, *MODELCAR_CHECK],
            [*run, "--detach", "--name", self.pause, self.modelcar, "sleep", "infinity"],
        ):
            subprocess.run(command, check=True, capture_output=True, text=True)
        super().launch()
        sidecar = ["--detach", "--name", self.sidecar, *MODELCAR_LIMITS, *self.mount_flags()]
        subprocess.run(
            [*run, *sidecar, self.modelcar, *MODELCAR_ARGS],
            check=True,
            capture_output=True,
            text=True,
        )

    def remove(self) -> None:
        super().remove()
        for name in (self.sidecar, self.pause):
            self._engine("rm", "--force", "--time", "0", name, check=False)
        shutil.rmtree(self.mnt, ignore_errors=True)
