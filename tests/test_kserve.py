"""The KServe deployment, offline: both InferenceService manifests against the CRD schema (made
strict, like kubeconform -strict) plus the webhook rules the schema leaves out, and
kserve/config.properties in step with config/config.properties and the archives."""
from __future__ import annotations

import copy
import json
import re
import zipfile
from pathlib import Path

import javaproperties
import pytest
import yaml

from tests.conftest import MODELS, REPO

KSERVE = REPO / "kserve"
MANIFESTS = ("inferenceservice.yaml", "inferenceservice-gpu.yaml")
SCHEMA = REPO.parent / "shared" / "reference" / "kserve" / "inferenceservice-v1beta1.schema.json"
VERSION = "1.0"  # archive.sh's default VERSION, the key of every models={...} entry
PER_MODEL = ("batchSize", "maxBatchDelay", "minWorkers", "maxWorkers", "responseTimeout")

# The default ClusterServingRuntime for modelFormat pytorch (kserve/kserve
# config/runtimes/kserve-torchserve.yaml, v0.13-v0.15): its protocols, its Prometheus port.
RUNTIME = "kserve-torchserve"
RUNTIME_PROTOCOLS = {"v1", "v2", "grpc-v2"}
PROMETHEUS_PORT = 8082
# Webhook rules (pkg/apis/serving/v1beta1/inference_service_validation.go, and the storage URI
# check in pkg/controller/v1beta1/inferenceservice/utils/utils.go).
ISVC_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
STORAGE_PREFIXES = ("gs://", "s3://", "pvc://", "file://", "https://", "http://", "hdfs://",
                    "webhdfs://", "oci://")
PREDICTOR_IMPLEMENTATIONS = ("model", "sklearn", "xgboost", "tensorflow", "pytorch", "triton",
                             "onnx", "huggingface", "pmml", "lightgbm", "paddle")


def strict(schema: dict) -> dict:
    """A copy of ``schema`` that refuses unknown fields: ``additionalProperties: false`` on every
    object schema that lists ``properties`` and does not preserve unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if (isinstance(node.get("properties"), dict)
                and not node.get("x-kubernetes-preserve-unknown-fields")
                and "additionalProperties" not in node):
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


@pytest.fixture(scope="module")
def validator():
    try:
        import jsonschema
    except ImportError:
        pytest.fail("tests/test_kserve.py needs the jsonschema package: "
                    "`.venv/bin/pip install jsonschema` (it belongs in requirements.txt)")
    if not SCHEMA.is_file():
        pytest.fail(f"KServe CRD schema not found at {SCHEMA}: the shared reference folder "
                    "../shared/reference/kserve/ (next to the repository) must hold "
                    "inferenceservice-v1beta1.schema.json")
    schema = strict(json.loads(SCHEMA.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def load_manifest(name: str) -> dict:
    documents = [d for d in yaml.safe_load_all((KSERVE / name).read_text()) if d is not None]
    assert len(documents) == 1, f"{name}: expected one YAML document, found {len(documents)}"
    return documents[0]


def schema_errors(validator, manifest: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))]


def webhook_errors(manifest: dict) -> list[str]:
    """What KServe's webhook and controller refuse but the CRD schema lets through."""
    errors = []
    if manifest.get("apiVersion") != "serving.kserve.io/v1beta1":
        errors.append(f"apiVersion {manifest.get('apiVersion')!r} is not serving.kserve.io/v1beta1")
    if manifest.get("kind") != "InferenceService":
        errors.append(f"kind {manifest.get('kind')!r} is not InferenceService")
    name = (manifest.get("metadata") or {}).get("name", "")
    if not ISVC_NAME.match(str(name)):
        errors.append(f"metadata.name {name!r} does not match {ISVC_NAME.pattern}")
    predictor = (manifest.get("spec") or {}).get("predictor") or {}
    implementations = [k for k in PREDICTOR_IMPLEMENTATIONS if k in predictor]
    if implementations != ["model"]:
        errors.append(f"predictor must have exactly one implementation, `model`; has {implementations}")
    model = predictor.get("model") or {}
    model_format = model.get("modelFormat")
    if not isinstance(model_format, dict) or not model_format.get("name"):
        errors.append("predictor.model.modelFormat.name is missing")
    elif model_format["name"] != "pytorch":
        errors.append(f"modelFormat {model_format['name']!r}: the TorchServe runtime serves 'pytorch'")
    if model.get("runtime", RUNTIME) != RUNTIME:
        errors.append(f"runtime {model.get('runtime')!r} is not {RUNTIME}")
    protocol = model.get("protocolVersion")
    if protocol not in RUNTIME_PROTOCOLS:
        errors.append(f"protocolVersion {protocol!r} not in {sorted(RUNTIME_PROTOCOLS)}")
    storage_uri = model.get("storageUri")
    if not isinstance(storage_uri, str) or not storage_uri.startswith(STORAGE_PREFIXES):
        errors.append(f"storageUri {storage_uri!r} has no supported prefix {STORAGE_PREFIXES}")
    return errors


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_passes_the_strict_crd_schema(validator, name):
    errors = schema_errors(validator, load_manifest(name))
    assert not errors, f"kserve/{name} fails the InferenceService schema:\n" + "\n".join(errors)


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_passes_the_webhook_rules(name):
    errors = webhook_errors(load_manifest(name))
    assert not errors, f"kserve/{name}:\n" + "\n".join(errors)


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_pins_our_torchserve_and_sizes_resources(name):
    model = load_manifest(name)["spec"]["predictor"]["model"]
    pinned = re.search(r"^torchserve==(\S+)$", (REPO / "requirements.txt").read_text(), re.M)
    gpu = name.endswith("-gpu.yaml")
    # KServe uses runtimeVersion as the image tag verbatim (no "-gpu" added once it is set).
    assert model["runtimeVersion"] == pinned.group(1) + ("-gpu" if gpu else "")
    resources = model["resources"]
    # Guaranteed QoS; for nvidia.com/gpu Kubernetes requires requests == limits anyway.
    assert resources["requests"] == resources["limits"]
    assert ("nvidia.com/gpu" in resources["limits"]) == gpu
    if gpu:
        assert str(resources["limits"]["nvidia.com/gpu"]) == "1"


def test_strict_schema_refuses_unknown_fields_and_webhook_rules_catch_the_rest(validator):
    """The checks themselves: a misspelled field, a missing modelFormat, a bad protocol."""
    manifest = load_manifest(MANIFESTS[0])
    misspelled = copy.deepcopy(manifest)
    model = misspelled["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")
    assert any("storageURI" in e for e in schema_errors(validator, misspelled))
    no_format = copy.deepcopy(manifest)
    del no_format["spec"]["predictor"]["model"]["modelFormat"]
    assert not schema_errors(validator, no_format)  # the schema alone lets it through
    assert any("modelFormat" in e for e in webhook_errors(no_format))
    bad_protocol = copy.deepcopy(manifest)
    bad_protocol["spec"]["predictor"]["model"]["protocolVersion"] = "v3"
    assert any("protocolVersion" in e for e in webhook_errors(bad_protocol))


def _kserve_properties() -> dict[str, str]:
    return javaproperties.loads((KSERVE / "config.properties").read_text())


def _snapshot() -> dict:
    return json.loads(_kserve_properties()["model_snapshot"])


def test_kserve_config_keeps_the_per_model_settings_of_config_properties():
    shipped = json.loads(javaproperties.loads(
        (REPO / "config" / "config.properties").read_text())["models"])
    snapshot = _snapshot()
    assert set(snapshot["models"]) == set(shipped) == set(MODELS)
    assert snapshot["modelCount"] == len(MODELS)  # TorchServe loads nothing when it is 0
    for model in MODELS:
        assert set(snapshot["models"][model]) == set(shipped[model]) == {VERSION}
        entry, ours = snapshot["models"][model][VERSION], shipped[model][VERSION]
        assert entry["marName"] == ours["marName"] == f"{model}.mar"
        assert entry["defaultVersion"] is True
        for key in PER_MODEL:
            assert entry[key] == ours[key], f"{model} {key}: kserve {entry[key]} != config {ours[key]}"


def test_archive_version_is_the_one_the_configs_are_keyed_by():
    assert re.search(r"^VERSION=\$\{VERSION:-(\S+)\}$", (REPO / "archive.sh").read_text(),
                     re.M).group(1) == VERSION


@pytest.mark.parametrize("model", MODELS)
def test_built_archive_matches_the_snapshot(model):
    mar = REPO / "model-store" / f"{model}.mar"
    if not mar.is_file():
        pytest.skip(f"{mar} not built (make archives)")
    with zipfile.ZipFile(mar) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
    assert manifest["model"]["modelName"] == model
    assert manifest["model"]["modelVersion"] == VERSION


def test_kserve_wrapper_can_parse_the_config():
    """pytorch/serve kubernetes/kserve/kserve_wrapper/__main__.py (0.12.0) parses the file
    itself: lines not starting with '#', split at the first '='; model_snapshot json-decoded;
    its model names are the models it serves; model_store is where it looks for the .mar files."""
    config = {}
    for line in (KSERVE / "config.properties").read_text().splitlines(keepends=True):
        if not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            config[name.strip()] = value.strip()
    assert not any(line.rstrip().endswith("\\")
                   for line in (KSERVE / "config.properties").read_text().splitlines())
    assert sorted(json.loads(config["model_snapshot"])["models"]) == sorted(MODELS)
    assert config["model_store"] == "/mnt/models/model-store"
    assert config["inference_address"].startswith("http://")  # it splits at "//" for host:port
    assert config == _kserve_properties()  # TorchServe reads the same values


def test_kserve_config_fits_the_runtime():
    properties = _kserve_properties()
    ports = {key: int(properties[key].rsplit(":", 1)[1])
             for key in ("inference_address", "management_address", "metrics_address")}
    # The wrapper's ModelServer holds 8080 (HTTP) and 8081 (gRPC) in the same container.
    assert not {ports["inference_address"], ports["management_address"]} & {8080, 8081}
    assert properties["inference_address"].startswith("http://127.0.0.1:")
    assert properties["management_address"].startswith("http://127.0.0.1:")
    assert ports["metrics_address"] == PROMETHEUS_PORT
    # No Authorization header ever comes from the wrapper.
    assert properties["disable_token_authorization"] == "true"
    assert properties.get("enable_model_api", "false") == "false"
    # TS_SERVICE_ENVELOPE (kserve/kservev2, set by KServe) must not reach TorchServe: the
    # handler parses KServe bodies itself; the stock envelopes mis-answer batches.
    assert properties["enable_envvars_config"] == "false"
    assert "service_envelope" not in properties
    # The handler's batch histograms are declared only in our metrics.yaml.
    assert properties["metrics_config"] == "/mnt/models/config/metrics.yaml"
    shipped = javaproperties.loads((REPO / "config" / "config.properties").read_text())
    assert Path(shipped["metrics_config"]).name == "metrics.yaml"
    for key in ("metrics_mode", "max_request_size", "max_response_size"):
        assert properties[key] == shipped[key], key
