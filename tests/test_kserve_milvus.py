"""Milvus beside KServe (kserve/milvus), offline: rendered by kubectl kustomize, linted
(kserve_tools.lint.milvus), and mutated copies failing with the expected message; the index
Job reads the prefix the collection job (kserve/batch-job) writes its shards under; Milvus
runs with authentication, its keys from Secrets, behind a NetworkPolicy."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
import yaml

from kserve_tools import lint as kserve_lint
from kserve_tools.lint import milvus as milvuslint
from kserve_tools.lint.job import command_words
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
    assert set(objects()) == {"StatefulSet", "Service", "ConfigMap", "Job", "NetworkPolicy"}


def test_milvus_authenticates_with_keys_from_secrets_behind_a_network_policy():
    """What a user reads off the rendered manifests: authentication on, root's password and
    the index Job's token from the Secret milvus-auth, no credential in the manifests, and a
    NetworkPolicy admitting only the labelled pods (the index Job's) to the gRPC port."""
    rendered = objects()
    env = {e["name"]: e for e in _container_of(rendered["StatefulSet"].obj)["env"]}
    assert env[milvuslint.AUTH]["value"] == "true"
    root = env[milvuslint.ROOT_PASSWORD]["valueFrom"]["secretKeyRef"]
    assert root == {"name": "milvus-auth", "key": "root-password"}
    job = rendered["Job"].obj["spec"]["template"]
    words = command_words(job["spec"]["containers"][0])
    token = parser().parse_args(words[1:]).milvus_token_file
    [volume] = [v for v in job["spec"]["volumes"] if "secret" in v]
    assert volume["secret"] == {
        "secretName": "milvus-auth",
        "items": [{"key": "token", "path": "token"}],
    }
    [mount] = [
        m for m in job["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume["name"]
    ]
    assert token.parent == Path(mount["mountPath"]) and mount["readOnly"] is True
    policy = rendered["NetworkPolicy"].obj["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= (
        rendered["StatefulSet"].obj["spec"]["template"]["metadata"]["labels"].items()
    )
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"port": 19530, "protocol": "TCP"}]
    assert rule["from"] == [{"podSelector": {"matchLabels": job["metadata"]["labels"]}}]
    text = "\n".join(yaml.safe_dump(r.obj) for r in _rendered())
    assert "root:" not in text and "password:" not in text.lower()


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
        (
            "StatefulSet",
            lambda o: _env_of(o).pop(milvuslint.AUTH),
            "authentication is off: any pod that reaches port 19530 can rewrite the collection",
        ),
        (
            "StatefulSet",
            lambda o: _env_of(o).__setitem__(milvuslint.AUTH, {"value": "false"}),
            "authentication is off",
        ),
        (
            "StatefulSet",
            lambda o: _env_of(o).__setitem__(milvuslint.ROOT_PASSWORD, {"value": "hunter22"}),
            "COMMON_SECURITY_DEFAULTROOTPASSWORD is written into the manifest",
        ),
        (
            "StatefulSet",
            lambda o: _env_of(o).pop(milvuslint.ROOT_PASSWORD),
            "root keeps Milvus's default password",
        ),
        (
            "Job",
            lambda o: _replace(
                o, "--milvus-token-file=/var/run/secrets/milvus/token", "--no-progress"
            ),
            "no Milvus token from a Secret",
        ),
        (
            "Job",
            lambda o: _replace(o, "/var/run/secrets/milvus/token", "/work/token"),
            "--milvus-token-file '/work/token' is not in a mount of a Secret",
        ),
        (
            "Job",
            lambda o: _env_of(o).__setitem__("MILVUS_TOKEN", {"value": "root:Milvus"}),
            "MILVUS_TOKEN is written into the manifest",
        ),
        (
            "Job",
            lambda o: _container_of(o)["command"].append("--milvus-token=root:Milvus"),
            "milvus-token= is written into the command line",
        ),
        (
            "Job",
            lambda o: _env_of(o)["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"].update(
                name="storage-config"
            ),
            "names the models' storage secret 'storage-config'",
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


class _EnvView(dict):
    """A container's env list as a dict by name, written back on every change."""

    def __init__(self, container):
        super().__init__({e["name"]: e for e in container["env"]})
        self._container = container

    def _write(self):
        self._container["env"] = [{"name": k, **{f: v for f, v in e.items() if f != "name"}}
                                  for k, e in self.items()]  # fmt: skip

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._write()

    def pop(self, key):
        value = super().pop(key)
        self._write()
        return value


def _env_of(obj):
    return _EnvView(_container_of(obj))


def _replace(obj, old, new):
    container = _container_of(obj)
    container["command"] = [w.replace(old, new) for w in container["command"]]


def _policy_findings(mutate) -> list[str]:
    """``policy_findings`` of the rendered target after ``mutate(objects by kind)``."""
    rendered = {r.kind: r for r in copy.deepcopy(_rendered())}
    mutate(rendered)
    return [str(f) for f in milvuslint.policy_findings(list(rendered.values()))]


def _peer(objs, peer):
    objs["NetworkPolicy"].obj["spec"]["ingress"][0]["from"].append(peer)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda objs: objs.pop("NetworkPolicy"),
            "no NetworkPolicy selects Milvus's pods",
        ),
        (
            lambda objs: (
                objs["NetworkPolicy"].obj["spec"]["podSelector"]["matchLabels"].update(app="other")
            ),
            "no NetworkPolicy selects Milvus's pods",
        ),
        (
            lambda objs: _peer(objs, {"namespaceSelector": {}}),
            "spec.ingress[0]: admits more than labelled pods of this namespace",
        ),
        (lambda objs: _peer(objs, {"podSelector": {}}), "admits more than labelled pods"),
        (
            lambda objs: _peer(objs, {"ipBlock": {"cidr": "0.0.0.0/0"}}),
            "admits more than labelled pods",
        ),
        (
            lambda objs: objs["NetworkPolicy"].obj["spec"]["ingress"][0].pop("ports"),
            "admits every port, not port 19530 alone",
        ),
        (
            lambda objs: (
                objs["NetworkPolicy"].obj["spec"]["ingress"][0]["ports"].append({"port": 9091})
            ),
            "admits ['19530', '9091'], not port 19530 alone",
        ),
        (
            lambda objs: objs["Job"].obj["spec"]["template"]["metadata"].pop("labels"),
            "the NetworkPolicy admits none of these pods to Milvus",
        ),
    ],
)
def test_a_network_policy_that_admits_too_much_or_not_the_index_job_is_named(mutate, message):
    assert _policy_findings(lambda objs: None) == []
    found = _policy_findings(mutate)
    assert any(message in f for f in found), found


def test_the_index_jobs_inputs_are_read_in_either_option_form():
    words = ["tsctl", "index", "build", "--out", "http://milvus.x:19530", "s3://b/e/",
             "--collection=photos", "--work-dir", "/work", "--no-progress"]  # fmt: skip
    assert milvuslint.build_inputs(words) == ["s3://b/e/"]
    assert vars(parser().parse_args(words[1:]))["inputs"] == ["s3://b/e/"]
