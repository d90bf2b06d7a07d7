"""The OpenVINO backend at each precision against torchvision's float32 model run directly
(tests/reference.py), on real photos (scikit-image's bundled ones), through the handler.

Weights here are whatever ``make weights`` built, seeded (untrained) on a machine without
network: agreement with float32 is what is tested, not ImageNet accuracy.
"""

from __future__ import annotations

import io
import json
import shutil

import pytest
import torch

from buildsteps.export import export
from devtools.samples import photo
from model_files.artifacts import (
    QUANTIZED,
    SERIALIZED,
    archive_quantize,
    fidelity_record,
    serialized,
)
from tests.handler_context import make_handler, run_batch
from tests.reference import rel_error, tolerance

ov = pytest.importorskip("openvino")

PHOTOS = ("chelsea", "coffee", "astronaut", "rocket")
# int8 (NNCF, MINMAX ranges): measured 1.8% mean, 3% worst on held-apart photos; the cosine
# bound is the build's own gate (config/int8_gate.yaml).
INT8_COSINE = 0.99


def _jpeg(name: str) -> bytes:
    out = io.BytesIO()
    photo(name).convert("RGB").save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    return [_jpeg(name) for name in PHOTOS]


@pytest.fixture(scope="module")
def expected(reference, photos):
    return [reference(data) for data in photos]


@pytest.fixture(scope="module")
def ir(weights_dir):
    return export("openvino", weights_dir)


def _cpu_has_bf16() -> bool:
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def _serve(weights_dir, serialized: str, photos, **config):
    # draft_decode off: the reference decodes at full size, and only arithmetic is tested here.
    handler, context = make_handler(
        weights_dir,
        serialized=serialized,
        task="tags",
        normalize_embedding=False,
        draft_decode=False,
        **config,
    )
    _responses, statuses, batch = run_batch(handler, context, [{"body": p} for p in photos])
    assert statuses == [(200, None)] * len(photos)
    return json.loads(handler.describe_handle()), batch


def _runtime_runs(ir, precision: str) -> str:
    """What OpenVINO itself says it runs for this IR compiled with this precision hint, asked
    directly (not through the handler): the rule the handler's report must follow on every
    host. AVX2 only: a bf16 hint is ignored (f32); AVX-512 without bf16 units: bf16, emulated;
    AVX-512 with bf16: bf16."""
    import openvino.properties.hint as hints

    wanted = ov.Type.f32 if precision == "f32" else ov.Type.bf16
    compiled = ov.Core().compile_model(str(ir), "CPU", {hints.inference_precision: wanted})
    return compiled.get_property(hints.inference_precision).get_type_name()


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_precision_matches_torchvision(weights_dir, ir, photos, expected, precision):
    """The served precision is what OpenVINO says it runs (whatever the CPU); the embedding is
    within tests/reference.py's tolerance for that precision, the same top-1 class."""
    described, batch = _serve(weights_dir, ir.name, photos, precision=precision)
    assert described["backend"] == "openvino"
    served = _runtime_runs(ir, precision)
    assert described["precision"] == served
    reason = described["precision_choice"]["reason"]
    # bf16 without native units is served and said so, never reported as f32 (or hidden).
    assert ("emulated" in reason) == (served == "bf16" and not _cpu_has_bf16()), reason
    for i, (embedding, logits) in enumerate(expected):
        assert rel_error(batch.embedding[i], embedding) <= tolerance(served), PHOTOS[i]
        assert int(batch.logits[i].argmax()) == int(logits.argmax()), PHOTOS[i]


def test_bf16_the_cpu_only_emulates_is_served_and_said(weights_dir, ir, photos, monkeypatch):
    """On a CPU whose OpenVINO lists no BF16 capability but honours the hint (AVX-512 without
    bf16 units, e.g. an Intel Xeon with VNNI only), a pinned bf16 is served as bf16 and the
    choice says it is emulated. Here the capability list is made to say so; where OpenVINO
    ignores the hint (AVX2 only) it serves f32 and says nothing of emulation."""
    import servecore.backends

    monkeypatch.setattr(servecore.backends, "_cpu_has_bf16", lambda: False)
    described, _ = _serve(weights_dir, ir.name, photos[:1], precision="bf16")
    reason = described["precision_choice"]["reason"]
    if _runtime_runs(ir, "bf16") == "bf16":
        assert described["precision"] == "bf16"
        assert "openvino runs bf16 emulated on this CPU" in reason
    else:
        assert described["precision"] == "f32" and "emulated" not in reason


def test_auto_measures_what_the_cpu_can_run(weights_dir, ir, photos):
    """bf16 is timed where OpenVINO reports bf16 units, listed as excluded elsewhere."""
    described, _ = _serve(weights_dir, ir.name, photos[:1])
    choice = described["precision_choice"]
    assert described["handler"]["precision"] == "auto" and choice["measured"]
    assert choice["choice"] == described["precision"]
    by_name = {c["precision"]: c for c in choice["candidates"]}
    assert set(by_name["f32"]["ms_per_batch"]) == {"1", "8"}
    if _cpu_has_bf16():
        assert by_name["bf16"]["ms_per_batch"] and by_name["bf16"]["fidelity"]
    else:
        assert by_name["bf16"]["excluded"] == "this CPU has no bf16 units (OpenVINO)"
    # (an int8 IR is a candidate too when `make bench` or QUANTIZE=int8 built one here)
    eligible = {name for name, c in by_name.items() if c["ms_per_batch"] and not c["excluded"]}
    assert choice["choice"] in eligible


def test_an_explicit_precision_is_not_measured(weights_dir, ir, photos):
    described, _ = _serve(weights_dir, ir.name, photos[:1], precision="f32")
    choice = described["precision_choice"]
    assert (choice["requested"], choice["choice"], choice["measured"]) == ("f32", "f32", False)


def test_int8_needs_an_archive_carrying_the_int8_ir(weights_dir, ir, tmp_path):
    for name in (
        "resnet50.pt",
        "weights_info.json",
        "index_to_name.json",
        ir.name,
        ir.with_suffix(".bin").name,
    ):
        shutil.copy(weights_dir / name, tmp_path)
    with pytest.raises(ValueError, match=r"carries no int8 model .* QUANTIZE=int8"):
        make_handler(tmp_path, serialized=ir.name, precision="int8")


def test_an_archives_files_tell_its_build_quantize():
    """What the sweep rebuilds an archive with: an int8 tagger must stay int8."""
    assert archive_quantize(["resnet50_dual.xml", QUANTIZED[("openvino", "int8")]]) == "int8"
    for backend in SERIALIZED:
        assert archive_quantize([serialized(backend), "weights_info.json"]) == "none"


@pytest.fixture(scope="module")
def int8_dir(weights_dir, ir, tmp_path_factory):
    """A weights folder with the float32 IR, for quantisation tests to write into."""
    out = tmp_path_factory.mktemp("int8")
    for name in ("resnet50.pt", "weights_info.json", "index_to_name.json"):
        shutil.copy(weights_dir / name, out)
    for path in weights_dir.glob("resnet50_dual.*"):
        shutil.copy(path, out)
    return out


@pytest.fixture(scope="module")
def calibration():
    return [photo("chelsea"), photo("coffee")]


@pytest.fixture(scope="module")
def heldout():
    return [photo("astronaut").convert("RGB"), photo("rocket").convert("RGB")]


# Small calibration (16 tensors) keeps each quantisation to ~10-20 s on 2 cores.
SMALL = 16


@pytest.fixture(scope="module")
def calibrated(int8_dir, calibration):
    """NNCF's int8 model of ``int8_dir``'s IR, made once: the gate's tests below judge it
    (``quantize`` is ``calibrate`` then ``accept``; the build's path through ``main`` is
    tested whole further down)."""
    from buildsteps.quantize import calibrate

    return calibrate(int8_dir, calibration, size=SMALL)


def test_gate_refuses_and_writes_nothing(int8_dir, calibrated, calibration, heldout):
    from buildsteps.quantize import TARGET, FidelityError, accept

    with pytest.raises(FidelityError, match=r"embedding_cosine_min .* < 1\.01"):
        accept(int8_dir, calibrated, calibration, heldout, {"embedding_cosine_min": 1.01})
    assert not (int8_dir / TARGET).exists()
    assert not (int8_dir / fidelity_record(TARGET)).exists()
    assert not list(int8_dir.glob("int8.*")), "the staging folder was left behind"


def test_int8_passes_the_gate_and_matches_torchvision(
    int8_dir, calibrated, calibration, heldout, photos, expected
):
    import yaml

    from buildsteps.quantize import GATE, TARGET, accept

    thresholds = yaml.safe_load(GATE.read_text())["thresholds"]
    path = accept(int8_dir, calibrated, calibration, heldout, thresholds)
    assert path == int8_dir / TARGET and path.with_suffix(".bin").is_file()
    described, batch = _serve(int8_dir, TARGET, photos, precision="int8")
    assert described["precision"] == f"int8+{'bf16' if _cpu_has_bf16() else 'f32'}"
    figures = described["quantization"]["fidelity_vs_f32"]
    assert described["quantization"]["thresholds"] == thresholds
    assert all(figures[name] >= low for name, low in thresholds.items())
    for i, (embedding, logits) in enumerate(expected):
        cosine = torch.nn.functional.cosine_similarity(batch.embedding[i], embedding, dim=0)
        assert float(cosine) >= INT8_COSINE, PHOTOS[i]
        assert int(batch.logits[i].argmax()) == int(logits.argmax()), PHOTOS[i]


def test_auto_weighs_a_gated_int8_ir_beside_the_float32_one(int8_dir, photos):
    """After the gate passed (the test above), auto times int8 against f32 on the probe."""
    from buildsteps.quantize import TARGET

    if not (int8_dir / TARGET).is_file():
        pytest.skip("the int8 IR was not written (test_int8_passes_the_gate... failed)")
    described, _ = _serve(int8_dir, SERIALIZED["openvino"], photos[:1])
    by_name = {c["precision"]: c for c in described["precision_choice"]["candidates"]}
    assert by_name["int8+f32"]["ms_per_batch"] and not by_name["int8+f32"]["excluded"]
    assert by_name["int8+f32"]["fidelity"]["embedding_cosine_min"] >= INT8_COSINE
    refused, _ = _serve(
        int8_dir, SERIALIZED["openvino"], photos[:1], auto_int8=False, precision_cache="off"
    )
    excluded = {c["precision"]: c["excluded"] for c in refused["precision_choice"]["candidates"]}
    assert excluded["int8+f32"] == "handler.auto_int8 is false"


def test_a_refusal_is_remembered_and_the_archive_says_why(weights_dir, ir, tmp_path):
    """The build's path (``make weights``): a refused int8 leaves a record instead of a model,
    ``--allow-refusal`` keeps the build going, archive.sh packs no int8 and says why, and the
    next build does not quantise again for the same weights, thresholds and photos."""
    from buildsteps.quantize import TARGET, main
    from model_files.artifacts import int8_to_pack, refusal_record

    folder = tmp_path / "weights"
    folder.mkdir()
    for name in (
        "resnet50.pt",
        "weights_info.json",
        "index_to_name.json",
        ir.name,
        ir.with_suffix(".bin").name,
    ):
        shutil.copy(weights_dir / name, folder)
    (folder / TARGET).write_text("a stale int8 IR from earlier weights")
    gate = tmp_path / "gate.yaml"
    gate.write_text("thresholds:\n  embedding_cosine_min: 1.01\n")
    calibration, heldout = tmp_path / "calibration", tmp_path / "heldout"
    for where, names in ((calibration, ("chelsea", "coffee")), (heldout, ("rocket",))):
        where.mkdir()
        for name in names:
            photo(name).convert("RGB").save(where / f"{name}.png")
    argv = [
        "--weights",
        str(folder),
        "--gate",
        str(gate),
        "--size",
        str(SMALL),
        "--calibration",
        str(calibration),
        "--heldout",
        str(heldout),
    ]
    assert main([*argv, "--allow-refusal"]) == 0
    refused = folder / refusal_record(TARGET)
    assert not (folder / TARGET).exists(), "the stale IR must not survive a refusal"
    assert "embedding_cosine_min" in json.loads(refused.read_text())["refused"]
    files, why = int8_to_pack(folder, "openvino", "int8")
    assert files == [] and why.startswith("no int8: int8 model refused by the fidelity gate")
    written = refused.stat().st_mtime_ns
    assert main(argv) == 1  # up to date: the same verdict, without quantising again
    assert refused.stat().st_mtime_ns == written
