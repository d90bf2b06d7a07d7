"""GPU deployment, checked from the files it generates (this machine has no GPU): the GPU
archives' model-config.yaml, config.properties and Triton's config.pbtxt put each model's
workers on the GPUs as TorchServe 0.12 and Triton 2.51 read them (buildsteps/gpu.py), while the
CPU deployment stays as it was."""

from __future__ import annotations

import json
import shutil
import subprocess

import javaproperties
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from buildsteps import configgen, gpu
from tests.conftest import REPO
from tritonrepo.generate import config_pbtxt

MODELS = REPO / "config" / "models"
TAGGER = "resnet50-tagger"


def _gpu_section(model: str) -> dict:
    return yaml.safe_load((MODELS / f"{model}.yaml").read_text())["gpu"]


def _per_gpu(model: str) -> int:
    return _gpu_section(model)["workersPerGpu"]


def _pbtxt(text: str) -> model_config_pb2.ModelConfig:
    """config.pbtxt read by protobuf's own text parser into Triton's ModelConfig (as Triton
    reads it): a field Triton does not know fails here."""
    return text_format.Parse(text, model_config_pb2.ModelConfig())


@pytest.mark.parametrize("gpus", [1, 2, 4])
@pytest.mark.parametrize("model", configgen.model_names())
def test_the_gpu_model_config_puts_workers_per_gpu_on_every_gpu(model, gpus):
    """deviceType gpu, deviceIds 0..N-1 and workersPerGpu x N workers: TorchServe hands a
    model with deviceIds its workers deviceIds[i % N] (WorkLoadManager.addThreads), so each
    GPU gets workersPerGpu of them. Everything else is the model's own YAML."""
    source = yaml.safe_load((MODELS / f"{model}.yaml").read_text())
    config = gpu.model_config(MODELS / f"{model}.yaml", gpus)
    per_gpu = _per_gpu(model)
    assert per_gpu >= 1
    assert config["deviceType"] == "gpu"
    assert config["deviceIds"] == list(range(gpus))
    assert config["minWorkers"] == config["maxWorkers"] == per_gpu * gpus
    workers_on = [config["deviceIds"][i % gpus] for i in range(config["minWorkers"])]
    assert all(workers_on.count(device) == per_gpu for device in range(gpus))
    assert "gpu" not in config  # applied, not packed
    assert config["handler"] == source["handler"]
    for key in ("batchSize", "maxBatchDelay", "responseTimeout"):
        assert config[key] == source.get("gpu", {}).get(key, source[key])


def test_the_cpu_deployment_is_unchanged():
    """No device keys in the CPU archives' YAML or config.properties: TorchServe's own default
    (GPUs where it finds them) stays as it was; one worker per model."""
    for model in configgen.model_names():
        settings = configgen.frontend_settings(MODELS / f"{model}.yaml")
        assert settings["minWorkers"] == 1
        assert "deviceType" not in yaml.safe_load((MODELS / f"{model}.yaml").read_text())
    text = (REPO / "config" / "config.properties").read_text()
    assert "number_of_gpu" not in javaproperties.loads(text)
    assert "deviceType" not in text


def test_a_gpu_section_overrides_batching_on_gpus_only(tmp_path):
    source = tmp_path / "m.yaml"
    source.write_text(
        "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 16\nmaxBatchDelay: 10\nresponseTimeout: 120\n"
        "gpu: {workersPerGpu: 3, batchSize: 64}\nhandler: {task: tags}\n"
    )
    settings = gpu.gpu_settings(source, 2)
    assert (settings["batchSize"], settings["maxBatchDelay"], settings["minWorkers"]) == (64, 10, 6)
    assert configgen.frontend_settings(source)["batchSize"] == 16


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("", "no `gpu:` section"),
        ("gpu: {workersPerGpu: 0}\n", "workersPerGpu must be 1 or more, got 0"),
        ("gpu: {workersPerGpu: two}\n", "workersPerGpu must be 1 or more"),
        ("gpu: {workersPerGpu: 1, minWorkers: 4}\n", "gpu.minWorkers is not a GPU setting"),
    ],
)
def test_a_bad_gpu_section_is_refused_saying_what_to_write(tmp_path, section, message):
    source = tmp_path / "m.yaml"
    source.write_text(
        "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 16\nmaxBatchDelay: 10\nresponseTimeout: 120\n"
        + section
    )
    with pytest.raises(SystemExit, match=message):
        gpu.gpu_settings(source, 1)
    with pytest.raises(SystemExit, match="--gpus must be 1 or more"):
        gpu.gpu_settings(MODELS / f"{TAGGER}.yaml", 0)


def test_gpu_config_properties_sets_number_of_gpu_and_the_gpu_workers():
    """number_of_gpu bounds the deviceIds TorchServe accepts (an id at or above it drops the
    whole list); models={...} carries the same workers as the archives (TorchServe takes the
    workers from either), the bulk lane its model's."""
    properties = javaproperties.loads(gpu.config_properties(2))
    assert properties["number_of_gpu"] == "2"
    models = {name: entry["1.0"] for name, entry in json.loads(properties["models"]).items()}
    lanes = configgen.bulk_lanes()
    assert set(models) == set(configgen.model_names()) | set(lanes)
    for name, entry in models.items():
        per_gpu = _per_gpu(lanes.get(name, name))
        assert entry["minWorkers"] == entry["maxWorkers"] == 2 * per_gpu
        assert "deviceType" not in entry  # read from the archive only: not written where ignored
    # Everything else as the CPU deployment's.
    cpu = javaproperties.loads((REPO / "config" / "config.properties").read_text())
    assert {k: v for k, v in properties.items() if k not in ("models", "number_of_gpu")} == {
        k: v for k, v in cpu.items() if k != "models"
    }


@pytest.mark.parametrize("gpus", [1, 2])
def test_tritons_config_gets_kind_gpu_instances_on_each_gpu(gpus):
    """KIND_GPU, count = workersPerGpu per listed GPU (Triton makes count instances on each),
    parsed as Triton parses it; the bulk queue sized for every instance."""
    settings = gpu.gpu_settings(MODELS / f"{TAGGER}.yaml", gpus)
    config = _pbtxt(config_pbtxt(TAGGER, settings, {"task": "tags"}, "resnet50.pt", queue_size=16))
    (group,) = config.instance_group
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert group.count == _per_gpu(TAGGER)
    assert list(group.gpus) == list(range(gpus))
    assert config.max_batch_size == settings["batchSize"]
    bulk = config.dynamic_batching.priority_queue_policy[2].max_queue_size
    assert bulk == max(16, 2 * settings["batchSize"] * _per_gpu(TAGGER) * gpus)


def test_tritons_cpu_config_keeps_kind_cpu():
    settings = configgen.frontend_settings(MODELS / f"{TAGGER}.yaml")
    config = _pbtxt(config_pbtxt(TAGGER, settings, {"task": "tags"}, "x.xml", queue_size=16))
    (group,) = config.instance_group
    assert (group.kind, group.count, list(group.gpus)) == (
        model_config_pb2.ModelInstanceGroup.KIND_CPU,
        settings["minWorkers"],
        [],
    )


def test_the_makefile_passes_device_and_gpus_on():
    """DEVICE=gpu serves build/gpu's config and generates Triton's repository from the GPU
    archives with --gpus; the default stays the CPU deployment."""
    make = shutil.which("make")
    assert make

    def dry(*args: str) -> str:
        return subprocess.run(
            [make, "-n", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60
        ).stdout

    gpu_serve = dry("serve", "DEVICE=gpu", "GPUS=2")
    assert 'buildsteps.gpu --gpus "2"' in gpu_serve
    assert "--ts-config build/gpu/config.properties" in gpu_serve
    assert "--ts-config config/config.properties" in dry("serve")
    triton = dry("triton-repo", "DEVICE=gpu", "GPUS=2")
    assert '--gpus "2" --model-store build/gpu/model-store' in triton
    refused = subprocess.run(
        [make, "-n", "-C", str(REPO), "serve", "DEVICE=tpu"], capture_output=True, text=True
    )
    assert refused.returncode != 0 and "DEVICE must be cpu or gpu" in refused.stderr


# ---------------------------------------------------------------------- the KServe bundles


@pytest.fixture
def weights(tmp_path):
    """A weights folder archive.sh accepts for eager archives: the real labels and provenance,
    a stand-in checkpoint (what the archive carries is checked, not what it computes)."""
    folder = tmp_path / "weights"
    folder.mkdir()
    for name in ("weights_info.json", "index_to_name.json"):
        shutil.copy2(REPO / "build" / "weights" / name, folder / name)
    (folder / "resnet50.pt").write_bytes(b"stand-in checkpoint")
    return folder


def _packed_config(mar) -> tuple[dict, dict]:
    """An archive's manifest and the model-config.yaml it carries (what TorchServe reads)."""
    import zipfile

    with zipfile.ZipFile(mar) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))["model"]
        return manifest, yaml.safe_load(archive.read(manifest["configFile"]))


def test_the_gpu_bundle_configures_gpu_workers(tmp_path, weights):
    """make kserve-bundle KSERVE_DEVICE=gpu KSERVE_GPUS=2: eager archives whose packed YAML
    says deviceType gpu, deviceIds 0..1 and workersPerGpu x 2 workers; config.properties
    with number_of_gpu=2 and the same workers; the bundle lint finds nothing."""
    from kserve_tools.bundle import build
    from kserve_tools.lint import bundle_findings

    bundle = build(tmp_path / "out", "gpu", gpus=2, weights_dir=weights)
    assert bundle.folder.name == "resnet50-serve-gpu"
    assert bundle_findings(bundle.folder) == []
    properties = javaproperties.loads((bundle.folder / "config" / "config.properties").read_text())
    assert properties["number_of_gpu"] == "2"
    entries = json.loads(properties["models"])
    assert set(entries) == set(configgen.model_names())  # no bulk lane in a pod
    for model in configgen.model_names():
        manifest, packed = _packed_config(bundle.folder / "model-store" / f"{model}.mar")
        assert manifest["serializedFile"] == "resnet50.pt"  # eager: PyTorch runs on CUDA
        assert packed["deviceType"] == "gpu" and packed["deviceIds"] == [0, 1]
        workers = 2 * _per_gpu(model)
        assert packed["minWorkers"] == packed["maxWorkers"] == workers
        assert entries[model]["1.0"]["minWorkers"] == workers
        source = yaml.safe_load((MODELS / f"{model}.yaml").read_text())
        assert packed["handler"] == source["handler"]


def test_the_triton_gpu_bundle_has_kind_gpu_instances(tmp_path, weights, capsys):
    """make kserve-bundle KSERVE_ENGINE=triton KSERVE_DEVICE=gpu: the repository for KServe's
    stock Triton runtime on a GPU node, KIND_GPU in every config.pbtxt, eager model files."""
    from kserve_tools.bundle import build_triton
    from kserve_tools.bundle import main as bundle_main

    bundle = build_triton(tmp_path / "out", gpus=1, weights_dir=weights)
    assert bundle.folder.name == "resnet50-triton-gpu"
    for model in configgen.model_names():
        config = _pbtxt((bundle.folder / model / "config.pbtxt").read_text())
        (group,) = config.instance_group
        assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        assert (group.count, list(group.gpus)) == (_per_gpu(model), [0])
        assert config.parameters["serialized_file"].string_value == "resnet50.pt"
        assert (bundle.folder / model / "1" / "resnet50.pt").is_file()
    with pytest.raises(SystemExit):
        bundle_main(["--engine", "triton", "--model-version", "2.0", "--out", str(tmp_path)])
    assert "--model-version is TorchServe's" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["overlays/gpu", "triton"])
def test_gpu_inference_services_are_linted_against_the_gpu_workers(target):
    """A pod asking for nvidia.com/gpu runs the GPU deployment's workers: the lint's batch-fill
    rule (containerConcurrency >= batchSize x maxWorkers) uses those, and the manifests meet
    it; with the CPU deployment's need met but not the GPU one's, the lint says so."""
    from kserve_tools import lint as kserve_lint
    from kserve_tools.lint import _gpus
    from kserve_tools.lint.inferenceservice import ServingLimits
    from kserve_tools.render import render

    (isvc,) = [r for r in render(REPO / "kserve" / target) if r.kind == "InferenceService"]
    assert _gpus(isvc) == 1
    need = ServingLimits.from_models(gpu.repo_models(1)).min_concurrency
    cpu_models = configgen.repo_models()
    cpu_need = ServingLimits.from_models(cpu_models).min_concurrency
    gpu_batch = {m: _gpu_section(m).get("batchSize", s["batchSize"]) for m, s in cpu_models.items()}
    assert need == max(gpu_batch[m] * _per_gpu(m) for m in cpu_models)
    predictor = isvc.obj["spec"]["predictor"]
    assert predictor["containerConcurrency"] >= need
    assert kserve_lint.lint([REPO / "kserve" / target]) == []
    if need > cpu_need:
        predictor["containerConcurrency"] = cpu_need
        problems = kserve_lint.inference_service_findings(
            isvc, {}, ServingLimits.from_models(gpu.repo_models(1))
        )
        assert any("a batch could never fill" in str(p) for p in problems)


# ---------------------------------------------------------------------- GPU memory per worker


def test_a_gpu_worker_reports_the_memory_it_holds_and_a_cpu_worker_nothing(monkeypatch):
    """describe's gpu.memory (servecore.backends.device_memory): what the worker's PyTorch
    reserved and allocated on its device and the device's free and total, bytes, None on a
    CPU; the per-batch gauge resnet50_worker_gpu_mb{worker_pid} (tsctl top's GPU MB) in MiB on
    a GPU worker only."""
    import os

    import torch

    from servecore import backends
    from servecore.metrics import WORKER_GPU, BatchMetrics

    assert backends.device_memory(torch.device("cpu")) is None
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * gib)
    assert backends.device_memory(torch.device("cuda:0")) == {
        "pid": os.getpid(),
        "reserved_bytes": 3 * gib,
        "allocated_bytes": 2 * gib,
        "device_free_bytes": 60 * gib,
        "device_total_bytes": 80 * gib,
    }

    class Kept:
        def __init__(self) -> None:
            self.added: list[tuple] = []

        def add(self, metric, value, labels=()):
            self.added.append((metric.name, value, labels))

        def flush(self) -> None:
            pass

    on_gpu, on_cpu = Kept(), Kept()
    BatchMetrics(on_gpu, "f16", gpu_bytes=lambda: 3 * gib + 2**19).batch(4, 4, 1.0, 2.0)
    BatchMetrics(on_cpu, "f32").batch(4, 4, 1.0, 2.0)
    assert [a for a in on_gpu.added if a[0] == WORKER_GPU.name] == [
        (WORKER_GPU.name, 3072.5, (str(os.getpid()),))
    ]
    assert not [a for a in on_cpu.added if a[0] == WORKER_GPU.name]


def test_workers_per_gpu_of_the_yaml_reach_both_engines_through_the_gpu_archives(tmp_path, weights):
    """What `make gpu` and `make triton-repo DEVICE=gpu` run (buildsteps.gpu.archive, then
    tritonrepo.generate --gpus --model-store build/gpu/model-store) on a YAML asking 3 workers
    per GPU: the archive's packed YAML has 3 x 2 workers, Triton's group 3 a GPU on both."""
    from tritonrepo.generate import generate

    models = tmp_path / "models"
    models.mkdir()
    source = yaml.safe_load((MODELS / f"{TAGGER}.yaml").read_text())
    source["gpu"]["workersPerGpu"] = 3
    (models / f"{TAGGER}.yaml").write_text(yaml.safe_dump(source))
    configs, store = tmp_path / "configs", tmp_path / "store"
    gpu.write_model_configs(configs, 2, models_dir=models)
    gpu.archive(store, 2, weights, configs=configs)
    _, packed = _packed_config(store / f"{TAGGER}.mar")
    assert packed["minWorkers"] == packed["maxWorkers"] == 6
    generate(tmp_path / "triton", models_dir=models, model_store=store, gpus=2, lanes=False)
    (group,) = _pbtxt((tmp_path / "triton" / TAGGER / "config.pbtxt").read_text()).instance_group
    assert (group.kind, group.count, list(group.gpus)) == (
        model_config_pb2.ModelInstanceGroup.KIND_GPU,
        3,
        [0, 1],
    )
