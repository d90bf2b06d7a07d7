"""Milvus beside KServe (kserve/milvus), offline: rendered by kubectl kustomize, linted
(kserve_tools.milvuslint), and mutated copies failing with the expected message; the index
Job reads the prefix the collection job (kserve/batch-job) writes its shards under."""

from __future__ import annotations

import copy
import functools

import pytest

from kserve_tools import lint as kserve_lint
from kserve_tools import milvuslint
from kserve_tools.joblint import command_words
from kserve_tools.render import render
from serveclient.cli import parser


@functools.cache
def _rendered():
    return tuple(render(kserve_lint.MILVUS_DIR))


def objects() -> dict[str, object]:
    return {r.kind: r for r in copy.deepcopy(_rendered())}


def findings(resource) -> list[str]:
    if resource.kind == "Job":
        found = milvuslint.index_job_findings(resource, kserve_lint.collection_shards())
    else:
        found = milvuslint.findings(resource)
    return [str(f) for f in found]


def test_milvus_and_its_index_job_pass_the_lint_and_are_in_the_default_targets():
    assert kserve_lint.MILVUS_DIR in kserve_lint.default_targets()
    assert kserve_lint.lint([kserve_lint.MILVUS_DIR]) == []
    assert set(objects()) == {"StatefulSet", "Service", "ConfigMap", "Job"}


def test_the_index_job_reads_the_collection_jobs_shards_and_writes_to_the_service():
    shards = kserve_lint.collection_shards()
    assert shards == "s3://YOUR-BUCKET/embeddings/"
    job = objects()["Job"]
    words = command_words(job.obj["spec"]["template"]["spec"]["containers"][0])
    args = parser().parse_args(words[1:])  # tsctl's own parser reads the command
    assert (args.action, args.inputs, args.collection) == ("build", [shards], "photos")
    assert args.out == "http://milvus.default.svc.cluster.local:19530"
    service = objects()["Service"]
    assert service.name == milvuslint.SERVICE
    assert milvuslint.GRPC_PORT in {p["port"] for p in service.obj["spec"]["ports"]}


@pytest.mark.parametrize(
    ("kind", "mutate", "message"),
    [
        ("StatefulSet", lambda o: o["spec"].update(replicas=2), "2 replicas of local storage"),
        (
            "StatefulSet",
            lambda o: o["spec"].pop("volumeClaimTemplates"),
            "/var/lib/milvus is not on a volumeClaimTemplate",
        ),
        (
            "StatefulSet",
            lambda o: _container_of(o).pop("readinessProbe"),
            "a Milvus still starting",
        ),
        ("Service", lambda o: o["spec"]["ports"].pop(0), "no port 19530"),
        (
            "Job",
            lambda o: _replace(o, "s3://YOUR-BUCKET/embeddings/", "s3://YOUR-BUCKET/other/"),
            "not the collection job's shards 's3://YOUR-BUCKET/embeddings/'",
        ),
        (
            "Job",
            lambda o: _replace(o, "milvus.default", "vectors.default"),
            "is not the Service 'milvus' on port 19530",
        ),
        ("Job", lambda o: _replace(o, "--collection=photos", "--no-progress"), "no --collection"),
        (
            "Job",
            lambda o: o["spec"]["template"]["spec"].update(restartPolicy="Never"),
            "fetches every shard again",
        ),
        (
            "Job",
            lambda o: _container_of(o)["env"].__setitem__(
                0, {"name": "AWS_ACCESS_KEY_ID", "value": "AKIA..."}
            ),
            "AWS_ACCESS_KEY_ID does not come from a Secret",
        ),
    ],
)
def test_a_broken_copy_is_named(kind, mutate, message):
    resource = objects()[kind]
    assert findings(resource) == []
    mutate(resource.obj)
    assert any(message in f for f in findings(resource)), findings(resource)


def _container_of(obj):
    return obj["spec"]["template"]["spec"]["containers"][0]


def _replace(obj, old, new):
    container = _container_of(obj)
    container["command"] = [w.replace(old, new) for w in container["command"]]


def test_the_index_jobs_inputs_are_read_in_either_option_form():
    words = ["tsctl", "index", "build", "--out", "http://milvus.x:19530", "s3://b/e/",
             "--collection=photos", "--work-dir", "/work", "--no-progress"]  # fmt: skip
    assert milvuslint.build_inputs(words) == ["s3://b/e/"]
    assert vars(parser().parse_args(words[1:]))["inputs"] == ["s3://b/e/"]
