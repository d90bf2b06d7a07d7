"""The Triton server from the pinned ``nvidia-pytriton`` wheel, laid out to run on its own.

    python -m tritonrepo.install          # after `pip install -r requirements-triton.txt`
                                          # into build/triton-venv (make triton-server does both)

The wheel bundles ``tritonserver`` 2.51 with only the Python backend, one backend stub per
Python version, and the libraries they link (``nvidia_pytriton.libs/``). This copies the
server into ``build/triton-server/`` with the stub of the venv's Python in
``backends/python/``, and puts a ``.pth`` into the venv pointing at the project's venv.

Why two venvs: the wheel's stub passes tensors to Python through numpy 1's C layout (numpy 2
hands it garbage) and the wheel pins ``numpy<2``, while the project's venv has numpy 2. The
stub's interpreter takes its ``sys.path`` from the first ``python3`` on ``PATH``
(``Triton.env`` puts this venv's first): numpy 1 from here, then torch, OpenVINO and Pillow
from the project's venv through the ``.pth`` (numpy 2-built wheels run on numpy 1.26).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "build" / "triton-venv"
SERVER = REPO / "build" / "triton-server"
PROJECT_VENV = REPO / ".venv"
PTH = "resnet50-serve-project.pth"


class NotInstalled(RuntimeError):
    """The Triton venv or server is missing; the message says which make target builds it."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the Triton pieces live: the venv holding the wheel and the server folder."""

    venv: Path = VENV
    server: Path = SERVER

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def site_packages(self) -> Path:
        found = sorted(self.venv.glob("lib/python3.*/site-packages"))
        if not found:
            raise NotInstalled(f"no Python venv at {self.venv}: run `make triton-server`")
        return found[0]

    @property
    def wheel(self) -> Path:
        """The wheel's ``tritonserver`` folder."""
        return self.site_packages() / "pytriton" / "tritonserver"

    @property
    def libs(self) -> Path:
        return self.site_packages() / "nvidia_pytriton.libs"

    @property
    def binary(self) -> Path:
        return self.server / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        return self.server / "backends" / "python" / "triton_python_backend_stub"

    def check(self) -> None:
        """Raise ``NotInstalled`` unless the server, its stub and the wheel's libraries are
        there."""
        for path in (self.binary, self.stub, self.libs):
            if not path.exists():
                raise NotInstalled(
                    f"{path} is missing: run `make triton-server` "
                    "(nvidia-pytriton in build/triton-venv)"
                )

    def python_libdir(self) -> str:
        """The folder of the venv interpreter's ``libpython3.X.so``, which the stub links."""
        return subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()


def install(triton: TritonInstall = TritonInstall(), project_venv: Path = PROJECT_VENV) -> None:
    """Lay out ``triton.server`` from the wheel and link the project's venv into the Triton
    venv. Both venvs must run the same Python (the stub loads the project's compiled wheels)."""
    version = _python_version(triton.python)
    if version != _python_version(project_venv / "bin" / "python"):
        raise SystemExit(
            f"{triton.venv} runs Python {version} but {project_venv} does not: "
            "build both with the same interpreter (make PYTHON=...)"
        )
    lay_out(triton.wheel, triton.server, version)
    project_site = next((project_venv / "lib").glob(f"python{version}/site-packages"))
    (triton.site_packages() / PTH).write_text(f"{project_site.resolve()}\n")


def lay_out(wheel: Path, server: Path, version: str) -> None:
    """``server``, replaced whole: the wheel's ``tritonserver`` folder ``wheel`` with only
    Python ``version``'s backend stub, where ``TritonInstall.stub`` looks for it."""
    stub = wheel / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise SystemExit(f"nvidia-pytriton has no Python backend stub for Python {version}")
    if server.exists():
        shutil.rmtree(server)
    ignored = shutil.ignore_patterns("python_backend_stubs", "__pycache__")
    shutil.copytree(wheel, server, ignore=ignored)
    shutil.copy2(stub, TritonInstall(server=server).stub)


def _python_version(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def main() -> int:
    install()
    print(f"tritonserver ready in {SERVER}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
