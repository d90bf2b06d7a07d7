"""What every rule module of the lint shares: the record of a problem, where the manifests
live, and the names and fields KServe and Kubernetes use.

A rule is a function of an object's fields that yields ``Problem``s (field path, what is
wrong, how to fix it); ``stamped`` turns them into ``Finding``s naming the file and object.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import javaproperties

from buildsteps.configgen import REPO
from kserve_tools.render import Resource

KSERVE = REPO / "kserve"
RUNTIME_DIR = KSERVE / "runtime"
TRITON_RUNTIME_DIR = KSERVE / "triton-runtime"  # our Triton runtime, the same image
RUNTIME_SERVER_PROPERTIES = RUNTIME_DIR / "server.properties"
MOUNT = "/mnt/models"  # where KServe's storage initializer puts storageUri

NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
IMPLEMENTATIONS = (
    "model",
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "huggingface",
    "pmml",
    "lightgbm",
    "paddle",
)
MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
# The mutating webhook rewrites the deprecated names before anything else reads them.
MODES = {
    "Standard": "Standard",
    "RawDeployment": "Standard",
    "Knative": "Knative",
    "Serverless": "Knative",
    "ModelMesh": "ModelMesh",
}
DEFAULT_MODE = "Standard"
BLOCKED_ENV = ("PYTHONPATH",)
OUR_RUNTIME = "resnet50-torchserve"
OUR_TRITON_RUNTIME = "resnet50-triton"
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe labels every predictor pod with it


class Problem(NamedTuple):
    """What a rule found: the field path, what is wrong, how to fix it."""

    path: str
    problem: str
    fix: str


@dataclass(frozen=True)
class Finding:
    """One problem: where (file, object, field path), what, and how to fix it."""

    source: str
    obj: str
    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.source}: {self.obj}: {self.path}: {self.problem}; fix: {self.fix}"


def finding(resource: Resource, path: str, problem: str, fix: str) -> Finding:
    """One finding about a rendered object."""
    return Finding(rel(resource.source), f"{resource.kind} {resource.name}", path, problem, fix)


def stamped(resource: Resource, problems: Iterable[Problem]) -> list[Finding]:
    """``problems`` of one rendered object as findings naming its file and object."""
    return [finding(resource, *problem) for problem in problems]


def rel(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def mode(annotations: dict) -> str | None:
    """The deployment mode an InferenceService's annotations select (None: not a mode)."""
    return MODES.get(str(annotations.get(MODE_ANNOTATION, DEFAULT_MODE)))


def server_properties(path: Path = RUNTIME_SERVER_PROPERTIES) -> dict[str, str]:
    """Our runtime's TorchServe settings (kserve/runtime/server.properties)."""
    return javaproperties.loads(Path(path).read_text())


def port(address: str) -> int:
    """The port of a TorchServe address (``http://0.0.0.0:8080``)."""
    return int(address.rstrip("/").rsplit(":", 1)[1])
