"""The bulk lane (#37): a second registration of a model whose workers run under Linux's
``SCHED_IDLE``, where collection jobs send their bulk traffic. What a user would check: the
lane is registered beside the model, serves the same answers at the same precision, every
thread of its worker (and only its worker) has the idle policy, ``tsctl embed`` sends there
and ``--priority interactive`` does not; the generated configurations hold it; a server
without it leaves the job where it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import javaproperties
import psutil
import pytest
import yaml

from buildsteps import configgen
from serveclient import errors
from serveclient.batchjob import bulk_lane
from servecore.config import ConfigError, HandlerConfig
from servecore.lanes import lane_of
from servecore.priority import Priority
from tests import imagegen
from tests.conftest import REPO
from tests.served import handled, raw_answer, settled, tsctl

MODEL, LANE = "resnet50-embedding", "resnet50-embedding-bulk"
PHOTO = imagegen.jpeg(320, 240, seed=7)


def policies(pid: int) -> dict[int, int]:
    """The scheduling policy of every thread of process ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = os.sched_getscheduler(int(tid))
        except ProcessLookupError:
            continue
    return out


def test_yield_cpu_puts_every_thread_and_later_ones_under_sched_idle():
    # In a child process: the policy is per thread and cannot be taken back unprivileged.
    code = textwrap.dedent(
        """
        import json, os, threading
        from servecore.lanes import yield_cpu
        gate = threading.Event()
        seen = {}
        def record(name):
            seen[name] = os.sched_getscheduler(0)
            gate.wait()
        early = threading.Thread(target=record, args=("early",)); early.start()
        applied = yield_cpu()
        late = threading.Thread(target=record, args=("late",)); late.start()
        while len(seen) < 2:
            pass
        after = {int(t): os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}
        gate.set(); early.join(); late.join()
        print(json.dumps({"applied": applied, "late": seen["late"], "threads": after}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["applied"] == "SCHED_IDLE"
    assert len(result["threads"]) == 3  # main, early, late
    assert set(result["threads"].values()) == {os.SCHED_IDLE}
    assert result["late"] == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # this process untouched


def test_lane_of_and_the_name_check():
    assert lane_of(LANE, LANE) is Priority.BULK
    assert lane_of(MODEL, LANE) is Priority.INTERACTIVE
    assert lane_of(MODEL, "") is Priority.INTERACTIVE
    assert HandlerConfig.from_mapping({"bulk_model": LANE}).bulk_model == LANE
    with pytest.raises(ConfigError, match=r"handler\.bulk_model must be a model name"):
        HandlerConfig.from_mapping({"bulk_model": "../other"})


def test_the_local_config_registers_the_lane_and_kserve_configs_do_not():
    shipped = yaml.safe_load((REPO / "config/models" / f"{MODEL}.yaml").read_text())
    assert shipped["handler"]["bulk_model"] == LANE
    assert configgen.bulk_lanes() == {LANE: MODEL}
    local, kserve, runtime = (g.text for g in configgen.generated())
    properties = javaproperties.loads(local)
    assert f"{LANE}={MODEL}.mar" in properties["load_models"].split(",")
    models = json.loads(properties["models"])
    lane, model = models[LANE]["1.0"], models[MODEL]["1.0"]
    assert lane == model  # the model's archive and every frontend setting
    assert LANE not in kserve and LANE not in runtime


def test_the_triton_repository_holds_the_lane(tmp_path, model_store):
    from tritonrepo.generate import generate

    folders = generate(tmp_path / "repo", model_store=model_store)
    assert sorted(f.name for f in folders) == sorted([MODEL, LANE, "resnet50-tagger"]), (
        "one folder per model and one for the lane"
    )
    config = (tmp_path / "repo" / LANE / "config.pbtxt").read_text()
    assert f'name: "{LANE}"' in config
    assert 'key: "archive_name" value: { string_value: "resnet50-embedding" }' in config
    model_config = (tmp_path / "repo" / MODEL / "config.pbtxt").read_text()
    expected = model_config.replace(f'name: "{MODEL}"', f'name: "{LANE}"')
    assert [line for line in config.splitlines() if "archive_name" not in line] == (
        expected.splitlines()
    ), "the lane's config.pbtxt is its model's but for the name"
    for path in (tmp_path / "repo" / MODEL / "1").rglob("*"):
        twin = tmp_path / "repo" / LANE / "1" / path.relative_to(tmp_path / "repo" / MODEL / "1")
        assert twin.exists(), twin
    lanes_off = generate(tmp_path / "kserve", model_store=model_store, lanes=False)
    assert LANE not in [f.name for f in lanes_off]


class FakeClient:
    """Describe answers by model name; a missing one raises as serveclient does (404)."""

    def __init__(self, entries: dict[str, dict]) -> None:
        self.entries = entries

    def describe(self, model: str, customized: bool = False) -> list[dict]:
        if model not in self.entries:
            raise errors.NotFound(404, "ModelNotFoundException", f"{model} not found", "")
        return [self.entries[model]]


def entry(**handler) -> dict:
    return {"batchSize": 16, "workers": [{}], "customizedMetadata": {"handler": handler}}


def test_a_bulk_job_goes_to_the_lane_only_where_it_is_served():
    served = FakeClient({MODEL: entry(bulk_model=LANE), LANE: entry(bulk_model=LANE)})
    assert bulk_lane(served, MODEL, served.entries[MODEL]) == (LANE, served.entries[LANE])
    # --url (no management API to plan from): routed, planned from the defaults.
    assert bulk_lane(served, MODEL, None) == (LANE, None)
    unregistered = FakeClient({MODEL: entry(bulk_model=LANE)})  # a KServe runtime
    assert bulk_lane(unregistered, MODEL, unregistered.entries[MODEL]) == (
        MODEL,
        unregistered.entries[MODEL],
    )
    none = FakeClient({MODEL: entry()})
    assert bulk_lane(none, MODEL, none.entries[MODEL]) == (MODEL, none.entries[MODEL])
    assert bulk_lane(FakeClient({}), MODEL, None) == (MODEL, None)  # cannot describe


def worker_pid(server, model: str) -> int:
    (worker,) = server.client().describe(model)[0]["workers"]
    return int(worker["pid"])


def test_the_lane_on_torchserve(torchserve, tmp_path):
    client = torchserve.client()
    custom = {
        m: client.describe(m, customized=True)[0]["customizedMetadata"] for m in (MODEL, LANE)
    }
    assert (custom[LANE]["lane"], custom[LANE]["cpu_policy"]) == ("bulk", "SCHED_IDLE")
    assert (custom[MODEL]["lane"], custom[MODEL]["cpu_policy"]) == ("interactive", "normal")
    assert custom[LANE]["precision"] == custom[MODEL]["precision"]
    assert custom[LANE]["precision_choice"] == custom[MODEL]["precision_choice"]
    lane_threads = policies(worker_pid(torchserve, LANE))
    assert len(lane_threads) > 1 and set(lane_threads.values()) == {os.SCHED_IDLE}
    assert os.SCHED_IDLE not in policies(worker_pid(torchserve, MODEL)).values()
    assert raw_answer(torchserve, LANE, PHOTO) == raw_answer(torchserve, MODEL, PHOTO)

    folder = tmp_path / "photos"
    folder.mkdir()
    for seed in range(3):
        (folder / f"{seed}.jpg").write_bytes(imagegen.jpeg(200, 150, seed=seed))
    for argv, sent_to, not_to in (
        ([], LANE, MODEL),
        (["--priority", "interactive"], MODEL, LANE),
    ):
        before = {m: handled(torchserve, m)[0] for m in (MODEL, LANE)}
        done = tsctl(
            torchserve, "embed", str(folder), "--out", str(tmp_path / f"{sent_to}.parquet"), *argv
        )
        assert done.returncode == 0, done.stderr
        # The frontend copies each worker's metric lines in order, so one request of ours to
        # the other lane, once counted, shows every request tsctl sent there before it too.
        assert raw_answer(torchserve, not_to, PHOTO)
        after = settled(
            lambda: {m: handled(torchserve, m)[0] for m in (MODEL, LANE)},
            lambda now, b=before, to=sent_to, other=not_to: (
                now[to] - b[to] >= 1 and now[other] - b[other] >= 1
            ),
        )
        assert after[sent_to] > before[sent_to], f"tsctl embed {argv} sent nothing to {sent_to}"
        assert after[not_to] - before[not_to] == 1, f"tsctl embed {argv} sent to {not_to}"


def commands(processes: list[psutil.Process]) -> dict[int, str]:
    """Each live process's command line by pid; a stub another test killed, which its server
    has not reaped yet (a zombie), has none."""
    found = {}
    for proc in processes:
        try:
            found[proc.pid] = " ".join(proc.cmdline())
        except psutil.Error:
            continue
    return found


def test_the_lane_on_triton(triton):
    """On the session's Triton: the lane's stub idle-scheduled, the model's not, one answer."""
    from tests.served import v2_infer

    stubs = {
        model: pid
        for pid, command in commands(
            psutil.Process(triton.process.pid).children(recursive=True)
        ).items()
        for model in (MODEL, LANE)
        if f"/{model}/" in command
    }
    assert set(stubs) == {MODEL, LANE}, stubs
    assert set(policies(stubs[LANE]).values()) == {os.SCHED_IDLE}
    assert os.SCHED_IDLE not in policies(stubs[MODEL]).values()
    answers = [v2_infer(triton, m, [PHOTO]) for m in (MODEL, LANE)]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    outputs = [
        {o["name"]: o["data"] for o in a.json()["outputs"] if o["name"] == "embedding"}
        for a in answers
    ]
    assert outputs[0] == outputs[1]
