"""The shipped configuration: typed handler settings, and frontend settings in step."""
from __future__ import annotations

import json

import pytest
import yaml

from handlers.config import ConfigError, HandlerConfig
from tsclient.server import read_properties
from tests.conftest import MODELS, REPO


def _models_property() -> dict:
    properties = read_properties((REPO / "config" / "config.properties").read_text())
    return json.loads(properties["models"])


@pytest.mark.parametrize("model", MODELS)
def test_config_properties_and_model_yaml_agree(model):
    """config.properties keys batch settings by the archive's model name and version (1.0,
    archive.sh's default); the YAML in the archive repeats them."""
    model_yaml = yaml.safe_load((REPO / "config" / f"{model}.yaml").read_text())
    entry = _models_property()[model]["1.0"]
    assert entry["marName"] == f"{model}.mar"
    for key in ("batchSize", "maxBatchDelay", "minWorkers", "maxWorkers", "responseTimeout"):
        assert entry[key] == model_yaml[key], key
    assert HandlerConfig.from_mapping(model_yaml["handler"]).task == (
        "embedding" if model.endswith("embedding") else "tags")


def test_config_properties_keeps_token_auth_and_enables_model_api():
    properties = read_properties((REPO / "config" / "config.properties").read_text())
    assert properties.get("disable_token_authorization", "false") == "false"
    assert properties["enable_model_api"] == "true"
    assert properties["load_models"] == "resnet50-embedding.mar,resnet50-tagger.mar"


def test_defaults():
    config = HandlerConfig.from_mapping(None)
    assert (config.task, config.top_k, config.device) == ("tags", 5, "auto")


@pytest.mark.parametrize("section, message", [
    ({"task": "segment"}, "handler.task must be one of ('embedding', 'tags'), got 'segment'"),
    ({"top_k": 0}, "handler.top_k must be in 1..1000, got 0"),
    ({"top_k": True}, "handler.top_k must be int, got True"),
    ({"top_k": "5"}, "handler.top_k must be int, got '5'"),
    ({"device": "tpu"}, "handler.device must be one of ('auto', 'cpu', 'cuda'), got 'tpu'"),
    ({"topk": 3}, "unknown handler setting(s) ['topk']"),
])
def test_bad_settings_are_refused_with_a_useful_message(section, message):
    with pytest.raises(ConfigError) as caught:
        HandlerConfig.from_mapping(section)
    assert message in str(caught.value)
