"""Build the runtime image of ``kserve/runtime/Dockerfile`` with podman or docker
(``make kserve-image``).

    python -m kserve_tools.image [--base debian|IMAGE] [--torch-index URL|""] [--print-ref]

- **Base** (``--base``): ``debian`` (the default) is Debian 12 from Debian's archive, made once
  with ``debootstrap --variant=minbase bookworm`` and imported as :data:`DEBIAN_BASE` (no image
  registry needed; the Dockerfile then installs Debian's python3.11); any other value is an
  image the engine has or can pull, e.g. ``python:3.11-slim-bookworm`` (the Dockerfile's own
  default).
- **torch wheels** (``--torch-index``): PyTorch's CPU-only index when it answers, else ``""``:
  the plain PyPI wheels, which bring the CUDA libraries (a much larger image).
- **This machine's pip settings**, for the build only (podman; ``docker build`` takes no
  mounts): what ``pip config list`` shows here is written to a pip.conf under
  ``build/kserve-image/pip/`` (its CA bundle and constraints copied next to it), mounted
  read-only at :data:`PIP_MOUNT` and named by the ``PIP_CONFIG_FILE`` build argument; the
  local wheel folders and indexes it names are mounted read-only at their own paths. RUN steps
  use the host's network. Nothing of it ends up in the image.
- **Cache**: the image is tagged ``<name>:<version>-<key>``, the key hashing the Dockerfile, the
  files ``.dockerignore`` lets into the build context (of requirements.txt its runtime lines
  only; the rest: requirements-triton.txt and the Triton launcher's modules), the base
  image's id and the build arguments; an image with the current key is reused (so a fresh
  clone on a machine whose engine still holds it builds nothing), and also tagged
  ``<name>:<version>``. The engine's own layer cache then rebuilds only the layers after the
  first change (the Triton launcher's are the last).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from buildsteps.configgen import REPO
from kserve_tools.engine import base_command, engine, limit_flags

DOCKERFILE = REPO / "kserve" / "runtime" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
REQUIREMENTS = REPO / "requirements.txt"
RUNTIME_END = "# build, test and benchmark tools"  # the Dockerfile's sed cuts here
NAME = "localhost/resnet50-torchserve"
DEBIAN_BASE = "localhost/debian-bookworm-minbase:latest"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
STAGE = REPO / "build" / "kserve-image"
PIP_MOUNT = "/run/host-pip"
PIP_FILE_KEYS = ("cert", "client-cert", "constraint")  # files: copied beside the pip.conf
PIP_LOCATION_KEYS = ("find-links", "index-url", "extra-index-url")  # local ones: mounted


# ------------------------------------------------------------------ names and the cache key


def runtime_requirements() -> str:
    """The lines of requirements.txt the image installs (above :data:`RUNTIME_END`)."""
    text = REQUIREMENTS.read_text()
    return text.split(RUNTIME_END, 1)[0]


def version() -> str:
    """TorchServe's pinned version, the image's tag."""
    match = re.search(r"^torchserve==(\S+)", runtime_requirements(), re.M)
    if not match:
        raise SystemExit("requirements.txt pins no torchserve above the build/test marker")
    return match.group(1)


def context_files() -> list[Path]:
    """The files ``.dockerignore`` lets into the build context (its ``!`` lines, globs
    relative to the repository), sorted."""
    patterns = [
        line[1:].strip() for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")
    ]
    return sorted({path for pattern in patterns for path in REPO.glob(pattern) if path.is_file()})


def cache_key(base_id: str, build_args: dict[str, str]) -> str:
    """12 hex digits of what decides the image's content."""
    digest = hashlib.sha256(DOCKERFILE.read_bytes())
    for path in context_files():
        digest.update(str(path.relative_to(REPO)).encode())
        # Of requirements.txt only what the image installs: a test tool's pin rebuilds nothing.
        digest.update(
            runtime_requirements().encode() if path == REQUIREMENTS else path.read_bytes()
        )
    digest.update(base_id.encode())
    for key in sorted(build_args):
        if key != "PIP_CONFIG_FILE":  # where packages come from, not which ones
            digest.update(f"{key}={build_args[key]}".encode())
    return digest.hexdigest()[:12]


def _engine(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*base_command(), *args], check=check, **kwargs)


def image_id(ref: str) -> str | None:
    """The engine's id of an image, or None when it has none by that name."""
    done = _engine(
        "image", "inspect", "--format", "{{.Id}}", ref, check=False, capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else None


# ------------------------------------------------------------------ the base image


def debian_base(mirror: str = DEBIAN_MIRROR) -> str:
    """:data:`DEBIAN_BASE`, debootstrapped and imported unless the engine has it already."""
    if image_id(DEBIAN_BASE):
        return DEBIAN_BASE
    if shutil.which("debootstrap") is None:
        raise SystemExit(
            "debootstrap not found (apt-get install -y debootstrap), or pass "
            "--base python:3.11-slim-bookworm (KSERVE_BASE=...) where a registry "
            "is reachable"
        )
    STAGE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=STAGE) as tmp:
        root = Path(tmp) / "rootfs"
        print(f"debootstrap bookworm from {mirror} (about a minute)...", file=sys.stderr)
        subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(root), mirror],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        # An imported image has no environment: RUN steps and the Dockerfile's PATH need one.
        _engine(
            "import",
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "-",
            DEBIAN_BASE,
            stdin=tar.stdout,
            stdout=subprocess.DEVNULL,
        )
        if tar.wait() != 0:
            raise SystemExit("tar of the debootstrapped root failed")
    return DEBIAN_BASE


def resolve_base(base: str) -> tuple[str, str]:
    """(image reference, image id) of ``--base``; pulls a named image the engine lacks."""
    ref = debian_base() if base == "debian" else base
    found = image_id(ref)
    if found is None:
        _engine("pull", ref)
        found = image_id(ref)
    return ref, found


def default_torch_index(timeout: float = 10.0) -> str:
    """PyTorch's CPU-only index when it answers from here, else "" (PyPI's wheels)."""
    try:
        with urllib.request.urlopen(f"{CPU_TORCH_INDEX}/torch/", timeout=timeout):
            return CPU_TORCH_INDEX
    except OSError:
        print(
            f"{CPU_TORCH_INDEX} unreachable: torch from PyPI, CUDA libraries included",
            file=sys.stderr,
        )
        return ""


# ------------------------------------------------------------------ this machine's pip settings


def pip_settings() -> dict[str, str]:
    """``section.key -> value`` of ``pip config list`` here; environment variables win over
    files, a later file over an earlier one (pip's order)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], check=True, capture_output=True, text=True
    ).stdout
    files, env = {}, {}
    for line in listed.splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip().strip("'\"")
        if name.startswith(":env:."):
            env["global." + name.removeprefix(":env:.")] = value
        else:
            files[name] = value
    return {**files, **env}


def _local_root(location: str) -> Path | None:
    """The folder to mount for a local find-links/index location (None: a remote one); a
    ``.../simple`` index links to its files through ``..``, so its parent."""
    path = location.removeprefix("file://")
    if not path.startswith("/") or not Path(path).exists():
        return None
    folder = Path(path)
    return folder.parent if folder.name == "simple" else folder


def stage_pip_settings(stage: Path = STAGE / "pip") -> list[str]:
    """Write the build's pip.conf under ``stage``; the ``-v`` flags that mount it and the
    local locations it names, read-only."""
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    sections: dict[str, dict[str, str]] = {}
    mounts = {stage: PIP_MOUNT}
    for name, value in pip_settings().items():
        section, _, key = name.partition(".")
        if key in PIP_FILE_KEYS and Path(value).is_file():
            copied = stage / f"{key}-{Path(value).name}"
            shutil.copy2(value, copied)
            value = f"{PIP_MOUNT}/{copied.name}"
        elif key in PIP_LOCATION_KEYS:
            for location in value.split():
                root = _local_root(location)
                if root is not None:
                    mounts[root] = str(root)
        sections.setdefault(section, {})[key] = value
    lines = []
    for section, items in sections.items():
        lines += [f"[{section}]", *(f"{k} = {v}" for k, v in items.items()), ""]
    (stage / "pip.conf").write_text("\n".join(lines))
    return [flag for src, dst in mounts.items() for flag in ("-v", f"{src}:{dst}:ro")]


# ------------------------------------------------------------------ the build


def build(base: str = "debian", torch_index: str | None = None, host_pip: bool = True) -> str:
    """Build (or reuse) the image; returns its keyed reference."""
    base_ref, base_id = resolve_base(base)
    args = {
        "BASE": base_ref,
        "TORCH_INDEX": default_torch_index() if torch_index is None else torch_index,
    }
    mounts: list[str] = []
    if host_pip and engine() == "podman":
        mounts = stage_pip_settings()
        args["PIP_CONFIG_FILE"] = f"{PIP_MOUNT}/pip.conf"
    ref = f"{NAME}:{version()}-{cache_key(base_id, args)}"
    if image_id(ref) is None:
        command = [
            *base_command(),
            "build",
            "--network",
            "host",
            *limit_flags(),
            *mounts,
            *(f for k, v in args.items() for f in ("--build-arg", f"{k}={v}")),
            "--label",
            f"org.opencontainers.image.base.name={base_ref}",
            "-f",
            str(DOCKERFILE),
            "-t",
            ref,
            str(REPO),
        ]
        print("+ " + shlex.join(command), file=sys.stderr)
        subprocess.run(command, check=True)
    _engine("tag", ref, f"{NAME}:{version()}")
    return ref


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kserve_tools.image", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--base",
        default="debian",
        help="'debian' (debootstrapped here) or an image, e.g. python:3.11-slim-bookworm",
    )
    parser.add_argument(
        "--torch-index",
        default=None,
        help=f"extra index for torch ('' = PyPI's wheels; default: "
        f"{CPU_TORCH_INDEX} when it answers)",
    )
    parser.add_argument(
        "--no-host-pip",
        dest="host_pip",
        action="store_false",
        help="do not pass this machine's pip settings to the build",
    )
    args = parser.parse_args(argv)
    ref = build(args.base, args.torch_index, args.host_pip)
    print(ref)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
