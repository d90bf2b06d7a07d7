"""A bare GPU host played on this machine, to rehearse what is sent to one: a Python that sees
only torch, torchvision and what they require (numpy, Pillow, ...), and a copy of the working
tree as the device tool sends it, the stage's loads inside.

    python -m devtools.barehost [--out build/rehearse]      # make bench-gpu-served-rehearsal

The Python: a venv of this machine's base interpreter (``sys._base_executable``: the project
venv's own packages stay out) whose ``torch.pth`` names ``site/``, a folder of symbolic links
to exactly those distributions of the project venv (their files and their ``.dist-info``, so
pip sees them installed), as ``pip install torch torchvision`` would leave a host. The tree:
the files git tracks and the untracked ones it does not ignore, copied (what a call to the
device carries), then ``build/stage/load-N`` from ``python -m buildsteps.stage --python`` this
Python's version. ``rehearse`` runs ``bench/gpuserved.sh`` there with that Python.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from buildsteps import stage

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "rehearse"


def torch_site(folder: Path) -> Path:
    """``folder`` holding links to the installed files of ``stage.host_provided``'s
    distributions (torch, torchvision and what they require), and their metadata."""
    python = "{}.{}".format(*sys.version_info[:2])
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name in sorted(stage.host_provided(python)):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        root = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or ()}
        for top in sorted(t for t in tops if t != ".." and (root / t).exists()):
            link = folder / top
            if not link.exists():
                link.symlink_to(root / top)
    return folder


def bare_python(out: Path) -> Path:
    """A venv at ``out/python`` that sees the base interpreter's standard library and
    ``torch_site(out / "site")`` only; its python."""
    site = torch_site(out / "site")
    venv = out / "python"
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = next(venv.glob("lib/python3*/site-packages"))
    (packages / "torch.pth").write_text(f"{site}\n")
    return venv / "bin" / "python"


def copy_tree(dest: Path) -> Path:
    """This working tree as a call to the device carries it (no ``.git``, nothing ignored)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    shutil.rmtree(dest, ignore_errors=True)
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def rehearse(out: Path, args: list[str]) -> int:
    """The tree and the Python in ``out``, the stage for that Python, then
    ``bench/gpuserved.sh args`` run there; its exit status."""
    python = bare_python(out)
    tree = copy_tree(out / "tree")
    version = "{}.{}".format(*sys.version_info[:2])
    manifest = stage.stage(tree / "build" / "stage", version)
    print(stage.summary(manifest, tree / "build" / "stage"), file=sys.stderr)
    env = {**os.environ, "HOST_PYTHON": str(python)}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(["bash", "bench/gpuserved.sh", *args], cwd=tree, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.barehost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("args", nargs="*", help="bench/gpuserved.sh's arguments")
    options = parser.parse_args(argv)
    return rehearse(options.out.resolve(), options.args)


if __name__ == "__main__":
    raise SystemExit(main())
