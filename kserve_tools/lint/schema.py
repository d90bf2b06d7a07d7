"""The InferenceService CRD schema (``../shared/reference/kserve/``) made strict: unknown fields
refused, as ``kubeconform -strict`` would."""

from __future__ import annotations

import copy
import json
from functools import lru_cache

from buildsteps.configgen import REPO
from kserve_tools.lint.base import Finding, finding
from kserve_tools.render import Resource

SCHEMA = REPO.parent / "shared" / "reference" / "kserve" / "inferenceservice-v1beta1.schema.json"


def strict(schema: dict) -> dict:
    """A copy of ``schema`` that refuses unknown fields (like kubeconform -strict):
    ``additionalProperties: false`` on every object schema that lists ``properties`` and does
    not preserve unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if (
            isinstance(node.get("properties"), dict)
            and not node.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in node
        ):
            node["additionalProperties"] = False
        for sub in (node.get("properties") or {}).values():
            walk(sub)
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                walk(node[key])
        for key in ("anyOf", "allOf", "oneOf", "items"):
            if isinstance(node.get(key), list):
                for sub in node[key]:
                    walk(sub)

    walk(schema)
    return schema


@lru_cache(maxsize=1)
def schema_validator():
    """A Draft 7 validator of the strict InferenceService schema."""
    import jsonschema

    if not SCHEMA.is_file():
        raise SystemExit(
            f"KServe CRD schema not found at {SCHEMA}: the shared reference folder "
            "../shared/reference/kserve/ (next to the repository) must hold "
            "inferenceservice-v1beta1.schema.json"
        )
    schema = strict(json.loads(SCHEMA.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_findings(resource: Resource) -> list[Finding]:
    """The strict CRD schema's complaints about one InferenceService."""
    found = []
    for error in sorted(
        schema_validator().iter_errors(resource.obj), key=lambda e: list(map(str, e.absolute_path))
    ):
        path = ".".join(map(str, error.absolute_path)) or "<root>"
        fix = (
            "remove or rename the field (unknown fields are dropped by the API server, "
            "so the setting would be lost)"
            if error.validator == "additionalProperties"
            else "see the InferenceService CRD schema for this field"
        )
        found.append(finding(resource, path, error.message, fix))
    return found
