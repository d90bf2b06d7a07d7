"""The collection job's Kubernetes manifest (kserve/batch-job), offline: rendered by kubectl
kustomize, linted (kserve_tools.joblint), mutated copies failing with the expected message,
and its shard arithmetic: the n pods' ``--shard`` values split a collection into disjoint
parts that add up to the whole."""

from __future__ import annotations

import copy
import functools

import pytest
import yaml

from kserve_tools import lint as kserve_lint
from kserve_tools.joblint import INDEX, command_words, job_findings, option
from kserve_tools.render import render
from tests.conftest import REPO
from tsclient.collection import Shard

JOB_DIR = REPO / "kserve" / "batch-job"


@functools.cache
def _rendered():
    return tuple(render(JOB_DIR))


def job():
    [resource] = copy.deepcopy(_rendered())
    assert resource.kind == "Job"
    return resource


def findings(resource) -> list[str]:
    return [str(f) for f in job_findings(resource, *kserve_lint.base_service())]


def _words(resource):
    return command_words(resource.obj["spec"]["template"]["spec"]["containers"][0])


def test_the_job_passes_the_lint_and_is_in_the_default_targets():
    assert JOB_DIR in kserve_lint.default_targets()
    assert findings(job()) == []
    assert kserve_lint.lint([JOB_DIR]) == []


def test_the_pods_shards_add_up_to_the_collection():
    resource = job()
    spec = resource.obj["spec"]
    n = spec["completions"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] <= n
    words = _words(resource)
    keys = [f"2024/{m:02d}/IMG_{i:05d}.jpg" for m in range(12) for i in range(250)]
    owners = {}
    outs = set()
    for index in range(n):  # what the Job controller substitutes in each pod
        shard = Shard.parse(option(words, "--shard").replace(INDEX, str(index)))
        assert (shard.index, shard.count) == (index, n)
        outs.add(option(words, "--out").replace(INDEX, str(index)))
        for key in keys:
            if shard.holds(key):
                assert key not in owners, f"{key} in shards {owners[key]} and {index}"
                owners[key] = index
    assert len(owners) == len(keys)  # together the whole
    assert len(outs) == n  # one output per pod
    bucket, service = kserve_lint.base_service()
    assert all(o.startswith(f"s3://{bucket}/") for o in outs)
    assert option(words, "--url").startswith(f"http://{service}-predictor.")


def _set_arg(resource, old, new):
    container = resource.obj["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [a.replace(old, new) for a in container["args"]]


def _mutate(name):
    resource = job()
    spec = resource.obj["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    if name == "completions":
        spec["completions"] = 5
    elif name == "mode":
        spec["completionMode"] = "NonIndexed"
    elif name == "parallelism":
        spec["parallelism"] = 9
    elif name == "restart":
        pod["restartPolicy"] = "Never"
    elif name == "out":
        _set_arg(resource, "shard-$(JOB_COMPLETION_INDEX)-of-4", "all")
    elif name == "bucket":
        _set_arg(resource, "s3://YOUR-BUCKET/", "s3://another-bucket/")
    elif name == "url":
        _set_arg(resource, "resnet50-predictor", "someone-else")
    elif name == "workdir":
        _set_arg(resource, "--work-dir=/work", "--work-dir=/tmp")
    elif name == "secret":
        container["env"] = [e for e in container["env"] if e["name"] != "AWS_ACCESS_KEY_ID"]
        container["env"].append({"name": "AWS_ACCESS_KEY_ID", "value": "AKIA..."})
    return resource


@pytest.mark.parametrize(
    ("mutation", "message"),
    [
        ("completions", "would not add up to the collection (completions is 5)"),
        ("mode", "pods get no JOB_COMPLETION_INDEX"),
        ("parallelism", "9 pods for 4 shards"),
        ("restart", "redoes the whole shard"),
        ("out", "shards overwrite each other"),
        ("bucket", "not in the bucket the storage initializer reads (YOUR-BUCKET)"),
        ("url", "is not the InferenceService 'resnet50'"),
        ("workdir", "is not an emptyDir mount"),
        ("secret", "AWS_ACCESS_KEY_ID does not come from a Secret"),
    ],
)
def test_mutated_job_fails_with_the_expected_message(mutation, message):
    problems = findings(_mutate(mutation))
    assert any(message in p for p in problems), problems


def test_the_lint_command_names_a_bad_job_file(tmp_path):
    bad = _mutate("completions").obj
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(bad))
    problems = [str(f) for f in kserve_lint.lint([path])]
    assert len(problems) == 1 and "spec.template.spec.containers[0].args" in problems[0]


def test_the_client_image_installs_the_client_pins():
    dockerfile = (JOB_DIR / "Dockerfile").read_text()
    pins = (REPO / "requirements.txt").read_text()
    for package in ("pyarrow", "tqdm", "tabulate", "prometheus-client", "tenacity"):
        assert f"\n{package}==" in pins and package in dockerfile
