"""What a bare, offline GPU host lacks, staged here in loads that travel one call at a time;
installed there from them.

    python -m buildsteps.stage [--python 3.12] [--out build/stage]   # make gpu-stage, here
    python3 -m buildsteps.stage check     # on the host: which loads have come, which are missing
    python3 -m buildsteps.stage install   # on the host: bench/gpuserved.sh's first step

Many GPU servers are offline with a Python and PyTorch only (the reference host: Python 3.12,
torch 2.11, torchvision 0.26, CUDA 13; no Java, no Triton, no network). The stage holds what
serving needs beyond that, from a machine that has it:

- ``java.tar.gz``: a Java runtime ``jlink``ed from this machine's JDK with only the modules
  TorchServe's frontend uses (``jdeps`` over the installed torchserve's ``model-server.jar``);
- ``wheels/``: torchserve (its frontend jar inside), torch-model-archiver and what they, the
  handler, the build steps and the benchmarks import (``PROJECT``), downloaded for the host's
  Python (``pip download --python-version X --only-binary=:all:``), pinned as requirements.txt
  pins them, else at the version installed here (what the suite ran); whatever torch and
  torchvision require is left out, since the host has it;
- ``triton/``: the ``nvidia-pytriton`` wheel (tritonserver 2.51, its CUDA 12 runtime and
  libraries, and a Python backend stub for each Python from 3.8 to 3.13: the staging checks
  the host's is there) and numpy 1.26 for the stub, as requirements-triton.txt pins them;
- ``decoders/``: the GPU JPEG decoder wheels requirements-gpu.txt pins (none without it);
- ``triton/libpythonX.Y.so.1.0.gz``: a shared libpython for a host whose Python is a static
  build (``--libpython``, else a ``pythonX.Y`` on ``PATH``'s), lent to Triton's stub there only
  where the host has none.

Pieces over a load's size are split into parts; pieces and parts are packed into loads
(``load-1/``, ``load-2/``, ...), each at most what one call to the GPU host carries beside the
checkout (64 MiB in all), each holding the manifest: every part's and every piece's sha256.

``install`` uses the standard library only (it runs on the host's bare ``python3``): it checks
every part, joins them into ``build/host/``, unpacks the Java runtime (``build/host/java``),
and makes the two venvs the repository's defaults name, each seeing the host's own packages
(torch) through a ``.pth`` listing this interpreter's package folders (``--system-site-packages``
would not do: a ``python3`` that is itself a venv hands over its base's packages, not its
own): ``.venv`` with the wheels and decoders (pip run from its staged wheel, offline, so the
host needs no ensurepip), ``build/triton-venv`` with numpy 1.26 and the pytriton wheel; then
``tritonrepo.install`` lays out ``build/triton-server``. Run again, it does nothing when the
manifest is the one it installed.
"""

from __future__ import annotations

import argparse
import ctypes.util
import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "stage"
CACHE = REPO / "build" / "stage-cache"  # jdeps' module list and the jlinked runtime, by input
HOST = REPO / "build" / "host"
VENV = REPO / ".venv"
TRITON_VENV = REPO / "build" / "triton-venv"
MANIFEST = "manifest.json"
MIB = 2**20
PIECE_LIMIT = 60 * MIB  # the bound on one piece
CALL_LIMIT = 64 * MIB  # what the GPU host receives in one call: the checkout and one load
MARGIN = MIB  # for files the checkout gains between staging and sending
MANIFEST_ROOM = 64 * 1024  # each load's copy of the manifest, beside its parts
PINS = (REPO / "requirements.txt", REPO / "requirements-triton.txt")
GPU_REQUIREMENTS = REPO / "requirements-gpu.txt"
# What serving on the host imports beyond torch's own: TorchServe and its archiver, the core
# (psutil, orjson), the build steps (pyyaml, javaproperties), devtools.server and the client the
# benchmark drives it with (requests, tenacity, tabulate, prometheus-client), NVML (the
# benchmark's GPU readings), and pip itself. Not captum: explanations are not on this path.
PROJECT = (
    "torchserve",
    "torch-model-archiver",
    "psutil",
    "orjson",
    "pyyaml",
    "javaproperties",
    "requests",
    "tenacity",
    "tabulate",
    "prometheus-client",
    "nvidia-ml-py==13.615.71",  # not in requirements.txt: nothing here reads a GPU
    "pip",
)
TRITON = ("nvidia-pytriton", "numpy")  # installed without dependencies (Dockerfile's way)
HOST_HAS = ("torch", "torchvision")  # and everything they require
# x86-64 Linux wheels a glibc 2.35 host runs (the pytriton wheel's own floor), newest first.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
PIP_DOWNLOAD = (
    "-m",
    "pip",
    "download",
    "--quiet",
    "--disable-pip-version-check",
    "--only-binary=:all:",
)
PIP_INSTALL = ("install", "--no-index", "--no-compile", "--quiet", "--disable-pip-version-check",
               "--no-warn-script-location")  # fmt: skip
JLINK_OPTIONS = ("--strip-debug", "--no-header-files", "--no-man-pages")
FRONTEND_JAR = Path("ts") / "frontend" / "model-server.jar"
STUB = "pytriton/tritonserver/python_backend_stubs/{python}/triton_python_backend_stub"
CUDART = re.compile(r"nvidia_pytriton\.libs/(libcudart[^/]*\.so[^/]*)$")


class StageError(RuntimeError):
    """Staging or installing cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Piece:
    """One staged file: its ``name`` in the stage (``wheels/x.whl``), where it is now."""

    name: str
    path: Path

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def sha256_of(path: Path, start: int = 0, size: int | None = None) -> str:
    """The sha256 of ``size`` bytes of ``path`` from ``start`` (all of it by default)."""
    digest, left = hashlib.sha256(), size
    with path.open("rb") as f:
        f.seek(start)
        while left is None or left > 0:
            chunk = f.read(MIB if left is None else min(MIB, left))
            if not chunk:
                break
            digest.update(chunk)
            left = None if left is None else left - len(chunk)
    return digest.hexdigest()


def canonical(name: str) -> str:
    """A distribution's name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def run(command: list[str], **options) -> str:
    """``command``'s stdout; ``StageError`` with its stderr's tail when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, **options)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise StageError(f"{' '.join(command[:4])} ... failed ({done.returncode}):\n{tail}")
    return done.stdout


# --------------------------------------------------------------------------- here: Java


def jdk_tool(name: str) -> str:
    """``name`` (jlink, jdeps) of the JDK on ``JAVA_HOME``, else on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / name if home else None
    if found is not None and found.is_file():
        return str(found)
    on_path = shutil.which(name)
    if on_path is None:
        raise StageError(
            f"no {name}: staging the Java runtime needs a JDK 17+ (devtools/ensure_java.sh "
            "installs openjdk-17-jdk-headless; or set JAVA_HOME to one)"
        )
    return on_path


def frontend_jar() -> Path:
    """TorchServe's frontend as the torchserve installed here ships it."""
    spec = importlib.util.find_spec("ts")
    if spec is None or spec.origin is None:
        raise StageError("torchserve is not installed in this Python: run `make setup`")
    return Path(spec.origin).parent.parent / FRONTEND_JAR


def jdk_version() -> str:
    """The JDK's version (``17.0.15``), which the jlinked runtime will have."""
    return run([jdk_tool("jlink"), "--version"]).strip()


def java_modules(jar: Path, cache: Path = CACHE) -> list[str]:
    """The JDK modules ``jar`` uses, as ``jdeps --print-module-deps`` finds them (about 20 s),
    kept in ``cache`` by the jar's sha256 and the JDK's version."""
    version = jdk_version()
    kept = cache / f"java-modules-{sha256_of(jar)[:16]}-{version}.txt"
    if kept.is_file():
        return kept.read_text().split()
    with tempfile.TemporaryDirectory() as unpacked:
        with zipfile.ZipFile(jar) as archive:
            archive.extractall(unpacked, [n for n in archive.namelist() if n.endswith(".class")])
        # A fat jar: the module descriptors of the libraries shaded into it would make jdeps
        # read it as one module requiring modules it does not hold; its classes say it all.
        for descriptor in Path(unpacked).rglob("module-info.class"):
            descriptor.unlink()
        major = version.split(".")[0]
        flags = f"--ignore-missing-deps --multi-release {major} --print-module-deps".split()
        out = run([jdk_tool("jdeps"), *flags, unpacked])
    modules = sorted(out.strip().splitlines()[-1].split(","))
    cache.mkdir(parents=True, exist_ok=True)
    kept.write_text(" ".join(modules) + "\n")
    return modules


def java_runtime(cache: Path = CACHE) -> tuple[Path, dict]:
    """``java.tar.gz`` (one folder ``java/``): the runtime ``jlink`` makes of
    ``java_modules``, kept in ``cache`` by what went into it; and what it is."""
    jar = frontend_jar()
    modules = java_modules(jar, cache)
    about = {"jdk": jdk_version(), "modules": modules, "options": list(JLINK_OPTIONS)}
    key = hashlib.sha256(json.dumps([sha256_of(jar), about]).encode()).hexdigest()[:16]
    tarball = cache / f"java-{key}.tar.gz"
    if not tarball.is_file():
        with tempfile.TemporaryDirectory(dir=cache) as work:
            runtime = Path(work) / "java"
            flags = ["--add-modules", ",".join(modules), *JLINK_OPTIONS]
            run([jdk_tool("jlink"), *flags, "--output", str(runtime)])
            with tarfile.open(Path(work) / "java.tar.gz", "w:gz", compresslevel=6) as tar:
                tar.add(runtime, arcname="java")
            os.replace(Path(work) / "java.tar.gz", tarball)
    return tarball, about


# --------------------------------------------------------------------------- here: wheels


def pins(files: tuple[Path, ...] = PINS) -> dict[str, str]:
    """``{name: "name==version"}`` of every exact pin in ``files``."""
    found = {}
    for path in files:
        for line in path.read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])?==([^\s;#]+)", line)
            if match:
                found[canonical(match[1])] = f"{match[1]}=={match[3]}"
    return found


def pinned(names: tuple[str, ...], exact: dict[str, str]) -> list[str]:
    """Each of ``names`` at its pin in ``exact``, else as written (``name==version``), else at
    the version installed here."""
    from importlib import metadata

    out = []
    for name in names:
        bare = canonical(name.split("==")[0])
        if bare in exact or "==" in name:
            out.append(exact.get(bare, name))
            continue
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            raise StageError(f"{name} is not pinned nor installed here: run `make setup`") from None
    return out


def host_provided(python: str) -> set[str]:
    """``HOST_HAS`` and everything they require (as installed here; markers for ``python``):
    what the host has and the stage leaves out."""
    from importlib import metadata

    from packaging.requirements import Requirement

    todo, seen = list(HOST_HAS), set()
    while todo:
        name = canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            required = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in map(Requirement, required):
            marker = requirement.marker
            if marker is None or marker.evaluate({"python_version": python, "extra": ""}):
                todo.append(requirement.name)
    return seen


def download(
    requirements: list[str],
    dest: Path,
    python: str,
    *,
    deps: bool = True,
    but: frozenset = frozenset(),
) -> list[Path]:
    """``pip download`` of ``requirements`` (and, with ``deps``, what they require) as wheels
    for CPython ``python`` on x86-64 Linux into ``dest``; the wheels there, but those of the
    distributions ``but`` names."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    flags = [*PIP_DOWNLOAD, "--python-version", python, *platforms, "-d", str(dest)]
    run([sys.executable, *flags, *([] if deps else ["--no-deps"]), *requirements], timeout=900)
    return [wheel for wheel in sorted(dest.glob("*.whl")) if wheel_name(wheel) not in but]


def wheel_name(wheel: Path) -> str:
    return canonical(wheel.name.split("-")[0])


def libpython_name(python: str) -> str:
    """The shared library a CPython ``python`` backend stub links (its ``DT_NEEDED``)."""
    return f"libpython{python}.so.1.0"


def found_libpython(python: str, given: Path | None) -> Path | None:
    """``given``, else the shared ``libpython`` of a ``python{X.Y}`` on ``PATH``, else None."""
    if given is not None:
        if given.name != libpython_name(python) or not given.is_file():
            raise StageError(f"--libpython {given}: not a file named {libpython_name(python)}")
        return given
    try:
        folder = run(
            [f"python{python}", "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"]
        )
    except (StageError, OSError):
        return None
    found = Path(folder.strip()) / libpython_name(python)
    return found if found.is_file() else None


def packed_libpython(library: Path, cache: Path) -> Path:
    """``library`` gzipped in ``cache`` (stripped of symbols first where ``strip`` is found)."""
    packed = cache / f"{library.name}-{sha256_of(library)[:16]}.gz"
    if not packed.is_file():
        with tempfile.TemporaryDirectory(dir=cache) as work:
            lean = Path(work) / library.name
            if shutil.which("strip"):
                run(["strip", "--strip-unneeded", "-o", str(lean), str(library)])
            else:
                shutil.copy2(library, lean)
            with lean.open("rb") as source, gzip.open(Path(work) / "packed", "wb", 6) as out:
                shutil.copyfileobj(source, out, MIB)
            os.replace(Path(work) / "packed", packed)
    return packed


def triton_facts(wheel: Path, python: str) -> dict:
    """What the pytriton wheel holds for ``python``: its backend stub and CUDA runtime;
    ``StageError`` when it has no stub for that Python."""
    names = zipfile.ZipFile(wheel).namelist()
    stub = STUB.format(python=python)
    if stub not in names:
        versions = sorted({n.split("/")[3] for n in names if "python_backend_stubs/" in n})
        raise StageError(
            f"{wheel.name} has no backend stub for Python {python} (it has {versions})"
        )
    cudart = [m[1] for n in names if (m := CUDART.search(n))]
    return {"stub": stub, "cuda_runtime": cudart}


def decoder_requirements(path: Path = GPU_REQUIREMENTS) -> tuple[list[str], str]:
    """The decoder wheels' requirements and where they came from."""
    if path.is_file():
        lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
        return [line for line in lines if line], path.name
    return [], f"none (no {path.name})"


# --------------------------------------------------------------------------- here: loads


@dataclass(frozen=True)
class Part:
    """Bytes ``start`` .. ``start + size`` of ``piece``: its part ``index`` of ``count``."""

    piece: Piece
    index: int
    count: int
    start: int
    size: int

    @property
    def name(self) -> str:
        return self.piece.name if self.count == 1 else f"{self.piece.name}.part{self.index + 1:02d}"


def checkout_bytes() -> int:
    """What a call to the GPU host carries of this checkout: its tracked files and untracked
    ones git does not ignore (4 MiB where git cannot say)."""
    try:
        listed = run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"])
    except (StageError, OSError):
        return 4 * MIB
    files = [REPO / name for name in listed.split("\0") if name]
    return sum(path.stat().st_size for path in files if path.is_file())


def load_bytes(checkout: int) -> int:
    """The most one load may hold: a piece's limit, and what a call leaves beside the checkout."""
    budget = min(PIECE_LIMIT, CALL_LIMIT - checkout - MARGIN)
    if budget < 8 * MIB:
        raise StageError(f"the checkout is {checkout / MIB:.1f} MiB: too little of a call is left")
    return budget


def split(piece: Piece, budget: int) -> list[Part]:
    count = max(1, -(-piece.size // budget))
    return [
        Part(piece, i, count, i * budget, min(budget, piece.size - i * budget))
        for i in range(count)
    ]


def pack(parts: list[Part], budget: int) -> list[list[Part]]:
    """``parts`` into as few loads of at most ``budget`` bytes as first-fit decreasing finds."""
    loads: list[list[Part]] = []
    for part in sorted(parts, key=lambda p: (-p.size, p.name)):
        room = next(
            (load for load in loads if sum(p.size for p in load) + part.size <= budget), None
        )
        if room is None:
            loads.append(room := [])
        room.append(part)
    return loads


def write_part(part: Part, dest: Path) -> None:
    """``part``'s bytes at ``dest``: a hard link to a whole piece where the file system allows."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if part.count == 1:
        try:
            os.link(part.piece.path, dest)
            return
        except OSError:
            pass
    with part.piece.path.open("rb") as source, dest.open("wb") as out:
        source.seek(part.start)
        left = part.size
        while left:
            chunk = source.read(min(MIB, left))
            out.write(chunk)
            left -= len(chunk)


def write_loads(pieces: list[Piece], out: Path, budget: int, about: dict) -> dict:
    """``out/load-N/`` from ``pieces``, each with the manifest (also ``out/manifest.json``),
    which it returns: ``about`` with every piece's size and sha256, and its parts'."""
    if out.exists():
        shutil.rmtree(out)
    loads = pack([part for piece in pieces for part in split(piece, budget)], budget)
    entries = {p.name: {"bytes": p.size, "sha256": sha256_of(p.path), "parts": []} for p in pieces}
    for number, load in enumerate(loads, 1):
        for part in load:
            file = f"load-{number}/{part.name}"
            write_part(part, out / file)
            digest = sha256_of(part.piece.path, part.start, part.size)
            entries[part.piece.name]["parts"].append(
                {"index": part.index, "file": file, "bytes": part.size, "sha256": digest}
            )
    for entry in entries.values():
        entry["parts"].sort(key=lambda p: p["index"])
    names = [f"load-{n}" for n in range(1, len(loads) + 1)]
    manifest = {
        **about,
        "load_bytes": budget,
        "loads": names,
        "pieces": dict(sorted(entries.items())),
    }
    text = json.dumps(manifest, indent=2) + "\n"
    for folder in [out, *(out / name for name in manifest["loads"])]:
        (folder / MANIFEST).write_text(text)
    return manifest


def commit() -> str:
    """The commit staged from (``+ uncommitted changes`` when the tree differs)."""
    try:
        head = run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"]).strip()
        dirty = run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    except (StageError, OSError):
        return "unknown"
    return f"{head} + uncommitted changes" if dirty.strip() else head


def stage(
    out: Path = OUT,
    python: str = "3.12",
    *,
    cache: Path = CACHE,
    decoders: Path | None = GPU_REQUIREMENTS,
    libpython: Path | None = None,
) -> dict:
    """The whole stage for a host running CPython ``python`` into ``out`` (module docstring);
    ``decoders``: the requirements file of the decoder wheels (None: none); ``libpython``: a
    shared ``libpythonX.Y.so.1.0`` for a host whose Python has none (None: a ``pythonX.Y`` on
    ``PATH``'s, if any). Its manifest."""
    cache.mkdir(parents=True, exist_ok=True)
    exact, provided = pins(), host_provided(python)
    java, java_about = java_runtime(cache)
    project, triton = pinned(PROJECT, exact), pinned(TRITON, exact)
    wanted, source = decoder_requirements(decoders) if decoders else ([], "left out")
    with tempfile.TemporaryDirectory(dir=cache) as work:
        wheels = download(project, Path(work) / "wheels", python, but=provided)
        found = download(triton, Path(work) / "triton", python, deps=False)
        pytriton = next(w for w in found if wheel_name(w) == "nvidia-pytriton")
        have = provided | {wheel_name(w) for w in wheels}
        extra = download(wanted, Path(work) / "decoders", python, but=have) if wanted else []
        library = found_libpython(python, libpython)
        shared = [] if library is None else [packed_libpython(library, cache)]
        pieces = [
            Piece("java.tar.gz", java),
            *(Piece(f"wheels/{w.name}", w) for w in wheels),
            *(Piece(f"triton/{w.name}", w) for w in found),
            *(Piece(f"decoders/{w.name}", w) for w in extra),
            *(Piece(f"triton/{libpython_name(python)}.gz", p) for p in shared),
        ]
        about = {
            "python": python,
            "commit": commit(),
            "java": java_about,
            "triton": {**triton_facts(pytriton, python), "libpython": library and str(library)},
            "requirements": {"project": project, "triton": triton, "decoders": wanted},
            "decoders_from": source,
            "host_has": sorted(provided),
        }
        return write_loads(pieces, out, load_bytes(checkout_bytes()) - MANIFEST_ROOM, about)


def summary(manifest: dict, out: Path) -> str:
    """What was staged, piece by piece, and the calls that send it."""
    lines = [f"Staged for Python {manifest['python']} from {manifest['commit']} in {out}:"]
    for name, piece in manifest["pieces"].items():
        where = ", ".join(p["file"].split("/")[0] for p in piece["parts"])
        lines.append(f"  {piece['bytes'] / MIB:7.1f} MiB  {name}  ({where})")
    for load in manifest["loads"]:
        size = sum(f.stat().st_size for f in (out / load).rglob("*") if f.is_file())
        lines.append(f"  {load}: {size / MIB:.1f} MiB (of {manifest['load_bytes'] / MIB:.1f})")
    rel = os.path.relpath(out, REPO)
    last = manifest["loads"][-1]
    lines += ["Send each load in its own call to the GPU host, the benchmark with the last:"]
    lines += [
        f"  carry={rel}/{load}: python3 -m buildsteps.stage check"
        for load in manifest["loads"][:-1]
    ]
    lines.append(f"  carry={rel}/{last}: bash bench/gpuserved.sh")
    return "\n".join(lines)


# --------------------------------------------------------------------------- there: install

STAGED = ".staged"  # in a venv ``install`` made (it replaces no other)


def read_manifest(stage_dir: Path = OUT) -> dict:
    """The manifest the loads in ``stage_dir`` carry (all copies must be one staging's)."""
    copies = sorted(stage_dir.glob(f"load-*/{MANIFEST}"))
    if not copies:
        raise StageError(
            f"no load in {stage_dir}: stage here (`make gpu-stage`), then send each "
            f"{os.path.relpath(stage_dir, REPO)}/load-N to this host"
        )
    texts = {path.read_text() for path in copies}
    if len(texts) > 1:
        raise StageError(
            f"the loads in {stage_dir} come from different stagings: send every load of one"
        )
    return json.loads(texts.pop())


def loads_state(manifest: dict, stage_dir: Path = OUT) -> dict[str, str]:
    """Each load: ``here``, ``absent`` (not sent yet) or ``damaged: FILE`` (a part missing
    or not the bytes the manifest says)."""
    state = {
        load: "here" if (stage_dir / load).is_dir() else "absent" for load in manifest["loads"]
    }
    for piece in manifest["pieces"].values():
        for part in piece["parts"]:
            load, path = part["file"].split("/")[0], stage_dir / part["file"]
            if state[load] != "here":
                continue
            if not (path.is_file() and path.stat().st_size == part["bytes"]):
                state[load] = f"damaged: {part['file']} missing or cut short"
            elif sha256_of(path) != part["sha256"]:
                state[load] = f"damaged: {part['file']} is not the staged bytes"
    return state


def join(manifest: dict, stage_dir: Path, host: Path) -> None:
    """Every piece whole under ``host`` (its parts in order, checked against its sha256)."""
    for name, piece in manifest["pieces"].items():
        dest = host / name
        same_size = dest.is_file() and dest.stat().st_size == piece["bytes"]
        if same_size and sha256_of(dest) == piece["sha256"]:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        joining = dest.with_name(dest.name + ".joining")
        with joining.open("wb") as out:
            for part in piece["parts"]:
                with (stage_dir / part["file"]).open("rb") as source:
                    shutil.copyfileobj(source, out, MIB)
        if sha256_of(joining) != piece["sha256"]:
            joining.unlink()
            raise StageError(f"{name}: its parts joined are not the staged file (stage again)")
        os.replace(joining, dest)


def host_sites() -> list[str]:
    """The folders this interpreter finds packages in, in its order: ``sys.path`` without the
    standard library and the working folder."""
    paths = (sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"), os.getcwd(), REPO)
    skip = {os.path.realpath(p) for p in paths}
    return [
        path
        for path in dict.fromkeys(sys.path)
        if path
        and os.path.isdir(path)
        and os.path.realpath(path) not in skip
        and not path.endswith("lib-dynload")
    ]


def make_venv(path: Path, sites: list[str]) -> Path:
    """A venv at ``path`` (one ``install`` made before is replaced, no other) whose
    ``host-packages.pth`` adds ``sites`` after its own packages; its python."""
    if path.exists():
        if not (path / STAGED).is_file():
            raise StageError(
                f"{path} exists and `stage install` did not make it: move it away "
                "(the install makes it anew), or install into a fresh checkout"
            )
        shutil.rmtree(path)
    run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    site = next(path.glob("lib/python3*/site-packages"))
    (site / "host-packages.pth").write_text("".join(f"{s}\n" for s in sites))
    (path / STAGED).write_text(f"made by `stage install` with {sys.executable}\n")
    return path / "bin" / "python"


def pip_install(
    python: Path, pip: Path, folders: list[Path], requirements: list[str], *, deps: bool = True
) -> None:
    """``requirements`` into ``python``'s venv from the wheels in ``folders`` alone, by the
    pip of the wheel ``pip`` (which runs from its wheel)."""
    links = [f"--find-links={folder}" for folder in folders if folder.is_dir()]
    flags = [*PIP_INSTALL, *links, *([] if deps else ["--no-deps"])]
    # No pip configuration of this machine's (an index, find-links) may stand in for the stage.
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    run([str(python), str(pip / "pip"), *flags, *requirements], timeout=900, env=env)


def unpack_java(host: Path) -> Path:
    """``host/java`` from ``host/java.tar.gz``; its ``bin/java``, checked to start."""
    shutil.rmtree(host / "java", ignore_errors=True)
    with tarfile.open(host / "java.tar.gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(host, filter="data")
        else:  # Python before 3.11.4: the archive is our own
            tar.extractall(host)
    java = host / "java" / "bin" / "java"
    run([str(java), "-version"])
    return java


def has_libpython(python: str) -> bool:
    """Whether this Python's shared ``libpython`` is where the stub finds it: its ``LIBDIR``
    (Triton's launcher puts that on ``LD_LIBRARY_PATH``) or the dynamic loader's cache."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and (Path(libdir) / libpython_name(python)).is_file():
        return True
    return ctypes.util.find_library(f"python{python}") is not None


def lend_libpython(triton_venv: Path, packed: Path, python: str) -> None:
    """Where this Python has no shared ``libpython`` (a distribution's static build), the
    staged one, among the wheel's libraries (on ``LD_LIBRARY_PATH`` when Triton runs)."""
    if has_libpython(python):
        return
    if not packed.is_file():
        print(f"stage install: no {libpython_name(python)} here nor staged: Triton's backend "
              "stub cannot start (stage with --libpython)", file=sys.stderr)  # fmt: skip
        return
    libs = next(triton_venv.glob("lib/python3*/site-packages")) / "nvidia_pytriton.libs"
    with gzip.open(packed) as source, (libs / libpython_name(python)).open("wb") as out:
        shutil.copyfileobj(source, out, MIB)
    (libs / libpython_name(python)).chmod(0o755)


def install(
    stage_dir: Path = OUT, host: Path = HOST, *, venv: Path = VENV, triton_venv: Path = TRITON_VENV
) -> dict:
    """The staged pieces installed on this host (module docstring); the manifest."""
    manifest = read_manifest(stage_dir)
    python = "{}.{}".format(*sys.version_info[:2])
    if manifest["python"] != python:
        raise StageError(
            f"staged for Python {manifest['python']}, but {sys.executable} is {python}: run "
            f"this with a Python {manifest['python']}, or stage for {python} "
            f"(python -m buildsteps.stage --python {python})"
        )
    if importlib.util.find_spec("torch") is None:
        raise StageError(f"{sys.executable} has no torch: run this with the Python that has it")
    state = {load: s for load, s in loads_state(manifest, stage_dir).items() if s != "here"}
    if state:
        raise StageError(
            "not every load is here: " + "; ".join(f"{k} {v}" for k, v in state.items())
        )
    marker = host / ".installed"
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    done = marker.is_file() and marker.read_text() == digest
    if done and (venv / STAGED).is_file() and (triton_venv / STAGED).is_file():
        return manifest
    join(manifest, stage_dir, host)
    unpack_java(host)
    sites = host_sites()
    requirements = manifest["requirements"]
    pip = next((host / "wheels").glob("pip-*.whl"))
    project = make_venv(venv, sites)
    wanted = requirements["project"] + requirements["decoders"]
    pip_install(project, pip, [host / "wheels", host / "decoders"], wanted)
    triton = make_venv(triton_venv, sites)
    pip_install(triton, pip, [host / "triton"], requirements["triton"], deps=False)
    lend_libpython(triton_venv, host / "triton" / f"{libpython_name(python)}.gz", python)
    run([str(project), "-m", "tritonrepo.install"], cwd=REPO)
    marker.write_text(digest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m buildsteps.stage",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command", nargs="?", default="stage", choices=("stage", "check", "install")
    )
    parser.add_argument("--python", default="3.12", help="the host's Python, X.Y (stage; 3.12)")
    parser.add_argument("--out", type=Path, default=OUT, help="the stage's folder (build/stage)")
    parser.add_argument(
        "--decoders",
        type=Path,
        default=GPU_REQUIREMENTS,
        help="the GPU decoder wheels' requirements (requirements-gpu.txt)",
    )
    parser.add_argument("--no-decoders", action="store_true", help="stage no decoder wheels")
    parser.add_argument(
        "--libpython",
        type=Path,
        help="a shared libpythonX.Y.so.1.0 for a host whose Python has none (default: a "
        "pythonX.Y on PATH's, if any)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "stage":
            decoders = None if args.no_decoders else args.decoders
            manifest = stage(args.out, args.python, decoders=decoders, libpython=args.libpython)
            print(summary(manifest, args.out))
        elif args.command == "check":
            state = loads_state(read_manifest(args.out), args.out)
            for load, found in state.items():
                print(f"{load}: {found}")
            return 1 if any(s.startswith("damaged") for s in state.values()) else 0
        else:
            manifest = install(args.out)
            print(
                f"installed the stage of {manifest['commit']}: .venv, build/triton-venv, "
                f"build/triton-server, Java in {os.path.relpath(HOST / 'java', REPO)}"
            )
    except StageError as error:
        print(f"stage {args.command}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
