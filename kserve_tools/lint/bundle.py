"""Rules for a storage bundle (``make kserve-bundle``): ``config/config.properties`` names
exactly the archives in ``model-store/`` (model names and versions from each archive's
manifest) and the models of ``config/models``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import javaproperties

from buildsteps.configgen import repo_models
from kserve_tools.lint.base import Finding, Problem, rel
from model_files.artifacts import read_manifest

REBUILD = "rebuild with `make kserve-bundle`"


def bundle_findings(bundle: Path, models: dict[str, dict] | None = None) -> list[Finding]:
    """The bundle's config.properties against its archives and config/models."""
    models = repo_models() if models is None else models
    return [
        Finding(rel(Path(bundle)), "bundle", *problem)
        for problem in bundle_problems(Path(bundle), models)
    ]


def bundle_problems(bundle: Path, models: dict[str, dict]) -> Iterator[Problem]:
    needed = [
        bundle / "config" / name
        for name in ("config.properties", "metrics.yaml", "readiness.py", "serve.sh")
    ]
    missing = [path for path in needed if not path.is_file()]
    for path in missing:
        yield Problem(str(path.relative_to(bundle)), "missing", REBUILD)
    if missing:
        return
    properties = javaproperties.loads((bundle / "config" / "config.properties").read_text())
    entries = json.loads(properties.get("models", "{}"))
    archives = {}
    for mar in sorted((bundle / "model-store").glob("*.mar")):
        manifest = read_manifest(mar)
        archives[mar.name] = (manifest["modelName"], manifest["modelVersion"])
    if set(entries) != set(models):
        yield Problem(
            "config/config.properties: models",
            f"{sorted(entries)} are not the models of config/models ({sorted(models)})",
            REBUILD,
        )
    load = [m for m in properties.get("load_models", "").split(",") if m]
    if sorted(load) != sorted(archives):
        yield Problem(
            "config/config.properties: load_models",
            f"{load} != the archives in model-store {sorted(archives)}",
            REBUILD,
        )
    for name, versions in entries.items():
        for version, entry in versions.items():
            mar = entry.get("marName")
            if archives.get(mar) != (name, version):
                yield Problem(
                    f"config/config.properties: models.{name}.{version}.marName",
                    f"{mar} holds {archives.get(mar, 'nothing (missing)')}, not "
                    f"({name!r}, {version!r})",
                    f"{REBUILD} (model names and versions come from the archives)",
                )
