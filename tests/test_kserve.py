"""The KServe deployment, offline: every manifest of kserve/ (our runtime, its overlays, the
stock-runtime variant) through ``kserve_tools.lint`` (the CRD schema made strict plus the
webhook rules and ours), mutated copies failing with the expected message, and the generated
config.properties files in step with config/config.properties and the archives."""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import javaproperties
import pytest
import yaml

from buildsteps.configgen import bulk_lanes, repo_models
from kserve_tools import lint as kserve_lint
from kserve_tools import modelcar
from kserve_tools.bundle import build_triton, bundle_config, bundle_name
from kserve_tools.bundle import main as bundle_main
from kserve_tools.lint.autoscaling import autoscaling_findings
from kserve_tools.lint.localmodel import localmodel_findings, matches
from kserve_tools.render import RenderError, render
from tests.conftest import MODELS, REPO

KSERVE = REPO / "kserve"
STOCK = ("stock/inferenceservice.yaml", "stock/inferenceservice-gpu.yaml")
OVERLAYS = ("v1", "v2", "gpu", "standard-hpa", "knative", "canary")
VERSION = "1.0"  # archive.sh's default VERSION, the key of every models={...} entry
PER_MODEL = ("batchSize", "maxBatchDelay", "minWorkers", "maxWorkers", "responseTimeout")
PROMETHEUS_PORT = 8082
OUR_RUNTIME = "resnet50-torchserve"
LIMITS = kserve_lint.ServingLimits.from_models(repo_models())


@functools.cache
def _rendered(path: Path) -> tuple:
    # One kubectl run per folder for the whole module; callers get copies to mutate.
    return tuple(render(path))


def isvc(target: str):
    """The one InferenceService rendered from an overlay name or a stock manifest path."""
    path = KSERVE / target if target.endswith(".yaml") else KSERVE / "overlays" / target
    [resource] = [r for r in copy.deepcopy(_rendered(path)) if r.kind == "InferenceService"]
    return resource


def policy(target: str):
    """The one NetworkPolicy rendered from an overlay name."""
    [resource] = [
        r
        for r in copy.deepcopy(_rendered(KSERVE / "overlays" / target))
        if r.kind == "NetworkPolicy"
    ]
    return resource


def runtime():
    [resource] = copy.deepcopy(_rendered(KSERVE / "runtime"))
    return resource


def findings(resource) -> list[str]:
    """Every finding of the lint for one (possibly mutated) InferenceService."""
    runtimes = {
        kserve_lint.STOCK_RUNTIME.name: kserve_lint.STOCK_RUNTIME,
        OUR_RUNTIME: kserve_lint.runtime_of(runtime()),
    }
    return [
        str(f)
        for f in kserve_lint.schema_findings(resource)
        + kserve_lint.inference_service_findings(resource, runtimes, LIMITS)
    ]


# ------------------------------------------------------------------ every manifest passes


@pytest.mark.parametrize(
    "target", kserve_lint.default_targets(), ids=lambda p: str(p.relative_to(KSERVE))
)
def test_every_manifest_passes_the_lint(target):
    problems = kserve_lint.lint([target])
    assert not problems, "\n".join(map(str, problems))


def test_lint_command_passes_on_the_repository_and_fails_on_a_bad_file(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "kserve_tools.lint"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    assert "kserve-lint: 0 problem(s)" in ok.stdout
    bad = copy.deepcopy(isvc("v1").obj)
    bad["spec"]["predictor"]["containerConcurrency"] = 4
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(bad))
    failed = subprocess.run(
        [sys.executable, "-m", "kserve_tools.lint", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 1
    assert (
        f"{path}: InferenceService resnet50: spec.predictor.containerConcurrency: 4 is "
        f"below batchSize x maxWorkers = {LIMITS.min_concurrency}"
    ) in failed.stderr
    assert f"fix: set it to at least {LIMITS.min_concurrency}" in failed.stderr


# ------------------------------------------------------------------ the variants say what they are


def test_overlays_share_the_base_and_change_only_their_part():
    base = isvc("v1").obj
    model = base["spec"]["predictor"]["model"]
    assert model["runtime"] == OUR_RUNTIME and model["protocolVersion"] == "v1"
    assert model["storageUri"].endswith("/resnet50-serve/")
    assert isvc("v2").obj["spec"]["predictor"]["model"]["protocolVersion"] == "v2"
    gpu = isvc("gpu").obj["spec"]["predictor"]["model"]
    assert gpu["resources"]["requests"] == gpu["resources"]["limits"]
    assert str(gpu["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert gpu["storageUri"].endswith("/resnet50-serve-gpu/") and gpu["image"].endswith("-gpu")
    hpa = isvc("standard-hpa").obj
    assert hpa["metadata"]["annotations"] == {
        "serving.kserve.io/deploymentMode": "Standard",
        "serving.kserve.io/autoscalerClass": "hpa",
    }
    assert hpa["spec"]["predictor"]["scaleMetric"] == "cpu"
    knative = isvc("knative").obj
    assert knative["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
    predictor = knative["spec"]["predictor"]
    assert predictor["scaleMetric"] == "concurrency"
    # Batches can fill: both models' batchSize x workers fit in one pod's concurrency.
    fill = sum(s["batchSize"] * s["maxWorkers"] for s in repo_models().values())
    assert predictor["containerConcurrency"] >= fill and predictor["scaleTarget"] >= fill
    canary = isvc("canary").obj["spec"]["predictor"]
    assert canary["model"]["storageUri"].endswith("/resnet50-serve-2.0/")
    assert 0 < canary["canaryTrafficPercent"] < 100
    assert {k: v for k, v in canary.items() if k not in ("model", "canaryTrafficPercent")} == {
        k: v for k, v in predictor.items() if k != "model"
    }


def test_runtime_image_is_set_by_kustomize_and_the_bundle_config_is_generated():
    container = runtime().obj["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/YOUR-ORG/resnet50-torchserve:0.12.0"
    assert not any(e["name"] == "PYTHONPATH" for e in container.get("env", []))
    # kserve/runtime/config.properties (make config) is the bundle's config.properties.
    assert (KSERVE / "runtime" / "config.properties").read_text() == bundle_config()


def test_dockerfile_installs_the_runtime_pins_only():
    """kserve/runtime/Dockerfile keeps the lines of requirements.txt above the marker."""
    marker = "# build, test and benchmark tools"
    assert f"sed '/^{marker}/,$d'" in (KSERVE / "runtime" / "Dockerfile").read_text()
    lines = (REPO / "requirements.txt").read_text().splitlines()
    runtime_pins = {
        re.split(r"[=<>\[]", line)[0]
        for line in lines[: lines.index(marker)]
        if line and not line.startswith("#")
    }
    assert {
        "torch",
        "torchvision",
        "torchserve",
        "onnxruntime",
        "openvino",
        "pillow",
    } <= runtime_pins
    assert not runtime_pins & {
        "pytest",
        "kserve",
        "kserve-storage",
        "moto",
        "boto3",
        "tritonclient",
        "nncf",
    }


def test_a_kustomization_kubectl_refuses_is_named_with_kubectl_s_message(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(
        RenderError,
        match=f"^{re.escape(str(tmp_path))}: kubectl kustomize "
        r"failed .*missing\.yaml",
    ):
        render(tmp_path)
    problems = [str(p) for p in kserve_lint.lint([tmp_path])]
    assert len(problems) == 1 and "kustomization: <render>: " in problems[0], problems


# ------------------------------------------------------------------ mutated copies fail


def _set(path: str, value):
    def mutate(obj):
        *parents, leaf = path.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return mutate


def _annotate(obj, key: str, value: str) -> None:
    obj["metadata"].setdefault("annotations", {})[key] = value


def _knative(obj) -> bool:
    mode = obj["metadata"].get("annotations", {}).get("serving.kserve.io/deploymentMode")
    return kserve_lint.MODES.get(mode or kserve_lint.DEFAULT_MODE) == "Knative"


ISVC_MUTATIONS = {
    "name": (_set("metadata.name", "ResNet50"), "metadata.name: 'ResNet50' does not match"),
    "two-implementations": (
        _set("spec.predictor.sklearn", {"storageUri": "s3://b/m/"}),
        "exactly one predictor implementation",
    ),
    "model-name": (
        _set("spec.predictor.model.name", "tagger"),
        "not allowed in standard predictor",
    ),
    "storage-uris": (
        _set("spec.predictor.storageUris", [{"uri": "s3://b/other/"}]),
        "both storageUri and storageUris",
    ),
    "replicas": (
        lambda o: o["spec"]["predictor"].update(minReplicas=5, maxReplicas=2),
        "minReplicas 5 is above maxReplicas 2",
    ),
    "negative-concurrency": (
        _set("spec.predictor.containerConcurrency", -1),
        "containerConcurrency: -1 is negative",
    ),
    "scale-metric": (
        lambda o: o["spec"]["predictor"].update(scaleMetric="cpu" if _knative(o) else "rps"),
        "is not allowed with",
    ),
    "autoscaler-class": (
        lambda o: _annotate(o, "serving.kserve.io/autoscalerClass", "kpa"),
        "[kpa] is not a supported autoscaler class type",
    ),
    "pythonpath": (
        lambda o: (
            o["spec"]["predictor"]["model"]
            .setdefault("env", [])
            .append({"name": "PYTHONPATH", "value": "/x"})
        ),
        "setting PYTHONPATH in container",
    ),
    "protocol": (
        _set("spec.predictor.model.protocolVersion", "grpc-v1"),
        "'grpc-v1' is not supported by runtime",
    ),
    "model-format": (
        _set("spec.predictor.model.modelFormat.name", "sklearn"),
        "does not support sklearn",
    ),
    "concurrency-below-batch": (
        _set("spec.predictor.containerConcurrency", 2),
        "containerConcurrency: 2 is below batchSize x maxWorkers",
    ),
    "timeout": (_set("spec.predictor.timeout", 30), "30 s is below TorchServe's responseTimeout"),
    "unknown-field": (
        lambda o: o["spec"]["predictor"]["model"].update(
            storageURI=o["spec"]["predictor"]["model"].pop("storageUri")
        ),
        "'storageURI' was unexpected",
    ),
    "mode": (
        lambda o: _annotate(o, "serving.kserve.io/deploymentMode", "Serverfull"),
        "'Serverfull' is not a deployment mode",
    ),
}


@pytest.mark.parametrize("mutation", ISVC_MUTATIONS)
@pytest.mark.parametrize("target", OVERLAYS + STOCK)
def test_mutated_inference_service_fails_with_the_expected_message(target, mutation):
    resource = isvc(target)
    mutate, expected = ISVC_MUTATIONS[mutation]
    mutate(resource.obj)
    problems = findings(resource)
    assert any(expected in p for p in problems), problems
    source = str(resource.source.relative_to(REPO))
    assert all(p.startswith(f"{source}: InferenceService ") and "; fix: " in p for p in problems)


def test_deprecated_mode_names_are_normalised_like_the_webhook_does():
    resource = isvc("knative")
    resource.obj["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] = "Serverless"
    assert findings(resource) == []
    resource.obj["spec"]["predictor"]["scaleMetric"] = "cpu"
    assert any("not allowed with Knative's autoscaler" in p for p in findings(resource))


def test_keda_takes_no_scale_metric_and_kpa_is_no_autoscaler_class():
    resource = isvc("standard-hpa")
    resource.obj["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] = "keda"
    assert any(
        "'cpu' is not allowed with KEDA" in p and "autoScaling.metrics" in p
        for p in findings(resource)
    )
    del resource.obj["spec"]["predictor"]["scaleMetric"]
    del resource.obj["spec"]["predictor"]["scaleTarget"]
    assert findings(resource) == []


# ------------------------------------------------------------------ KEDA through autoScaling

KEDA = ("keda", "keda-gpu")


def keda_findings(resource) -> list[str]:
    return findings(resource) + [str(f) for f in autoscaling_findings(resource)]


def _triggers(obj) -> list[dict]:
    return obj["spec"]["predictor"]["autoScaling"]["metrics"]


def _query(obj, change) -> None:
    metric = _triggers(obj)[0]["external"]["metric"]
    metric["query"] = change(metric["query"])


def test_keda_overlays_scale_their_own_pods_on_our_recorded_signals():
    """CPU pods on the requests waiting, GPU pods on the GPU's busy share as well; each query a
    sum of one recorded signal for this InferenceService alone; the rest as their base."""
    cpu, gpu = isvc("keda").obj, isvc("keda-gpu").obj
    for obj, base, signals in (
        (cpu, isvc("v1").obj, ["queued_requests"]),
        (gpu, isvc("gpu").obj, ["gpu_busy", "queued_requests"]),
    ):
        assert obj["metadata"]["annotations"] == {
            "serving.kserve.io/deploymentMode": "Standard",
            "serving.kserve.io/autoscalerClass": "keda",
        }
        predictor = obj["spec"]["predictor"]
        assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 4)
        assert "scaleMetric" not in predictor
        queries = [t["external"]["metric"]["query"] for t in _triggers(obj)]
        assert queries == [
            f'sum(inferenceservice:{s}:sum{{namespace="YOUR-NAMESPACE",'
            f'inferenceservice="{obj["metadata"]["name"]}"}})'
            for s in signals
        ]
        assert {
            k: v
            for k, v in predictor.items()
            if k not in ("autoScaling", "minReplicas", "maxReplicas")
        } == base["spec"]["predictor"]


KEDA_MUTATIONS = {
    "unrecorded-series": (
        lambda o: _query(o, lambda q: q.replace(":sum{", ":total{")),
        "which no rule of config/monitoring/rules.yml records",
    ),
    "another-service": (
        lambda o: _query(o, lambda q: q.replace('inferenceservice="', 'inferenceservice="x-')),
        "does not select inferenceservice=",
    ),
    "several-series": (
        lambda o: _query(o, lambda q: q[len("sum(") : -1]),
        "may return several series",
    ),
    "no-threshold": (
        lambda o: _triggers(o)[0]["external"]["target"].pop("value"),
        "the target threshold value should not be empty",
    ),
    "scale-to-zero": (
        lambda o: o["spec"]["predictor"].update(minReplicas=0),
        "nothing would ever ask for the first one back",
    ),
    "knative": (
        lambda o: _annotate(o, "serving.kserve.io/deploymentMode", "Knative"),
        "KEDA autoscaling is only supported in Standard mode",
    ),
    "no-trigger": (
        lambda o: o["spec"]["predictor"].update(autoScaling={}),
        "missing: KServe would give KEDA no trigger",
    ),
    "hpa-with-external": (
        lambda o: _annotate(o, "serving.kserve.io/autoscalerClass", "hpa"),
        "invalid HPA metric source type with value [External]",
    ),
    "cpu-as-value": (
        lambda o: _triggers(o).append(
            {
                "type": "Resource",
                "resource": {
                    "name": "cpu",
                    "target": {"type": "AverageValue", "averageValue": "1"},
                },
            }
        ),
        "the cpu target value type should be Utilization",
    ),
    "unscraped": (
        lambda o: (
            o["metadata"].update(name="resnet50-b"),
            _query(
                o, lambda q: re.sub(r'inferenceservice="[^"]*"', 'inferenceservice="resnet50-b"', q)
            ),
        ),
        "PodMonitor scrapes no pod of InferenceService resnet50-b",
    ),
    "target-type": (
        lambda o: _triggers(o)[0]["external"]["target"].update(type="Average"),
        "'Average' is not one of ['Utilization', 'Value', 'AverageValue']",
    ),
}


@pytest.mark.parametrize("mutation", KEDA_MUTATIONS)
@pytest.mark.parametrize("target", KEDA)
def test_mutated_keda_overlay_fails_with_the_expected_message(target, mutation):
    resource = isvc(target)
    assert keda_findings(resource) == []
    mutate, expected = KEDA_MUTATIONS[mutation]
    mutate(resource.obj)
    problems = keda_findings(resource)
    assert any(expected in p for p in problems), problems
    assert all(" InferenceService " in p and "; fix: " in p for p in problems)


# ------------------------------------------------------------------ models on the node


def test_the_modelcar_overlay_only_takes_the_bundle_from_its_oci_image():
    obj, base = isvc("modelcar").obj, isvc("v1").obj
    assert obj["spec"]["predictor"]["model"].pop("storageUri") == (
        f"oci://ghcr.io/YOUR-ORG/{bundle_name()}:{VERSION}"
    )
    del base["spec"]["predictor"]["model"]["storageUri"]
    assert obj == base


def cache():
    [resource] = copy.deepcopy(_rendered(KSERVE / "localmodel"))
    return resource


LOCALMODEL_MUTATIONS = {
    "api": (_set("apiVersion", "serving.kserve.io/v1alpha2"), "not serving.kserve.io/v1alpha1"),
    "unknown-field": (
        lambda o: o["spec"].update(nodeGroup=o["spec"].pop("nodeGroups")),
        "'nodeGroup' was unexpected",
    ),
    "no-node-group": (_set("spec.nodeGroups", []), "[] should be non-empty"),
    "size": (_set("spec.modelSize", "1 GB"), "'1 GB' does not match"),
    "modelcar": (
        _set("spec.sourceModelUri", "oci://ghcr.io/YOUR-ORG/resnet50-serve:1.0"),
        "KServe's download Jobs (the storage initializer) fetch",
    ),
    "unused": (
        _set("spec.sourceModelUri", "s3://YOUR-BUCKET/resnet50-serve-gpu/"),
        "no InferenceService would use the cache",
    ),
}


@pytest.mark.parametrize("mutation", LOCALMODEL_MUTATIONS)
def test_mutated_local_model_cache_fails_with_the_expected_message(mutation):
    resource = cache()
    assert localmodel_findings(resource) == []
    mutate, expected = LOCALMODEL_MUTATIONS[mutation]
    mutate(resource.obj)
    problems = [str(f) for f in localmodel_findings(resource)]
    assert any(expected in p for p in problems), problems
    assert all(": LocalModelCache resnet50-serve: " in p and "; fix: " in p for p in problems)


def test_a_cache_serves_its_uri_and_the_folders_below_it_as_kserve_matches_them():
    base = isvc("v1").obj["spec"]["predictor"]["model"]["storageUri"]
    assert cache().obj["spec"]["sourceModelUri"] == base
    bucket = base.rsplit("/", 2)[0]
    assert matches(base.rstrip("/"), base) and matches(bucket + "/", base)
    assert not matches(bucket + "/resnet50", base) and not matches(base + "config/", base)


def test_the_modelcar_key_follows_the_bundle_s_content_not_its_file_times(tmp_path):
    bundle = tmp_path / "resnet50-serve"
    (bundle / "config").mkdir(parents=True)
    (bundle / "config" / "serve.sh").write_text("exec torchserve\n")
    key = modelcar.cache_key(bundle, "FROM x", "base-id")
    (bundle / "config" / "serve.sh").touch()
    assert modelcar.cache_key(bundle, "FROM x", "base-id") == key
    (bundle / "config" / "serve.sh").write_text("exec torchserve --ncs\n")
    assert modelcar.cache_key(bundle, "FROM x", "base-id") != key
    with pytest.raises(SystemExit, match=r"is no storage bundle .* run `make kserve-bundle` first"):
        modelcar.build(bundle)


def test_gpu_and_canary_bundle_configs_come_from_the_same_source():
    from buildsteps import gpu

    for device, version in (("gpu", "1.0"), ("cpu", "2.0")):
        # The GPU bundle: each model's gpu: section over its settings (tests/test_gpu_deploy.py)
        models = gpu.repo_models(1) if device == "gpu" else repo_models()
        properties = javaproperties.loads(bundle_config(device, version))
        entries = json.loads(properties["models"])
        assert set(entries) == set(models)
        for name, settings in models.items():
            entry = entries[name][version]
            assert {k: entry[k] for k in settings} == settings
            # deviceType acts from the archive only.
            assert "deviceType" not in entry
        assert properties.get("number_of_gpu") == ("1" if device == "gpu" else None)
    assert bundle_name("gpu") + "/" in isvc("gpu").obj["spec"]["predictor"]["model"]["storageUri"]
    assert (
        bundle_name(version="2.0") + "/"
        in isvc("canary").obj["spec"]["predictor"]["model"]["storageUri"]
    )


def _container(obj) -> dict:
    return obj["spec"]["containers"][0]


RUNTIME_MUTATIONS = {
    "auto-select": (
        lambda o: o["spec"]["supportedModelFormats"][0].update(autoSelect=True),
        "must not be picked automatically",
    ),
    "pythonpath": (
        lambda o: _container(o)["env"].append({"name": "PYTHONPATH", "value": "/x"}),
        "setting PYTHONPATH in container 'kserve-container' is not allowed",
    ),
    "probe": (
        lambda o: _container(o).update(readinessProbe={"httpGet": {"path": "/ping", "port": 8080}}),
        "only the bundle's readiness check waits",
    ),
    "port-name": (
        lambda o: _container(o)["ports"][0].update(name="http"),
        "Knative needs http1 or h2c",
    ),
    "port": (
        lambda o: _container(o)["ports"][0].update(containerPort=9090),
        "9090 is not TorchServe's inference port 8080",
    ),
    "two-ports": (
        lambda o: _container(o)["ports"].append({"name": "metrics", "containerPort": 8082}),
        "2 ports; Knative allows exactly one",
    ),
    "background": (lambda o: _container(o)["args"].remove("--foreground"), "--foreground missing"),
    "mount": (
        lambda o: _container(o)["args"].__setitem__(3, "--model-store=/models/model-store"),
        "--model-store=/mnt/models/model-store missing",
    ),
    "metrics-port": (
        lambda o: o["spec"]["annotations"].update({"prometheus.kserve.io/port": "9091"}),
        "is not TorchServe's metrics port 8082",
    ),
    "protocols": (_set("spec.protocolVersions", ["v1"]), "must include v1 and v2"),
    "unknown-field": (_set("spec.supportedModelFormat", []), "spec.supportedModelFormat: unknown"),
    "container-name": (
        lambda o: _container(o).update(name="torchserve"),
        "expected exactly one container named kserve-container",
    ),
    "seccomp": (
        lambda o: _container(o)["securityContext"].pop("seccompProfile"),
        "securityContext.seccompProfile: missing: no syscall filter",
    ),
    "memory": (
        lambda o: _container(o)["resources"]["limits"].update(memory="4Gi"),
        "resources.limits.memory: '4Gi' is below the measured footprint",
    ),
}


@pytest.mark.parametrize("mutation", RUNTIME_MUTATIONS)
def test_mutated_runtime_fails_with_the_expected_message(mutation):
    resource = runtime()
    mutate, expected = RUNTIME_MUTATIONS[mutation]
    mutate(resource.obj)
    problems = [str(f) for f in kserve_lint.runtime_findings(resource)]
    assert any(expected in p for p in problems), problems
    assert all(
        p.startswith(f"kserve/runtime/kustomization.yaml: ClusterServingRuntime {OUR_RUNTIME}: ")
        for p in problems
    )


def test_runtime_with_token_auth_on_fails():
    properties = kserve_lint.server_properties()
    properties["disable_token_authorization"] = "false"
    problems = [str(f) for f in kserve_lint.runtime_findings(runtime(), properties)]
    assert any(
        "token authorization is on" in p and "authenticate at the gateway" in p for p in problems
    ), problems


# ------------------------------------------------------------------ our Triton runtime


def triton_runtime():
    [resource] = copy.deepcopy(_rendered(KSERVE / "triton-runtime"))
    return resource


def _arg(option: str, value: str | None):
    """Replace (or, with None, drop) one ``--option=value`` of the container's args."""

    def mutate(obj):
        args = _container(obj)["args"]
        [i] = [k for k, a in enumerate(args) if a.startswith(option + "=")]
        if value is None:
            args.pop(i)
        else:
            args[i] = f"{option}={value}"

    return mutate


TRITON_RUNTIME_MUTATIONS = {
    "auto-select": (
        lambda o: o["spec"]["supportedModelFormats"][0].update(autoSelect=True),
        "must not be picked for any Triton InferenceService",
    ),
    "format": (
        lambda o: o["spec"]["supportedModelFormats"][0].update(name="pytorch"),
        "lacks triton:2, the model repository's format",
    ),
    "v1": (
        _set("spec.protocolVersions", ["v1", "v2"]),
        "Triton speaks the Open Inference Protocol only",
    ),
    "command": (
        lambda o: _container(o).update(command=["tritonserver"]),
        "not the project's launcher",
    ),
    "unknown-option": (
        lambda o: _container(o)["args"].append("--model-store=/mnt/models"),
        "the launcher refuses them: unrecognized arguments: --model-store=/mnt/models",
    ),
    "not-a-port": (
        _arg("--http-port", "eighty"),
        "the launcher refuses them: argument --http-port: invalid int value",
    ),
    "loopback": (_arg("--host", None), "--host=127.0.0.1, not 0.0.0.0"),
    "repository": (_arg("--repository", "/models"), "--repository=/models, not /mnt/models"),
    "grpc-port": (_arg("--grpc-port", "8001"), "--grpc-port=8001, not 9000"),
    "exit-timeout": (
        _arg("--exit-timeout-secs", None),
        "--exit-timeout-secs=30: on SIGTERM Triton waits that long",
    ),
    "keys": (
        lambda o: _container(o)["args"].remove("--no-keys"),
        "keys on (the launcher's default): KServe's gateway and probes send no keys",
    ),
    "port": (
        lambda o: _container(o)["ports"][0].update(containerPort=8000),
        "8000 is not the launcher's --http-port 8080",
    ),
    "two-ports": (
        lambda o: _container(o)["ports"].append({"name": "h2c", "containerPort": 9000}),
        "2 ports; Knative allows exactly one",
    ),
    "metrics-port": (
        lambda o: o["spec"]["annotations"].update({"prometheus.kserve.io/port": "9091"}),
        "is not the launcher's --metrics-port 8002",
    ),
    "readiness": (
        lambda o: _container(o).update(readinessProbe={"tcpSocket": {"port": 8080}}),
        "Triton's own /v2/health/ready says it (every model loaded",
    ),
    "liveness": (
        lambda o: _container(o).pop("livenessProbe"),
        "livenessProbe: missing: Triton's own /v2/health/live",
    ),
    "no-shm": (lambda o: _container(o).pop("volumeMounts"), "/dev/shm is not mounted"),
    "disk-shm": (
        lambda o: o["spec"]["volumes"][0].update(emptyDir={}),
        "mount an emptyDir with medium: Memory",
    ),
    "pythonpath": (
        lambda o: _container(o).setdefault("env", []).append({"name": "PYTHONPATH", "value": "/x"}),
        "setting PYTHONPATH in container",
    ),
    "seccomp": (
        lambda o: _container(o)["securityContext"].pop("seccompProfile"),
        "securityContext.seccompProfile: missing: no syscall filter",
    ),
    "memory": (
        lambda o: _container(o)["resources"]["limits"].update(memory="2Gi"),
        "resources.limits.memory: '2Gi' is below the measured footprint of Triton",
    ),
    "container-name": (
        lambda o: _container(o).update(name="triton"),
        "expected exactly one container named kserve-container",
    ),
}


@pytest.mark.parametrize("mutation", TRITON_RUNTIME_MUTATIONS)
def test_mutated_triton_runtime_fails_with_the_expected_message(mutation):
    resource = triton_runtime()
    mutate, expected = TRITON_RUNTIME_MUTATIONS[mutation]
    mutate(resource.obj)
    problems = [str(f) for f in kserve_lint.triton_runtime_findings(resource)]
    assert any(expected in p for p in problems), problems
    assert all(
        p.startswith(
            "kserve/triton-runtime/kustomization.yaml: ClusterServingRuntime "
            f"{kserve_lint.OUR_TRITON_RUNTIME}: "
        )
        for p in problems
    )


def test_both_runtimes_run_the_one_image_named_once():
    """kserve/image names the image; the TorchServe and Triton runtimes both take it."""
    images = {_container(r.obj)["image"] for r in (runtime(), triton_runtime())}
    assert images == {"ghcr.io/YOUR-ORG/resnet50-torchserve:0.12.0"}
    container = _container(triton_runtime().obj)
    assert container["command"] == ["python", "-m", "tritonrepo.server"]
    # The launcher (the same code the image runs) accepts the runtime's args.
    from tritonrepo.server import argument_parser

    options = argument_parser().parse_args(container["args"])
    assert (str(options.repository), options.host, options.http_port, options.grpc_port) == (
        "/mnt/models",
        "0.0.0.0",
        8080,
        9000,
    )
    assert options.no_keys  # KServe's gateway sends no keys; build/ is read-only there


def test_the_triton_overlay_runs_on_our_triton_runtime_and_its_rules_apply():
    isvc_ = isvc("triton")
    model = isvc_.obj["spec"]["predictor"]["model"]
    assert (model["runtime"], model["modelFormat"], model["protocolVersion"]) == (
        kserve_lint.OUR_TRITON_RUNTIME,
        {"name": "triton", "version": "2"},
        "v2",
    )
    assert model["storageUri"].endswith("/resnet50-triton/")
    runtimes = {kserve_lint.OUR_TRITON_RUNTIME: kserve_lint.runtime_of(triton_runtime())}
    assert kserve_lint.inference_service_findings(isvc_, runtimes, LIMITS) == []
    v1 = copy.deepcopy(isvc_)
    v1.obj["spec"]["predictor"]["model"]["protocolVersion"] = "v1"
    assert any(
        "'v1' is not supported by runtime resnet50-triton" in str(f)
        for f in kserve_lint.inference_service_findings(v1, runtimes, LIMITS)
    )
    small = copy.deepcopy(isvc_)
    small.obj["spec"]["predictor"]["model"]["resources"]["requests"]["memory"] = "1Gi"
    assert any(
        "requests.memory: '1Gi' is below the measured footprint of Triton" in str(f)
        for f in kserve_lint.inference_service_findings(small, runtimes, LIMITS)
    )
    spec = policy("triton").obj["spec"]
    assert spec["podSelector"]["matchLabels"] == {kserve_lint.ISVC_LABEL: "resnet50-triton"}
    assert {p["port"] for rule in spec["ingress"] for p in rule["ports"]} == {8080, 8002}
    objects = [copy.deepcopy(o) for o in _rendered(KSERVE / "overlays" / "triton")]
    for o in objects:
        if o.kind == "NetworkPolicy":
            o.obj["spec"]["ingress"].pop(1)
    assert any(
        "port 8002 is admitted from no namespace" in str(f)
        for f in kserve_lint.network_policy_findings(objects)
    )


def test_the_triton_bundle_is_the_model_repository_at_its_top(tmp_path, capsys):
    """make kserve-bundle KSERVE_ENGINE=triton: the repository tritonrepo.generate writes, one
    folder per model of config/models at the folder's and the tarball's top (the storage
    initializer unpacks a single .tar.gz into /mnt/models, the launcher's --repository)."""
    import tarfile

    bundle = build_triton(tmp_path, precision="f32")
    assert bundle.folder == tmp_path / "resnet50-triton"
    assert sorted(p.name for p in bundle.folder.iterdir()) == sorted(repo_models())
    for model in repo_models():
        config = (bundle.folder / model / "config.pbtxt").read_text()
        assert f'name: "{model}"' in config and '\\"precision\\": \\"f32\\"' in config
        assert (bundle.folder / model / "1" / "model.py").is_file()
    with tarfile.open(bundle.tarball) as tar:
        tops = {m.name.split("/")[0] for m in tar.getmembers()}
        assert {m.uid for m in tar.getmembers()} == {0}
    assert tops == set(repo_models())
    with pytest.raises(SystemExit):
        bundle_main(["--engine", "triton", "--model-version", "2.0", "--out", str(tmp_path)])
    assert "--model-version is TorchServe's" in capsys.readouterr().err


# ------------------------------------------------------------------ the stock-runtime variant


@pytest.mark.parametrize("name", STOCK)
def test_stock_manifest_pins_our_torchserve_and_sizes_resources(name):
    model = isvc(name).obj["spec"]["predictor"]["model"]
    assert model["runtime"] == kserve_lint.STOCK_RUNTIME.name
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


def _kserve_properties() -> dict[str, str]:
    return javaproperties.loads((KSERVE / "config.properties").read_text())


def _snapshot() -> dict:
    return json.loads(_kserve_properties()["model_snapshot"])


def test_kserve_config_keeps_the_per_model_settings_of_config_properties():
    shipped = json.loads(
        javaproperties.loads((REPO / "config" / "config.properties").read_text())["models"]
    )
    snapshot = _snapshot()
    assert set(snapshot["models"]) == set(shipped) - set(bulk_lanes()) == set(MODELS)
    assert snapshot["modelCount"] == len(MODELS)  # TorchServe loads nothing when it is 0
    for model in MODELS:
        assert set(snapshot["models"][model]) == set(shipped[model]) == {VERSION}
        entry, ours = snapshot["models"][model][VERSION], shipped[model][VERSION]
        assert entry["marName"] == ours["marName"] == f"{model}.mar"
        assert entry["defaultVersion"] is True
        for key in PER_MODEL:
            assert entry[key] == ours[key], (
                f"{model} {key}: kserve {entry[key]} != config {ours[key]}"
            )


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
    assert not any(
        line.rstrip().endswith("\\")
        for line in (KSERVE / "config.properties").read_text().splitlines()
    )
    assert sorted(json.loads(config["model_snapshot"])["models"]) == sorted(MODELS)
    assert config["model_store"] == "/mnt/models/model-store"
    assert config["inference_address"].startswith("http://")  # it splits at "//" for host:port
    assert config == _kserve_properties()  # TorchServe reads the same values


def test_kserve_config_fits_the_runtime():
    properties = _kserve_properties()
    ports = {
        key: int(properties[key].rsplit(":", 1)[1])
        for key in ("inference_address", "management_address", "metrics_address")
    }
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


# ------------------------------------------------------------------ pods: network, memory


@pytest.mark.parametrize("target", OVERLAYS)
def test_every_overlay_ships_a_network_policy_for_its_pods(target):
    """Only named namespaces reach the pods: the ingress gateway's the inference port (or
    Knative's queue-proxy), the monitoring one the metrics port; each name set once in
    kserve/base/namespaces.env."""
    names = dict(
        line.split("=", 1)
        for line in (KSERVE / "base" / "namespaces.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    spec = policy(target).obj["spec"]
    assert spec["podSelector"]["matchLabels"] == {kserve_lint.ISVC_LABEL: isvc(target).name}
    allowed = {
        (peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], port["port"])
        for rule in spec["ingress"]
        for peer in rule["from"]
        for port in rule["ports"]
    }
    inference = (
        8012
        if kserve_lint.mode(isvc(target).obj["metadata"]["annotations"])
        in ("Knative", "Serverless")
        else 8080
    )
    assert {(names["ingress"], inference), (names["monitoring"], PROMETHEUS_PORT)} <= allowed
    assert {namespace for namespace, _ in allowed} <= {
        names["ingress"],
        names["monitoring"],
        "knative-serving",
    }


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (lambda objs: [o for o in objs if o.kind != "NetworkPolicy"], "no NetworkPolicy selects"),
        (
            lambda objs: [
                o
                for o in objs
                if not (
                    o.kind == "NetworkPolicy" and o.obj["spec"]["ingress"][0].update({"from": []})
                )
            ],
            "admits more than named namespaces",
        ),
        (
            lambda objs: [
                o
                for o in objs
                if not (o.kind == "NetworkPolicy" and o.obj["spec"]["ingress"].pop(1) is None)
            ],
            "port 8082 is admitted from no namespace",
        ),
        (
            lambda objs: [
                o
                for o in objs
                if not (
                    o.kind == "NetworkPolicy"
                    and o.obj["spec"]["podSelector"]["matchLabels"].update(
                        {kserve_lint.ISVC_LABEL: "other"}
                    )
                )
            ],
            "no NetworkPolicy selects",
        ),
    ],
    ids=["missing", "open-rule", "no-metrics-rule", "wrong-pods"],
)
def test_a_missing_or_open_network_policy_fails_the_lint(mutation, expected):
    objects = mutation(list(copy.deepcopy(_rendered(KSERVE / "overlays" / "v1"))))
    problems = [str(f) for f in kserve_lint.network_policy_findings(objects)]
    assert any(expected in p for p in problems), problems


def test_memory_covers_the_documented_footprint():
    """The footprint the lint holds every pod to is the figure kserve/README.md reports."""
    readme = (KSERVE / "README.md").read_text()
    assert f"{kserve_lint.FOOTPRINT_GIB} GiB" in readme
    low = isvc("v1")
    low.obj["spec"]["predictor"]["model"]["resources"]["limits"]["memory"] = "4Gi"
    assert any(
        "resources.limits.memory: '4Gi' is below the measured footprint" in p for p in findings(low)
    )
    for enough in ("8Gi", "8192Mi", "8.5e9", "8.1G"):
        low.obj["spec"]["predictor"]["model"]["resources"]["limits"]["memory"] = enough
        assert not any("limits.memory" in p for p in findings(low)), enough


def test_a_memory_size_kubernetes_cannot_read_is_a_finding():
    bad = isvc("v1")
    bad.obj["spec"]["predictor"]["model"]["resources"]["requests"]["memory"] = "1.2.3"
    assert (
        "InferenceService resnet50: spec.predictor.model.resources.requests.memory: '1.2.3' "
        "is not a Kubernetes quantity"
    ) in "\n".join(findings(bad))


def test_docker_build_context_sends_only_what_the_dockerfile_copies():
    """kserve/runtime/Dockerfile builds from the repository root: the .dockerignore there
    admits exactly the files its COPY lines name (the pins, the Triton launcher and the
    shared ports and keys it imports), keeping weights, archives, keys and build/ out; those files
    are what the image's cache key hashes."""
    from kserve_tools.image import context_files

    dockerfile = (KSERVE / "runtime" / "Dockerfile").read_text()
    copied = {
        source
        for line in re.findall(r"^COPY (.+)$", dockerfile, re.M)
        for source in line.split()[:-1]
    }
    assert copied == {
        "requirements.txt",
        "requirements-triton.txt",
        "tritonrepo/__init__.py",
        "tritonrepo/install.py",
        "tritonrepo/server.py",
        "tritonrepo/watchdog.py",
        "servecore/",
        "model_files/",
        "transformer/",
        "config/models/",
        "serveshared/",
    }
    lines = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*" and all(line.startswith("!") for line in lines[1:])
    sent = {str(p.relative_to(REPO)) for p in context_files()}
    folders = {"serveshared": "*.py", "servecore": "**/*.py", "model_files": "*.py",
               "transformer": "*.py", "config/models": "*.yaml"}  # fmt: skip
    assert sent == {s for s in copied if not s.endswith("/")} | {
        str(p.relative_to(REPO))
        for folder, pattern in folders.items()
        for p in (REPO / folder).glob(pattern)
    }
    assert not any(
        s.startswith(("build/", "model-store/", ".venv")) or s.endswith((".mar", ".json"))
        for s in sent
    )
