"""Rules for a LocalModelCache (kserve/localmodel): the CRD schema of
``../shared/reference/kserve/localmodelcache-v1alpha1.schema.json`` made strict (as the
InferenceService's, ``schema.strict``), then ours: a ``sourceModelUri`` KServe's download Jobs
can fetch (they run the storage initializer: no ``oci://``, which the nodes' image stores keep
anyway) and that kserve/base's InferenceService uses, by KServe's own match
(``LocalModelCacheSpec.MatchStorageURI``: the same URI, trailing ``/`` aside, or one below it),
or the cache serves nobody. KServe's webhook adds one rule across objects (no two caches of
one URI), which a single manifest cannot break."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator

from kserve_tools.lint.base import KSERVE, Finding, Problem, finding, stamped
from kserve_tools.lint.inferenceservice import STORAGE_PREFIXES
from kserve_tools.lint.schema import SCHEMA, strict
from kserve_tools.render import Resource, render

API = "serving.kserve.io/v1alpha1"
LOCALMODEL_SCHEMA = SCHEMA.parent / "localmodelcache-v1alpha1.schema.json"
BASE_ISVC = KSERVE / "base" / "inferenceservice.yaml"
DOWNLOADABLE = tuple(p for p in STORAGE_PREFIXES if not p.startswith("oci"))


def localmodel_findings(resource: Resource) -> list[Finding]:
    """The strict schema's complaints and ours about one LocalModelCache."""
    schema = [
        finding(
            resource,
            ".".join(map(str, e.absolute_path)) or "<root>",
            e.message,
            "see the LocalModelCache CRD schema for this field",
        )
        for e in validator().iter_errors(resource.obj)
    ]
    return schema + stamped(resource, cache_problems(resource.obj))


def cache_problems(obj: dict) -> Iterator[Problem]:
    if obj.get("apiVersion") != API:
        yield Problem("apiVersion", f"{obj.get('apiVersion')!r}, not {API}", f"apiVersion: {API}")
    uri = str((obj.get("spec") or {}).get("sourceModelUri") or "")
    if not uri.startswith(DOWNLOADABLE):
        yield Problem(
            "spec.sourceModelUri",
            f"{uri!r}: KServe's download Jobs (the storage initializer) fetch "
            f"{', '.join(DOWNLOADABLE)} only",
            "cache the bundle's s3:// folder; an oci:// modelcar is kept by the nodes' image "
            "store (kserve/overlays/modelcar)",
        )
        return
    used = base_storage_uri()
    if not matches(uri, used):
        yield Problem(
            "spec.sourceModelUri",
            f"{uri!r} is not kserve/base's storageUri {used!r} nor above it: no "
            "InferenceService would use the cache",
            f"set it to {used}",
        )


def matches(cached: str, storage_uri: str) -> bool:
    """KServe's MatchStorageURI: ``storage_uri`` is ``cached`` or a folder below it."""
    cached, storage_uri = cached.rstrip("/"), storage_uri.rstrip("/")
    return storage_uri == cached or storage_uri.startswith(cached + "/")


@functools.cache
def base_storage_uri() -> str:
    [isvc] = render(BASE_ISVC)
    return str(isvc.obj["spec"]["predictor"]["model"].get("storageUri", ""))


@functools.cache
def validator():
    """A Draft 7 validator of the strict LocalModelCache schema."""
    import jsonschema

    if not LOCALMODEL_SCHEMA.is_file():
        raise SystemExit(
            f"LocalModelCache CRD schema not found at {LOCALMODEL_SCHEMA} (the shared "
            "reference folder ../shared/reference/kserve/)"
        )
    return jsonschema.Draft7Validator(strict(json.loads(LOCALMODEL_SCHEMA.read_text())))
