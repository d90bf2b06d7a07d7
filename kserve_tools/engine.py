"""The container engine on this machine (podman or docker) and the flags every call needs.

``engine()`` names the engine: podman when installed (``devtools/ensure_podman.sh`` installs
it from Debian), else docker when its daemon answers; :class:`EngineMissing` otherwise.
``base_command()`` is the engine with its global flags: podman runs containers with ``runc``
when it is installed (``crun`` refuses hosts with hybrid cgroups). ``limit_flags()`` gives
explicit open-files and process limits no higher than this machine's hard limits (podman's
defaults are refused where the hard limits are lower than they are) nor, for processes, than
the kernel's ``pid_max``.
"""

from __future__ import annotations

import functools
import resource
import shutil
import subprocess
from pathlib import Path

NOFILE_CAP = 65536  # TorchServe's netty and Java need thousands, not millions
NPROC_CAP = 65536
PID_MAX = Path("/proc/sys/kernel/pid_max")  # runc refused an nproc limit above it here


class EngineMissing(RuntimeError):
    """Neither podman nor a running docker (the message says how to get one)."""


@functools.lru_cache(maxsize=1)
def engine() -> str:
    """``podman`` or ``docker`` (see the module docstring); asked once per process (``docker
    info`` can take seconds)."""
    if shutil.which("podman"):
        return "podman"
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    ):
        return "docker"
    raise EngineMissing(
        "no container engine: install podman (`devtools/ensure_podman.sh`, "
        "or apt-get install -y podman runc) or start docker"
    )


def base_command(name: str | None = None) -> list[str]:
    """The engine and its global flags, e.g. ``["podman", "--runtime", "runc"]``."""
    name = name or engine()
    if name == "podman" and shutil.which("runc"):
        return [name, "--runtime", "runc"]
    return [name]


def _limit(kind: int, cap: int) -> int:
    hard = resource.getrlimit(kind)[1]
    return cap if hard == resource.RLIM_INFINITY else min(hard, cap)


def limit_flags() -> list[str]:
    """``--ulimit nofile=N:N --ulimit nproc=M:M`` within this machine's hard limits."""
    nofile = _limit(resource.RLIMIT_NOFILE, NOFILE_CAP)
    pid_max = int(PID_MAX.read_text()) if PID_MAX.is_file() else NPROC_CAP
    nproc = _limit(resource.RLIMIT_NPROC, min(NPROC_CAP, pid_max))
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]
