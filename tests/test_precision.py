"""``handler.precision: auto``: the rule with injected timings (servecore/precision.py), and
the measuring, sharing and remembering around it with stand-in backends
(servecore/autoprecision.py). No server, no model: seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from model_files.artifacts import ModelFiles
from model_files.recipe import normalize
from servecore import autoprecision
from servecore.backends import Backend
from servecore.config import HandlerConfig
from servecore.precision import (
    FIDELITY_BOUND,
    MARGIN,
    Candidate,
    Choice,
    agreement,
    forced,
    select,
    summary_line,
)

GOOD = {"embedding_cosine_min": 0.999, "top1_agreement": 1.0}


def timed(precision: str, ms_at_1: float, ms_at_16: float, **kw) -> Candidate:
    return Candidate(precision, {1: ms_at_1, 16: ms_at_16}, **kw)


# ---------------------------------------------------------------- the rule, injected timings


def test_the_fastest_within_fidelity_wins():
    choice = select([timed("f32", 40, 500), timed("bf16", 25, 300, fidelity=GOOD)])
    assert choice.precision == "bf16" and choice.measured
    assert "fastest within fidelity" in choice.reason and "faster than f32" in choice.reason


def test_a_slow_bf16_loses_to_f32():
    """Today's host in issue #17: bf16 slower than f32 although the CPU reports bf16."""
    choice = select([timed("f32", 40, 505), timed("bf16", 60, 812, fidelity=GOOD)])
    assert choice.precision == "f32"


def test_a_tie_within_the_margin_goes_to_the_more_precise():
    faster_by_less_than_margin = 1 - MARGIN / 2
    choice = select(
        [
            timed("f32", 40, 500),
            timed(
                "bf16",
                40 * faster_by_less_than_margin,
                500 * faster_by_less_than_margin,
                fidelity=GOOD,
            ),
        ]
    )
    assert choice.precision == "f32"
    assert "more precise" in choice.reason


def test_a_tie_within_the_margin_keeps_the_previous_choice():
    candidates = [timed("f32", 40, 500), timed("bf16", 41, 520, fidelity=GOOD)]
    assert select(candidates, previous="bf16").precision == "bf16"
    assert "kept from the last start" in select(candidates, previous="bf16").reason
    assert select(candidates, previous="f32").precision == "f32"


def test_a_clear_difference_overrides_the_previous_choice():
    candidates = [timed("f32", 40, 500), timed("bf16", 25, 300, fidelity=GOOD)]
    choice = select(candidates, previous="f32")
    assert choice.precision == "bf16"
    assert "served f32" in choice.reason


def test_failing_fidelity_excludes_a_candidate_however_fast():
    candidates = [
        timed("f32", 40, 500),
        timed("int8+f32", 10, 100, excluded="embedding_cosine_min 0.9 < 0.99"),
    ]
    choice = select(candidates, previous="int8+f32")
    assert choice.precision == "f32"
    assert choice.as_dict()["candidates"][1]["excluded"].startswith("embedding_cosine_min")


def test_an_untimed_candidate_is_listed_not_chosen():
    choice = select([timed("f32", 40, 500), Candidate("bf16", excluded="no bf16 units")])
    assert choice.precision == "f32"
    assert "bf16 excluded (no bf16 units)" in choice.line()


def test_nothing_eligible_is_an_error():
    with pytest.raises(ValueError, match="no eligible"):
        select([Candidate("bf16", excluded="no bf16 units")])


def test_an_explicit_precision_says_when_a_measured_candidate_was_clearly_faster():
    last = [timed("f32", 40, 500), timed("bf16", 60, 812, fidelity=GOOD)]
    choice = forced("bf16", "bf16", last)
    assert choice.precision == "bf16" and not choice.measured
    assert "not measured" in choice.reason and "f32 1.55x faster than bf16" in choice.reason
    assert "faster" not in forced("f32", "f32", last).reason
    assert forced("bf16", "bf16", None).reason == "handler.precision is bf16: not measured"


def test_the_choice_survives_json_and_reads_as_one_line():
    choice = select([timed("f32", 40.04, 500), timed("bf16", 25, 300, fidelity=GOOD)])
    again = Choice.from_dict(json.loads(json.dumps(choice.as_dict())))
    assert again == Choice.from_dict(choice.as_dict())
    assert again.precision == "bf16" and again.candidates[0].ms == {1: 40.0, 16: 500}
    line = summary_line(choice.as_dict())
    assert line.startswith(
        "auto -> bf16 (measured by this worker; f32 40/500 ms at batch 1/16; bf16 25/300"
    )
    # The served candidate's distance from f32, as describe reports it.
    assert line.endswith(
        f"; vs f32: embedding cosine min "
        f"{GOOD['embedding_cosine_min']:.4f}, top-1 agreement "
        f"{GOOD['top1_agreement']:.2f}"
    )
    assert "vs f32" not in summary_line(select([timed("f32", 40, 500)]).as_dict())
    assert "\n" not in line


def test_agreement_figures():
    rng = np.random.default_rng(0)
    embedding, logits = rng.normal(size=(4, 8)), rng.normal(size=(4, 10))
    same = agreement((embedding, logits), (embedding, logits))
    assert same["embedding_cosine_min"] == pytest.approx(1.0)
    assert same["top1_agreement"] == 1.0 and same["top5_overlap"] == 1.0
    flipped = agreement((embedding, logits), (-embedding, -logits))
    assert flipped["embedding_cosine_min"] == pytest.approx(-1.0)
    assert flipped["top1_agreement"] == 0.0
    assert set(FIDELITY_BOUND) <= set(same)


def test_top5_overlap_of_a_model_with_fewer_than_5_classes_is_over_all_of_them():
    """A user's 4-class tagger: the same logits overlap fully (not 4/5, which the int8 gate's
    0.90 would refuse whatever the model); one of the 4 changed at the top overlaps 1."""
    logits = np.array([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    embedding = np.ones((2, 8))
    assert agreement((embedding, logits), (embedding, logits))["top5_overlap"] == 1.0
    swapped = logits[:, [1, 0, 2, 3]]
    figures = agreement((embedding, logits), (embedding, swapped))
    assert figures["top5_overlap"] == 1.0 and figures["top1_agreement"] == 0.5


# ---------------------------------------------------------------- measuring, with stand-ins


class Clock:
    """Simulated time for the stand-in backends: timings exact, whatever the machine's load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(autoprecision, "_clock", clock)
    return clock


def fake(precision: str, ms_per_image: float, noise: float = 0.0, calls: list | None = None):
    """A loader of a stand-in backend: takes ``ms_per_image`` per image on the simulated clock
    and answers a fixed function of its input plus ``noise`` (what rounding would do)."""
    weights = torch.Generator().manual_seed(1)
    project = torch.randn(3 * 7 * 7, 16, generator=weights)

    def load():
        if calls is not None:
            calls.append((os.getpid(), threading.get_ident(), precision))

        def run(batch):
            autoprecision._clock.now += ms_per_image * len(batch) / 1000
            # Like every backend, it takes the served uint8 crops and normalises them.
            pooled = torch.nn.functional.adaptive_avg_pool2d(normalize(batch), 7).flatten(1)
            embedding = pooled @ project
            return embedding + noise * torch.randn(embedding.shape), embedding[:, :10].clone()

        return Backend("stand-in", precision, "none", "cpu", run)

    return load


def offer(loaders: dict, excluded: dict | None = None) -> list[Candidate]:
    """What ``backends.precision_candidates`` offers: loadable candidates, then excluded ones."""
    return [Candidate(name, load=load) for name, load in loaders.items()] + [
        Candidate(name, excluded=why) for name, why in (excluded or {}).items()
    ]


def test_measure_times_every_candidate_and_judges_fidelity():
    loaders = {
        "f32": fake("f32", 20),
        "bf16": fake("bf16", 10),
        "int8+f32": fake("int8+f32", 5, noise=10.0),
    }
    candidates, backends = autoprecision.measure(
        offer(loaders, {"int8+bf16": "no bf16 units"}), (1, 4), budget_s=0.2
    )
    by_name = {c.precision: c for c in candidates}
    assert list(by_name) == ["f32", "bf16", "int8+f32", "int8+bf16"]
    assert by_name["f32"].fidelity is None and not by_name["f32"].excluded
    assert by_name["bf16"].fidelity["embedding_cosine_min"] == pytest.approx(1.0)
    assert not by_name["bf16"].excluded
    assert by_name["int8+f32"].excluded.startswith("against f32 on the probe: embedding_cosine")
    assert by_name["int8+bf16"].excluded == "no bf16 units" and not by_name["int8+bf16"].ms
    assert by_name["f32"].ms[4] > by_name["bf16"].ms[4] > 0
    assert set(backends) == {"f32", "bf16", "int8+f32"}
    assert select(candidates).precision == "bf16"


def four(int8_noise: float = 0.0) -> dict:
    """An archive with the float and the int8 IR on a host with bf16 units (issue #27)."""
    return {
        "f32": fake("f32", 40),
        "bf16": fake("bf16", 20),
        "int8+f32": fake("int8+f32", 10, noise=int8_noise),
        "int8+bf16": fake("int8+bf16", 9.5, noise=int8_noise),
    }


def test_auto_weighs_four_candidates_against_f32_and_picks_a_faithful_int8():
    candidates, _ = autoprecision.measure(offer(four()), (1, 4), budget_s=0.5)
    by_name = {c.precision: c for c in candidates}
    assert by_name["f32"].fidelity is None  # the reference: every other is judged against it
    assert all(
        by_name[n].fidelity["embedding_cosine_min"] > 0.999
        for n in ("bf16", "int8+f32", "int8+bf16")
    )
    choice = select(candidates)
    # int8+bf16 is within the margin of int8+f32, which is more precise: the tie goes to it.
    assert choice.precision == "int8+f32" and "more precise" in choice.reason


def test_an_int8_that_fails_fidelity_is_never_served():
    candidates, _ = autoprecision.measure(offer(four(int8_noise=10.0)), (1, 4), budget_s=0.5)
    by_name = {c.precision: c for c in candidates}
    for name in ("int8+f32", "int8+bf16"):
        assert by_name[name].excluded.startswith("against f32 on the probe: embedding_cosine")
    for previous in (None, "int8+f32", "int8+bf16"):
        assert select(candidates, previous=previous).precision == "bf16"


def test_the_probe_is_the_same_on_every_start():
    assert torch.equal(autoprecision.probe_batch(4), autoprecision.probe_batch(4))
    assert autoprecision.probe_batch(4).shape == (4, 3, 224, 224)


ARCHIVE = {
    "backend": "openvino",
    "serialized": "resnet50_dual.xml",
    "weights": "abc",
    "batch_sizes": [1, 4],
    "threads": 0,
    "device": "cpu",
    "candidates": ["f32", "bf16"],
}


def store(model_dir, cache):
    return autoprecision.ChoiceStore(model_dir, cache, ARCHIVE)


def choose(model_dir, cache, loaders, excluded=None):
    return autoprecision.choose(
        offer(loaders, excluded), (1, 4), store(model_dir, cache), budget_s=0.2
    )


def test_the_first_worker_measures_and_the_others_serve_its_choice(tmp_path):
    calls: list = []
    loaders = {"f32": fake("f32", 20, calls=calls), "bf16": fake("bf16", 10, calls=calls)}
    results = [None, None]

    def worker(i):
        results[i] = choose(tmp_path / "model", tmp_path / "cache.json", loaders)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (first, a), (second, b) = results
    assert a == b and a.precision == "bf16" and first.precision == second.precision == "bf16"
    # One worker loaded both candidates to time them, the other only the chosen one.
    assert sorted(name for _, _, name in calls) == ["bf16", "bf16", "f32"]
    shared = json.loads((tmp_path / autoprecision.CHOICE_FILE).read_text())  # beside the cache
    assert [entry["choice"]["choice"] for entry in shared.values()] == ["bf16"]


def test_a_choice_is_shared_while_a_worker_holds_it_and_stored_for_the_host_after(tmp_path):
    """Workers of one model share the choice of a live worker; once its holders are all gone
    (a worker killed and started again, the server's next start) the host's stored choice is
    served without timing again, saying so."""
    model_dir, cache = tmp_path / "model", tmp_path / "cache.json"
    choose(model_dir, cache, {"f32": fake("f32", 20), "bf16": fake("bf16", 10)})
    calls: list = []
    _, second = choose(
        model_dir,
        cache,
        {"f32": fake("f32", 5, calls=calls), "bf16": fake("bf16", 20, calls=calls)},
    )
    assert second.precision == "bf16" and [name for _, _, name in calls] == ["bf16"]
    shared = json.loads((cache.parent / autoprecision.CHOICE_FILE).read_text())
    (entry,) = shared.values()
    assert [h["pid"] for h in entry["holders"]] == [os.getpid()]  # one holder, not two
    ended(cache.parent / autoprecision.CHOICE_FILE)
    calls.clear()
    _, third = choose(
        model_dir,
        cache,
        {"f32": fake("f32", 5, calls=calls), "bf16": fake("bf16", 20, calls=calls)},
    )
    assert third.precision == "bf16" and [name for _, _, name in calls] == ["bf16"]
    assert third.source.startswith("stored on this host at ") and "worker pid" in third.source
    (entry,) = json.loads((cache.parent / autoprecision.CHOICE_FILE).read_text()).values()
    assert [h["pid"] for h in entry["holders"]] == [os.getpid()]  # held again, for the others


def test_another_archive_or_library_version_is_measured_again(tmp_path, monkeypatch):
    cache = tmp_path / "cache.json"
    loaders = {"f32": fake("f32", 20), "bf16": fake("bf16", 10)}
    choose(tmp_path / "run1", cache, loaders)
    ended(tmp_path / autoprecision.CHOICE_FILE)
    for changed in ({**ARCHIVE, "weights": "another"}, {**ARCHIVE, "libraries": {"torch": "9"}}):
        calls: list = []
        _, choice = autoprecision.choose(
            offer({"f32": fake("f32", 5, calls=calls), "bf16": fake("bf16", 20, calls=calls)}),
            (1, 4),
            autoprecision.ChoiceStore(tmp_path / "run2", cache, changed),
            budget_s=0.2,
        )
        assert choice.precision == "f32" and not choice.source.startswith("stored")
        assert sorted(name for _, _, name in calls) == ["bf16", "f32"]  # both timed
        ended(tmp_path / autoprecision.CHOICE_FILE)


def test_two_models_share_the_hosts_choice_only_for_the_same_archive(tmp_path):
    """The tagger and the embedding model run the same archive's forward: the second serves
    the host's stored choice; a model whose archive differs (here its batch sizes) measures."""
    calls: list = []
    loaders = {"f32": fake("f32", 20, calls=calls), "bf16": fake("bf16", 10, calls=calls)}
    for model, archive in (
        ("resnet50-tagger 1.0", ARCHIVE),
        ("resnet50-embedding 1.0", ARCHIVE),
        ("other 1.0", {**ARCHIVE, "batch_sizes": [1, 8]}),
    ):
        autoprecision.choose(
            offer(loaders),
            (1, 4),
            autoprecision.ChoiceStore(tmp_path / "model", tmp_path / "cache.json", archive, model),
            budget_s=0.2,
        )
    assert sorted(name for _, _, name in calls) == ["bf16", "bf16", "bf16", "f32", "f32"]


def ended(shared_file: Path) -> None:
    """The workers holding the choices of ``shared_file`` are gone (a server's previous
    start): each holder becomes a process that has exited."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    shared = json.loads(shared_file.read_text())
    for entry in shared.values():
        entry["holders"] = [{"pid": int(gone.stdout), "started": 0.0}]
    shared_file.write_text(json.dumps(shared))


def test_a_restart_serves_the_stored_choice_until_the_cache_is_gone(tmp_path):
    cache = tmp_path / "cache.json"
    _, first = choose(tmp_path / "run1", cache, {"f32": fake("f32", 20), "bf16": fake("bf16", 10)})
    assert first.precision == "bf16"
    # Next start: f32 would now be faster, but nothing is timed: the stored choice is served.
    ended(tmp_path / autoprecision.CHOICE_FILE)
    _, second = choose(tmp_path / "run2", cache, {"f32": fake("f32", 5), "bf16": fake("bf16", 20)})
    assert second.precision == "bf16" and second.source.startswith("stored on this host")
    # The host cache deleted (how docs/backends.md says to measure again): f32 is measured.
    ended(tmp_path / autoprecision.CHOICE_FILE)
    cache.unlink()
    _, third = choose(tmp_path / "run3", cache, {"f32": fake("f32", 5), "bf16": fake("bf16", 20)})
    assert third.precision == "f32" and third.source.startswith("worker pid")
    assert len(json.loads(cache.read_text())) == 1  # one host, one archive


def test_an_unwritable_cache_or_model_folder_costs_the_memory_not_the_start(tmp_path, caplog):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")
    backend, choice = choose(blocked / "model", blocked / "cache.json", {"f32": fake("f32", 1)})
    assert choice.precision == "f32" and backend.precision == "f32" and choice.measured
    assert "precision: cannot write" in caplog.text


def test_an_explicit_precision_cites_the_last_auto_measurement(tmp_path):
    cache = tmp_path / "cache.json"
    loaders = {"f32": fake("f32", 5), "bf16": fake("bf16", 20)}
    choose(tmp_path / "model", cache, loaders)
    calls: list = []
    backend, choice = autoprecision.explicit(
        "bf16", fake("bf16", 20, calls=calls), store(tmp_path / "model", cache)
    )
    assert backend.precision == "bf16" and len(calls) == 1
    assert not choice.measured and "f32" in choice.reason and "faster than bf16" in choice.reason


def test_the_cache_file_setting(tmp_path):
    assert autoprecision.cache_file("off") is None
    assert autoprecision.cache_file(str(tmp_path / "p.json")) == tmp_path / "p.json"
    assert autoprecision.cache_file("", {"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "resnet50-serve" / "precision.json"
    )


def test_nothing_to_choose_is_not_measured(weights_dir):
    """Eager PyTorch on CPU runs f32 only: loaded as before, no forward at start."""
    backend, choice = autoprecision.serving_backend(
        ModelFiles.read(weights_dir, "resnet50.pt"),
        HandlerConfig(precision_cache="off"),
        torch.device("cpu"),
        batch_sizes=(1, 8),
    )
    assert (choice.precision, backend.precision, choice.measured) == ("f32", "f32", False)
    assert choice.reason == "the only precision eager runs on cpu"


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the GPU's rule runs where a GPU is present",
)
def test_auto_on_a_gpu_weighs_f32_against_f16_and_bf16_where_the_gpu_has_it(
    weights_dir, monkeypatch
):
    monkeypatch.setattr(autoprecision, "_clock", time.perf_counter)  # real GPU timings
    backend, choice = autoprecision.serving_backend(
        ModelFiles.read(weights_dir, "resnet50.pt"),
        HandlerConfig(precision_cache="off"),
        torch.device("cuda:0"),
        batch_sizes=(1, 8),
    )
    by_name = {c.precision: c for c in choice.candidates}
    assert set(by_name) == {"f32", "f16", "bf16"} and choice.measured  # bf16: timed or excluded
    timed = ["f16", "bf16"] if torch.cuda.is_bf16_supported() else ["f16"]
    assert all(by_name[p].ms and by_name[p].fidelity is not None for p in timed)
    assert torch.cuda.is_bf16_supported() or by_name["bf16"].excluded
    assert backend.precision == choice.precision
