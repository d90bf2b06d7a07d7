"""The objects of kserve/'s manifests, as ``kubectl apply -k`` / ``-f`` would send them.

Kustomization folders are rendered by ``kubectl kustomize`` itself (the tool users apply
with; ``devtools/ensure_kubectl.sh`` installs it), plain YAML files are read as they are.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

KUBECTL = "kubectl"


class RenderError(RuntimeError):
    """A folder ``kubectl kustomize`` could not render (the message names it and says why)."""


@dataclass
class Resource:
    """One rendered object and the kustomization.yaml (or YAML file) it was rendered from."""

    source: Path
    obj: dict

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name", ""))


def kustomize(folder: Path) -> list[dict]:
    """The non-empty YAML documents ``kubectl kustomize FOLDER`` prints; RenderError when
    kubectl is missing or refuses the folder (with kubectl's stderr)."""
    if shutil.which(KUBECTL) is None:
        raise RenderError(
            f"{folder}: kubectl not found; it renders kserve/'s kustomizations "
            "(`make kubectl` installs it)"
        )
    done = subprocess.run(
        [KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RenderError(
            f"{folder}: kubectl kustomize failed (exit {done.returncode}): {done.stderr.strip()}"
        )
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def render(path: Path) -> list[Resource]:
    """Every object of a kustomization folder (via :func:`kustomize`) or of a plain YAML file;
    a folder's objects name its kustomization.yaml as their source."""
    path = Path(path)
    if path.is_file():
        docs = yaml.safe_load_all(path.read_text())
        return [Resource(path, d) for d in docs if d is not None]
    return [Resource(path / "kustomization.yaml", d) for d in kustomize(path)]
