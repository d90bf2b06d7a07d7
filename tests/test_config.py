"""The shipped configuration: typed handler settings, and the generated config.properties files
current with their sources (config/server-base.properties, each server.properties,
serveshared/ports.py, config/models/*.yaml), each setting written in one of them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import javaproperties
import pytest
import yaml

from buildsteps import configgen
from servecore.config import ConfigError, HandlerConfig
from serveshared import ports
from tests.conftest import MODELS, REPO


def _properties(path) -> dict[str, str]:
    return javaproperties.loads(path.read_text())


def test_generated_configs_are_current():
    stale = [str(g.path.relative_to(REPO)) for g in configgen.generated() if not g.current]
    assert not stale, f"stale generated config {stale}: run `make config`"


def test_staleness_check_notices_an_edited_model_config(tmp_path):
    """The check above can fail: change a batch setting in a copy of the sources and the
    generated files no longer match; regenerating carries the new value into both."""
    for part in ("config", "kserve"):
        shutil.copytree(REPO / part, tmp_path / part)
    tagger = tmp_path / "config" / "models" / "resnet50-tagger.yaml"
    tagger.write_text(re.sub(r"^batchSize: \d+$", "batchSize: 7", tagger.read_text(), flags=re.M))
    assert not all(g.current for g in configgen.generated(tmp_path))
    for g in configgen.generated(tmp_path):
        g.path.write_text(g.text)
    local = json.loads(_properties(tmp_path / "config" / "config.properties")["models"])
    kserve = json.loads(_properties(tmp_path / "kserve" / "config.properties")["model_snapshot"])
    assert local["resnet50-tagger"]["1.0"]["batchSize"] == 7
    assert kserve["models"]["resnet50-tagger"]["1.0"]["batchSize"] == 7


def _configgen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-m", "buildsteps.configgen", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_command_passes_on_the_repository():
    result = _configgen("--check")
    assert result.returncode == 0, result.stderr


SERVER_FILES = [
    "config/server.properties",
    "kserve/server.properties",
    "kserve/runtime/server.properties",
]


@pytest.mark.parametrize("server_file", SERVER_FILES)
def test_each_server_setting_is_written_once(server_file):
    """The shared settings live in the base only, and reach every generated file from there."""
    base = _properties(configgen.BASE)
    assert not base.keys() & _properties(REPO / server_file).keys()
    generated = _properties(REPO / server_file.replace("server.properties", "config.properties"))
    assert {key: generated[key] for key in base} == base


@pytest.mark.parametrize("server_file", SERVER_FILES)
def test_a_setting_in_the_base_and_a_server_file_is_refused(tmp_path, server_file):
    for part in ("config", "kserve"):
        shutil.copytree(REPO / part, tmp_path / part)
    with (tmp_path / server_file).open("a") as f:
        f.write("\nmax_request_size=1024\n")
    with pytest.raises(SystemExit) as refused:
        configgen.generated(tmp_path)
    assert "sets max_request_size=1024, already set in" in str(refused.value)
    assert "(max_request_size=33554432)" in str(refused.value)


def test_local_addresses_are_the_clients_default_ports():
    """config/server.properties binds nothing itself: the generator writes serveshared.ports'
    addresses, where TorchServeClient and tsctl look by default."""
    assert (
        not {"inference_address", "management_address", "metrics_address"}
        & _properties(REPO / "config" / "server.properties").keys()
    )
    properties = _properties(REPO / "config" / "config.properties")
    assert (
        properties["inference_address"],
        properties["management_address"],
        properties["metrics_address"],
    ) == (
        f"http://127.0.0.1:{ports.INFERENCE}",
        f"http://127.0.0.1:{ports.MANAGEMENT}",
        f"http://127.0.0.1:{ports.METRICS}",
    )


def test_kserve_configs_bind_their_own_addresses():
    """Both KServe configs set every address themselves (pod IP, ports clear of the wrapper's):
    none of the local defaults is written into them."""
    for name in ("kserve/config.properties", "kserve/runtime/config.properties"):
        assert "serveshared/ports.py" not in (REPO / name).read_text(), name


def test_archive_sh_writes_no_default_of_its_own():
    """archive.sh asks model_files.artifacts (BACKEND, QUANTIZE) and configgen (VERSION, the
    archive's name) instead of repeating their values."""
    code = "\n".join(
        line
        for line in (REPO / "archive.sh").read_text().splitlines()
        if not line.lstrip().startswith("#")
    )
    assert not re.findall(r":-(?:openvino|none|auto|\d+\.\d+)\}|\"\d+\.\d+\"|-\$VERSION", code)


@pytest.mark.parametrize(
    ("args", "printed"),
    [
        (["version"], configgen.VERSION),
        (["archive-name", "resnet50-tagger"], "resnet50-tagger.mar"),
        (["archive-name", "resnet50-tagger", configgen.VERSION], "resnet50-tagger.mar"),
        (["archive-name", "resnet50-tagger", "2.0"], "resnet50-tagger-2.0.mar"),
    ],
)
def test_archive_sh_asks_for_the_version_and_the_archive_name(args, printed):
    result = _configgen(*args)
    assert (result.returncode, result.stdout) == (0, printed + "\n"), result.stderr


@pytest.mark.parametrize("model", MODELS)
def test_config_properties_carries_each_model_yaml(model):
    """config.properties keys batch settings by the archive's model name and version (1.0,
    archive.sh's default), with the values of the model's own YAML."""
    model_yaml = yaml.safe_load((REPO / "config" / "models" / f"{model}.yaml").read_text())
    properties = _properties(REPO / "config" / "config.properties")
    entry = json.loads(properties["models"])[model]["1.0"]
    assert entry["marName"] == f"{model}.mar" and f"{model}.mar" in properties["load_models"]
    for key in configgen.FRONTEND_KEYS:
        assert entry[key] == model_yaml[key], key
    assert HandlerConfig.from_mapping(model_yaml["handler"]).task == (
        "embedding" if model.endswith("embedding") else "tags"
    )


def test_config_properties_keeps_token_auth_and_the_model_api_off():
    properties = _properties(REPO / "config" / "config.properties")
    assert properties.get("disable_token_authorization", "false") == "false"
    assert properties["enable_model_api"] == "false"  # path registrations run code (ops tests)
    assert properties["load_models"] == (
        "resnet50-embedding.mar,resnet50-tagger.mar,"
        "resnet50-embedding-bulk=resnet50-embedding.mar"  # the embedding model's bulk lane
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"task": "segment"}, "handler.task must be one of ('embedding', 'tags'), got 'segment'"),
        ({"top_k": 0}, "handler.top_k must be in 1..100000, got 0"),
        ({"top_k": True}, "handler.top_k must be int, got True"),
        ({"top_k": "5"}, "handler.top_k must be int, got '5'"),
        ({"device": "tpu"}, "handler.device must be one of ('auto', 'cpu', 'cuda'), got 'tpu'"),
        (
            {"precision": "fp16"},
            "handler.precision must be one of ('auto', 'f32', 'bf16', 'int8'), got 'fp16'",
        ),
        ({"topk": 3}, "unknown handler setting(s) ['topk']"),
    ],
)
def test_bad_settings_are_refused_with_a_useful_message(section, message):
    with pytest.raises(ConfigError) as caught:
        HandlerConfig.from_mapping(section)
    assert message in str(caught.value)


def test_explain_settings_are_one_nested_section():
    """``handler: explain:`` reaches the explanation settings, checked like the rest."""
    config = HandlerConfig.from_mapping(
        {"max_json_depth": 8, "explain": {"max_n_steps": 100, "method": "ig"}}
    )
    assert config.max_json_depth == 8
    assert (config.explain.max_n_steps, config.explain.method) == (100, "ig")
    assert config.explain.n_steps == HandlerConfig().explain.n_steps
    for section, message in (
        ({"explain": {"steps": 3}}, "unknown handler.explain setting(s) ['steps']"),
        ({"explain": {"n_steps": "8"}}, "handler.explain.n_steps must be int, got '8'"),
        ({"explain": {"n_steps": 65}}, "handler.explain.n_steps must be in 1..64, got 65"),
        ({"explain": {"method": "lime"}}, "handler.explain.method must be one of"),
        ({"explain": "ig"}, "handler.explain must be a mapping, got 'ig'"),
        ({"explain_method": "ig"}, "unknown handler setting(s) ['explain_method']"),
    ):
        with pytest.raises(ConfigError) as caught:
            HandlerConfig.from_mapping(section)
        assert message in str(caught.value)


def test_an_answer_the_handler_lets_out_fits_every_server():
    """The handler refuses (413, alone) an answer over max_response_bytes; TorchServe's frontend
    would drop the worker's whole batch for one over its max_response_size: the handler's limit
    must never be the larger."""
    limit = HandlerConfig().max_response_bytes
    for generated in configgen.generated():
        properties = javaproperties.loads(generated.text)
        assert limit <= int(properties["max_response_size"]), generated.path
