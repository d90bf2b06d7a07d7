"""Render this repository's kustomizations offline, as ``kubectl kustomize DIR`` would.

Only the subset ``kserve/`` uses is implemented, and anything else is refused rather than
silently mis-rendered: ``resources`` (YAML files and folders holding a kustomization.yaml),
``patches`` with an inline JSON 6902 ``patch`` and a ``target`` of ``kind`` and ``name``, and
``images`` (``name`` -> ``newName``/``newTag``) on kustomize's default image paths. The lint
(``kserve_tools.lint``) and the tests read the manifests through :func:`render`, so CI needs
no kustomize binary; a cluster applies the same folders with ``kubectl apply -k``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import jsonpatch
import yaml

KUSTOMIZATION = "kustomization.yaml"
SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "patches", "images"}
# kustomize's default fieldSpecs for `images` (any kind).
IMAGE_PATHS = (("spec", "containers"), ("spec", "initContainers"),
               ("spec", "template", "spec", "containers"),
               ("spec", "template", "spec", "initContainers"))


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render (the message names the file and why)."""


@dataclass
class Resource:
    """One rendered object and the kustomization (or file) it was rendered from."""

    source: Path
    obj: dict

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name", ""))


def load_yaml_documents(path: Path) -> list[dict]:
    """The non-empty YAML documents of one file."""
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]


def render(path: Path) -> list[Resource]:
    """Every object of a kustomization folder (or a plain YAML file), patched and re-imaged."""
    path = Path(path)
    if path.is_file():
        return [Resource(path, d) for d in load_yaml_documents(path)]
    kfile = path / KUSTOMIZATION
    if not kfile.is_file():
        raise KustomizeError(f"{path}: no {KUSTOMIZATION}")
    spec = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(spec) - SUPPORTED_KEYS
    if unknown:
        raise KustomizeError(f"{kfile}: keys {sorted(unknown)} are not supported by "
                             f"kserve_tools.kustomize (supported: {sorted(SUPPORTED_KEYS)})")
    resources = []
    for entry in spec.get("resources") or []:
        for resource in render(path / entry):
            resources.append(Resource(kfile, copy.deepcopy(resource.obj)))
    for index, patch in enumerate(spec.get("patches") or []):
        _apply_patch(kfile, index, patch, resources)
    for image in spec.get("images") or []:
        for resource in resources:
            _set_image(resource.obj, image)
    return resources


def _apply_patch(kfile: Path, index: int, patch: dict, resources: list[Resource]) -> None:
    target = patch.get("target") or {}
    if set(target) - {"kind", "name"} or "patch" not in patch or set(patch) - {"target", "patch"}:
        raise KustomizeError(f"{kfile}: patches[{index}] must be {{target: {{kind, name}}, "
                             "patch: <JSON 6902 operations>}")
    matches = [r for r in resources
               if r.kind == target.get("kind", r.kind) and r.name == target.get("name", r.name)]
    if not matches:
        raise KustomizeError(f"{kfile}: patches[{index}] target {target} matches no resource")
    operations = yaml.safe_load(patch["patch"])
    for resource in matches:
        try:
            resource.obj = jsonpatch.apply_patch(resource.obj, operations)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise KustomizeError(f"{kfile}: patches[{index}] on {resource.kind} "
                                 f"{resource.name}: {exc}") from exc


def _set_image(obj: dict, image: dict) -> None:
    for path in IMAGE_PATHS:
        node = obj
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        for container in node or []:
            name, tag = split_image(str(container.get("image", "")))
            if name == image["name"]:
                new_name = image.get("newName", name)
                new_tag = image.get("newTag", tag)
                container["image"] = f"{new_name}:{new_tag}" if new_tag else new_name


def split_image(image: str) -> tuple[str, str]:
    """``registry:5000/repo/name:tag`` -> (``registry:5000/repo/name``, ``tag``); tag may be ''."""
    head, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, ""
    return head, tag
