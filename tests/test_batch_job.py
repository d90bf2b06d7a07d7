"""The collection job's Kubernetes manifest (kserve/batch-job), offline: rendered by kubectl
kustomize, linted (kserve_tools.lint.job), mutated copies failing with the expected message,
its own credentials and prefix (never the models' storage), and its shard arithmetic: the n
pods' ``--shard`` values split a collection into disjoint parts that add up to the whole."""

from __future__ import annotations

import copy
import functools
import os
import threading
from typing import ClassVar

import pyarrow.parquet as pq
import pytest
import yaml

from kserve_tools import lint as kserve_lint
from kserve_tools.lint import job as joblint
from kserve_tools.lint.job import INDEX, command_words, job_findings, option
from kserve_tools.render import render
from serveclient import cli, errors
from serveclient.batchjob import Job, ListSink, PartSink, Plan, Window
from serveclient.client import Answers
from serveclient.collection import Entry, Shard
from serveclient.traffic import Traffic
from serveclient.vectors import EMBEDDING_DIM, Output
from tests.conftest import REPO

JOB_DIR = REPO / "kserve" / "batch-job"


@functools.cache
def _rendered():
    return tuple(render(JOB_DIR))


def job():
    [resource] = [r for r in copy.deepcopy(_rendered()) if r.kind == "Job"]
    return resource


def findings(resource) -> list[str]:
    service = kserve_lint.base_service()[1]
    return [str(f) for f in job_findings(resource, kserve_lint.model_storage(), service)]


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
    service = kserve_lint.base_service()[1]
    assert option(words, "--url").startswith(f"http://{service}-predictor.")


def test_the_job_writes_with_its_own_credentials_under_its_own_prefix():
    """The pods hold no key to the models' archives: their S3 keys come from a Secret of
    their own, they run as a ServiceAccount of their own without an API token, and their
    prefix and every InferenceService's storageUri are apart."""
    resource = job()
    pod = resource.obj["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    secrets = {env[k]["valueFrom"]["secretKeyRef"]["name"] for k in joblint.CREDENTIALS}
    assert secrets == {"resnet50-embeddings-s3"}
    assert not secrets & joblint.MODEL_STORAGE_SECRETS
    [account] = [r for r in _rendered() if r.kind == "ServiceAccount"]
    assert pod["serviceAccountName"] == account.name == "resnet50-embed"
    assert pod["automountServiceAccountToken"] is False
    assert account.obj["automountServiceAccountToken"] is False
    storage = kserve_lint.model_storage()
    assert "s3://YOUR-BUCKET/resnet50-serve/" in storage and len(storage) >= 5
    prefix = option(_words(resource), "--out").rsplit("/", 1)[0] + "/"
    assert prefix == kserve_lint.collection_shards() == "s3://YOUR-BUCKET/embeddings/"
    for uri in storage:
        assert not uri.startswith(prefix) and not prefix.startswith(uri.rstrip("/")), uri


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
    elif name == "models-prefix":
        _set_arg(resource, "s3://YOUR-BUCKET/embeddings/", "s3://YOUR-BUCKET/resnet50-serve/e/")
    elif name == "bucket-root":
        _set_arg(resource, "s3://YOUR-BUCKET/embeddings/", "s3://YOUR-BUCKET/")
    elif name == "storage-secret":
        container["env"][1]["valueFrom"]["secretKeyRef"]["name"] = "s3-credentials"
    elif name == "storage-envfrom":
        container["envFrom"] = [{"secretRef": {"name": "storage-config"}}]
    elif name == "account":
        del pod["serviceAccountName"]
    elif name == "api-token":
        del pod["automountServiceAccountToken"]
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
        ("models-prefix", "and the models' storage 's3://YOUR-BUCKET/resnet50-serve/' overlap"),
        ("bucket-root", "the job's keys, scoped to its prefix, would reach the archives"),
        ("storage-secret", "names the models' storage secret 's3-credentials'"),
        ("storage-envfrom", "names the models' storage secret 'storage-config'"),
        ("account", "none: the pods run as the namespace's default ServiceAccount"),
        ("api-token", "a Kubernetes API token is mounted in pods that decode untrusted photos"),
        ("url", "is not the InferenceService 'resnet50'"),
        ("workdir", "is not an emptyDir mount"),
        ("secret", "AWS_ACCESS_KEY_ID does not come from a Secret"),
        ("secret", "AWS_ACCESS_KEY_ID is written into the manifest"),
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


# ------------------------------------------------------------------ sharing the server


def test_the_pods_send_bulk_traffic():
    """The Job's pods run ``tsctl embed`` without ``--priority``: bulk, served after people."""
    words = _words(job())
    assert option(words, "--priority") in (None, "bulk")
    assert cli.parser().parse_args(["embed", "photos"]).priority == "bulk"
    assert cli.parser().parse_args(["tag", "a.jpg", "--priority", "interactive"]).priority == (
        "interactive"
    )


def test_a_refusal_halves_the_window_and_answers_grow_it_back():
    window = Window(16)
    stopped = threading.Event()
    ticket = window.enter(stopped)
    window.leave()
    window.refused(ticket)
    assert window.size == 8
    window.refused(window.enter(stopped))
    window.leave()
    assert window.size == 4
    for _ in range(3):
        window.refused(window.enter(stopped))
        window.leave()
    assert window.size == 1  # never below one
    for expected in (2, 3, 4):
        window.answered()
        assert window.size == expected
    for _ in range(100):
        window.answered()
    assert window.size == 16  # never above Plan.concurrency


def test_a_burst_of_refusals_from_one_window_halves_it_once():
    """Requests sent together and refused together answer one window: it is cut once, not
    once per request (else 16 refusals would leave 1 where 8 is right)."""
    window = Window(16)
    stopped = threading.Event()
    tickets = [window.enter(stopped) for _ in range(16)]
    for ticket in tickets:
        window.leave()
        window.refused(ticket)
    assert window.size == 8


class _Server:
    """A fake client: refuses the first ``refuse`` requests with 503 (Retry-After 0), counts
    requests on the wire at once, answers every image with its length, the images in
    ``cached_images`` from the 'cache' (TorchServe's count)."""

    bytes_sent = 0  # Client's count of request bodies: nothing goes on a wire here

    def __init__(self, refuse: int = 0, cached_images: frozenset[bytes] = frozenset()):
        self.refuse, self.cached_images = refuse, cached_images
        self.traffic, self.on_wire, self.most_on_wire = [], 0, 0
        self.lock = threading.Lock()

    def infer_answers(self, model, images, *, output, protocol, topk, traffic):
        with self.lock:
            self.traffic.append(traffic)
            self.on_wire += 1
            self.most_on_wire = max(self.most_on_wire, self.on_wire)
            refused = self.refuse > 0
            self.refuse -= refused
        try:
            if refused:
                error = errors.ApiError(503, "Overloaded", "bulk held back")
                error.retry_after = 0.0
                raise error
            hits = sum(1 for i in images if i in self.cached_images)
            # What TorchServeClient reads from X-Cache-Hits: all, none, or "some" (unnamed).
            told = {0: False, len(images): True}.get(hits)
            return Answers(
                [[float(len(i))] * EMBEDDING_DIM for i in images],
                "f32",
                (told,) * len(images),
                hits,
            )
        finally:
            with self.lock:
                self.on_wire -= 1


def _photos(tmp_path, contents: list[bytes]) -> list[Entry]:
    entries = []
    for i, data in enumerate(contents):
        path = tmp_path / f"{i:03d}.jpg"
        path.write_bytes(data)
        info = path.stat()
        entries.append(Entry(str(path), path.name, info.st_size, info.st_mtime_ns))
    return entries


def test_a_job_sends_bulk_and_after_refusals_finishes_with_its_window_regrown(tmp_path):
    server = _Server(refuse=5)
    job = Job(server, "m", "embedding", ListSink(), Plan(concurrency=8, per_request=1))
    summary = job.run(_photos(tmp_path, [b"x" * (i + 1) for i in range(40)]))
    assert (summary.done, summary.failed) == (40, 0)
    assert {t.priority for t in server.traffic} == {"bulk"}
    assert len(server.traffic) == 45  # the five refused were sent again
    assert server.most_on_wire <= 8
    assert job.window.size == 8


def test_the_parquet_rows_and_the_summary_count_cache_hits(tmp_path):
    """Two requests of two images: one all from the cache, one half: the first's rows are
    cached, the second's cannot be told apart (null) but both count in the summary."""
    contents = [b"seen-1", b"seen-2", b"seen-3", b"new-1"]
    server = _Server(cached_images=frozenset(contents[:3]))
    output = Output(tmp_path / "out.parquet", "embedding", {"model": "m"})
    job = Job(server, "m", "embedding", PartSink(output), Plan(concurrency=1, per_request=2))
    summary = job.run(_photos(tmp_path, contents))
    assert (summary.done, summary.cache_hits) == (4, 3)
    rows = pq.read_table(output.out).to_pydict()
    assert dict(zip(rows["path"], rows["cached"])) == {
        str(tmp_path / "000.jpg"): True,
        str(tmp_path / "001.jpg"): True,
        str(tmp_path / "002.jpg"): None,
        str(tmp_path / "003.jpg"): None,
    }


def test_without_a_cache_every_row_is_not_cached(tmp_path):
    output = Output(tmp_path / "out.parquet", "embedding", {"model": "m"})
    job = Job(_Server(), "m", "embedding", PartSink(output), Plan(concurrency=2, per_request=3))
    summary = job.run(_photos(tmp_path, [b"a", b"bb", b"ccc", b"dddd"]))
    assert summary.cache_hits == 0
    assert pq.read_table(output.out).column("cached").to_pylist() == [False] * 4


class _PolicyServer(_Server):
    """Records the scheduling policy of the thread each request is sent from."""

    def __init__(self) -> None:
        super().__init__()
        self.policies: set[int] = set()

    def infer_answers(self, model, images, **kwargs):
        with self.lock:
            self.policies.add(os.sched_getscheduler(0))
        return super().infer_answers(model, images, **kwargs)


@pytest.mark.parametrize(
    ("traffic", "policy"),
    [(Traffic("bulk"), os.SCHED_IDLE), (Traffic("interactive"), os.SCHED_OTHER)],
)
def test_a_bulk_job_sends_from_threads_that_yield_the_cpu(tmp_path, traffic, policy):
    server = _PolicyServer()
    job = Job(
        server, "m", "embedding", ListSink(), Plan(concurrency=2, per_request=1), traffic=traffic
    )
    assert job.run(_photos(tmp_path, [b"a", b"bb", b"ccc"])).done == 3
    assert server.policies == {policy}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's thread is left as it was


# ------------------------------------------------------------------ the pods' runs, offline


@pytest.fixture
def s3(monkeypatch):
    """A local S3 (moto's server on a free loopback port) with the bucket ``photos``, reached
    as the pods reach theirs (AWS_ENDPOINT_URL and credentials in the environment); a boto3
    client."""
    import boto3
    from moto.server import ThreadedMotoServer

    from devtools.server import free_port

    port = free_port()
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
        client.create_bucket(Bucket="photos")
        yield client
    finally:
        server.stop()


class _PodServer(_Server):
    """``_Server`` as the pods' ``tsctl embed --url`` takes it: no management API."""

    reaches_management = False
    urls: ClassVar[dict[str, str]] = {"inference": "http://resnet50-predictor.default"}


def _embed(argv: list[str]) -> tuple[dict, int]:
    """``tsctl embed ARGV`` in this process, as interactive traffic (bulk would leave the test
    process SCHED_IDLE for good): (its ``--json`` summary, its exit status)."""
    from serveclient.cli.batch import cmd_embed

    args = cli.parser().parse_args([*argv, "--priority", "interactive"])
    data, _, code = cmd_embed(_PodServer(), args)
    return data, code


def _pod(index: int, photos, work) -> tuple[dict, int]:
    """Pod ``index``'s own ``tsctl embed`` arguments, the collection at ``photos``, its
    emptyDir at ``work`` and the bucket ``photos`` (``YOUR-BUCKET`` is no valid name)."""
    words = _words(job())
    argv = words[words.index("tsctl") + 1 : words.index(";")]
    return _embed(
        [
            a.replace(INDEX, str(index))
            .replace("/data/photos", str(photos))
            .replace("--work-dir=/work", f"--work-dir={work}")
            .replace("YOUR-BUCKET", "photos")
            for a in argv
        ]
    )


def test_the_pods_keep_a_name_that_is_not_utf8_and_their_shards_stay_the_collection(tmp_path, s3):
    """Before: a file name that is not UTF-8 raised in its pod on every restart (a crash loop
    until backoffLimit). Now each pod finishes (exit 0) and uploads its shard, the name kept
    byte for byte; after a photo moves to another folder (so, maybe, to another shard), the
    next Job's pods (fresh emptyDirs: each resumes from its shard's object) leave every photo
    in exactly one shard object, once."""
    photos = tmp_path / "photos"
    names = [f"{album}/IMG_{i:03d}.jpg" for album in ("2023", "2024") for i in range(12)]
    for name in names:
        (photos / name).parent.mkdir(parents=True, exist_ok=True)
        (photos / name).write_bytes(name.encode())
    odd = os.fsencode(photos) + b"/2024/\xe9t\xe9.jpg"
    with open(odd, "wb") as handle:
        handle.write(b"latin-1")
    n = job().obj["spec"]["completions"]

    def every_row() -> list[bytes]:
        rows = []
        for listed in s3.list_objects_v2(Bucket="photos", Prefix="embeddings/")["Contents"]:
            local = tmp_path / "got.parquet"
            s3.download_file("photos", listed["Key"], str(local))
            rows += pq.read_table(local).to_pylist()
        return sorted(r["path_bytes"] or r["path"].encode() for r in rows)

    assert [_pod(i, photos, tmp_path / f"work-{i}")[1] for i in range(n)] == [0] * n
    expected = sorted([os.fsencode(photos / name) for name in names] + [odd])
    assert every_row() == expected
    (photos / "2023" / "IMG_000.jpg").rename(photos / "2024" / "IMG_000-moved.jpg")
    reruns = [_pod(i, photos, tmp_path / f"next-{i}") for i in range(n)]
    assert [code for _, code in reruns] == [0] * n
    assert sum(data["skipped"] for data, _ in reruns) == len(expected) - 1
    assert sum(data["gone"] for data, _ in reruns) == 1
    assert every_row() == sorted(
        [e for e in expected if not e.endswith(b"2023/IMG_000.jpg")]
        + [os.fsencode(photos / "2024" / "IMG_000-moved.jpg")]
    )


def test_an_upload_that_fails_says_so_and_the_rerun_uploads_what_was_kept(tmp_path, s3):
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        (photos / f"{i}.jpg").write_bytes(b"x" * (i + 1))
    argv = ["embed", str(photos), "--out", "s3://later/v.parquet", f"--work-dir={tmp_path}"]
    with pytest.raises(errors.ServeError, match="cannot upload") as failed:
        _embed(argv)
    assert "rerun" in failed.value.hint
    s3.create_bucket(Bucket="later")
    data, code = _embed(argv)
    assert code == 0 and (data["rows"], data["skipped"]) == (3, 3)
    s3.download_file("later", "v.parquet", str(tmp_path / "got.parquet"))
    assert pq.read_metadata(tmp_path / "got.parquet").num_rows == 3
