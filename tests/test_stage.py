"""What a bare, offline GPU host is sent (buildsteps/stage.py), checked on this CPU host: loads
that fit a call, parts that join back, a missing or damaged load named; venvs that see the
host's own packages and take wheels offline; the jlinked Java runtime staged into an empty folder
starting a real TorchServe that answers; and Triton's server laid out into an empty folder
starting and answering through its Python backend stub.

Not here (it needs an index): ``pip download`` of the wheels for the host's Python. ``make
bench-gpu-served-rehearsal`` runs all of it, the downloads too, end to end on this CPU."""

from __future__ import annotations

import ensurepip
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import requests

from buildsteps import stage
from buildsteps.stage import MIB, Piece, StageError
from tests.conftest import REPO

TAGGER = "resnet50-tagger"


def _file(path: Path, size: int, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes((i * 7 + seed) % 251 for i in range(size)))
    return path


PYTHON = "{}.{}".format(*sys.version_info[:2])


def _staged(tmp_path: Path, python: str = PYTHON) -> tuple[dict, Path, list[Piece]]:
    pieces = [
        Piece("java.tar.gz", _file(tmp_path / "src" / "java.tar.gz", 2 * MIB + 5, 1)),
        Piece("wheels/a-1.0-py3-none-any.whl", _file(tmp_path / "src" / "a.whl", 300_000, 2)),
        Piece("wheels/b-1.0-py3-none-any.whl", _file(tmp_path / "src" / "b.whl", 600_000, 3)),
    ]
    out = tmp_path / "stage"
    about = {"python": python, "commit": "abc1234"}
    return stage.write_loads(pieces, out, MIB, about), out, pieces


def test_a_piece_over_a_loads_size_travels_in_parts_and_joins_back(tmp_path):
    """Every load at most its budget (plus the manifest it carries), the 2 MiB piece in three
    parts over three loads, each part's and each piece's sha256 in the manifest; joined on the
    other side, every piece is its bytes again."""
    manifest, out, pieces = _staged(tmp_path)
    assert manifest["loads"] == ["load-1", "load-2", "load-3"]
    for load in manifest["loads"]:
        parts = [f for f in (out / load).rglob("*") if f.is_file() and f.name != "manifest.json"]
        assert sum(f.stat().st_size for f in parts) <= MIB
        assert json.loads((out / load / "manifest.json").read_text()) == manifest
    java = manifest["pieces"]["java.tar.gz"]
    assert [p["file"].rsplit(".", 1)[1] for p in java["parts"]] == ["part01", "part02", "part03"]
    assert stage.loads_state(manifest, out) == dict.fromkeys(manifest["loads"], "here")
    stage.join(manifest, out, tmp_path / "host")
    for piece in pieces:
        assert (tmp_path / "host" / piece.name).read_bytes() == piece.path.read_bytes()


def test_check_names_a_load_not_sent_and_a_damaged_part(tmp_path, capsys):
    manifest, out, _ = _staged(tmp_path)
    part = out / manifest["pieces"]["java.tar.gz"]["parts"][0]["file"]
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    missing = next(load for load in manifest["loads"] if load != part.parent.name)
    for path in sorted((out / missing).rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (out / missing).rmdir()
    assert stage.main(["check", "--out", str(out)]) == 1
    said = capsys.readouterr().out
    assert f"{missing}: absent" in said
    assert f"{part.parent.name}: damaged: {part.relative_to(out)} is not the staged bytes" in said
    assert stage.main(["install", "--out", str(out)]) == 1
    refused = capsys.readouterr().err
    assert "stage install: not every load is here: " in refused and f"{missing} absent" in refused


def test_loads_of_two_stagings_or_another_python_are_refused(tmp_path):
    manifest, out, _ = _staged(tmp_path, "3.99")
    with pytest.raises(StageError, match=rf"staged for Python 3.99, but .* is {PYTHON}: run this"):
        stage.install(out, tmp_path / "host", venv=tmp_path / "v", triton_venv=tmp_path / "t")
    (out / "load-2" / "manifest.json").write_text(json.dumps({**manifest, "commit": "other"}))
    with pytest.raises(StageError, match="come from different stagings"):
        stage.read_manifest(out)
    with pytest.raises(StageError, match="no load in"):
        stage.read_manifest(tmp_path / "empty")


def test_a_load_leaves_room_for_the_checkout_in_a_call():
    assert stage.load_bytes(3 * MIB) == 60 * MIB  # the piece limit binds
    assert stage.load_bytes(10 * MIB) == 53 * MIB  # 64 MiB less the checkout and a margin
    with pytest.raises(StageError, match="too little of a call is left"):
        stage.load_bytes(60 * MIB)


def test_the_wheels_are_pinned_as_the_suite_ran_them_and_torchs_own_left_to_the_host():
    exact = stage.pins()
    assert stage.pinned(("torchserve", "orjson", "nvidia-ml-py==13.615.71"), exact) == [
        "torchserve==0.12.0",
        f"orjson=={exact['orjson'].split('==')[1]}",
        "nvidia-ml-py==13.615.71",  # not in requirements.txt: as written
    ]
    from importlib import metadata

    assert stage.pinned(("psutil",), exact) == [f"psutil=={metadata.version('psutil')}"]
    assert stage.pinned(("nvidia-pytriton", "numpy"), exact) == [
        "nvidia-pytriton==0.7.0",
        "numpy==1.26.4",  # requirements-triton.txt's: the stub's numpy 1
    ]
    host = stage.host_provided("3.12")
    assert {"torch", "torchvision", "numpy", "pillow"} <= host
    assert not host & {"torchserve", "psutil", "orjson", "pyyaml", "nvidia-pytriton"}


def test_a_pytriton_wheel_without_the_hosts_backend_stub_is_refused(tmp_path):
    wheel = tmp_path / "nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(stage.STUB.format(python="3.11"), b"stub")
        z.writestr("nvidia_pytriton.libs/libcudart-09529672.so.12.6.77", b"so")
    with pytest.raises(StageError, match=r"no backend stub for Python 3.12 \(it has \['3.11'\]\)"):
        stage.triton_facts(wheel, "3.12")
    facts = stage.triton_facts(wheel, "3.11")
    assert facts["cuda_runtime"] == ["libcudart-09529672.so.12.6.77"]


def _tiny_wheel(folder: Path) -> Path:
    (folder / "wheels").mkdir()
    wheel = folder / "wheels" / "tinystaged-1.0-py3-none-any.whl"
    info = "tinystaged-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("tinystaged/__init__.py", "ANSWER = 42\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinystaged\nVersion: 1.0\n")
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    return wheel


def test_a_staged_venv_sees_the_hosts_packages_and_installs_offline(tmp_path):
    """make_venv: the host's package folders through its .pth (a module there imports), pip
    run from its own wheel with no index installs a wheel from a folder; a venv the install
    did not make is refused, one it made is replaced."""
    host_site = tmp_path / "host-site"
    (host_site / "hostonly").mkdir(parents=True)
    (host_site / "hostonly" / "__init__.py").write_text("WHERE = 'host'\n")
    python = stage.make_venv(tmp_path / "venv", [str(host_site)])
    pip = next((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    stage.pip_install(python, pip, [_tiny_wheel(tmp_path).parent], ["tinystaged==1.0"])
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import hostonly, tinystaged; print(hostonly.WHERE, tinystaged.ANSWER)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == ["host", "42"]
    with pytest.raises(StageError, match="No matching distribution found for requests"):
        stage.pip_install(python, pip, [tmp_path], ["requests"])  # not staged: no index asked
    assert stage.make_venv(tmp_path / "venv", [str(host_site)]).is_file()  # its own: replaced
    (tmp_path / "foreign").mkdir()
    with pytest.raises(StageError, match="exists and `stage install` did not make it"):
        stage.make_venv(tmp_path / "foreign", [])


def test_host_sites_are_this_pythons_package_folders_without_the_standard_library():
    sites = stage.host_sites()
    assert any(Path(s, "torch").is_dir() for s in sites)
    assert str(REPO) not in sites and all(not s.endswith("lib-dynload") for s in sites)


@pytest.fixture(scope="module")
def staged_java(tmp_path_factory) -> Path:
    """The Java runtime staged for the host (jlinked once a checkout: build/stage-cache), sent
    through the loads in parts, joined and unpacked into an empty folder: its JAVA_HOME."""
    try:
        tarball, about = stage.java_runtime()
    except StageError as exc:
        pytest.skip(str(exc))
    work = tmp_path_factory.mktemp("staged-java")
    manifest = stage.write_loads([Piece("java.tar.gz", tarball)], work / "stage", 10 * MIB, about)
    assert len(manifest["pieces"]["java.tar.gz"]["parts"]) >= 2  # it travels in parts
    stage.join(manifest, work / "stage", work / "host")
    stage.unpack_java(work / "host")
    return work / "host" / "java"


def test_the_staged_java_runtime_holds_only_the_modules_jdeps_found(staged_java):
    """jdeps' modules and what they require (jlink adds those), none of a JDK's tools."""
    listed = subprocess.run(
        [str(staged_java / "bin" / "java"), "--list-modules"], capture_output=True, text=True
    ).stdout.split()
    names = {m.split("@")[0] for m in listed}
    assert set(stage.java_modules(stage.frontend_jar())) <= names
    assert not names & {"jdk.compiler", "jdk.jlink", "jdk.jdeps", "jdk.jshell"}
    assert len(names) < 25  # a full JDK has about 70


def test_torchserve_starts_from_the_staged_java_and_answers(staged_java, tmp_path, model_store):
    """JAVA_HOME at the staged runtime: TorchServe's frontend is that java (not the system's),
    loads the tagger and answers a photo."""
    from devtools.server import LocalTorchServe

    with LocalTorchServe(
        tmp_path / "ts",
        model_store,
        load_models=[f"{TAGGER}.mar"],
        env={"JAVA_HOME": str(staged_java)},
    ) as ts:
        assert Path(ts.processes()[0].exe()).is_relative_to(staged_java)
        answer = requests.post(
            f"{ts.inference_url}/predictions/{TAGGER}",
            data=(REPO / "build" / "samples" / "chelsea.jpg").read_bytes(),
            headers=ts.keys.inference_headers(),
            timeout=120,
        )
    assert answer.status_code == 200, answer.text
    assert len(answer.json()) == 5 and {"label", "index", "probability"} <= set(answer.json()[0])


ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
ECHO_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)]
            )
            for r in requests
        ]
"""


def test_a_triton_server_laid_out_into_an_empty_folder_starts_and_answers(tmp_path):
    """tritonrepo.install.lay_out (what the host's install runs) from the wheel into an empty
    folder, one backend stub, started there on a Python-backend model: the binary, its
    libraries and the stub (this Python's, through libpython) all work from that folder."""
    from devtools.server import free_ports
    from tritonrepo.install import NotInstalled, TritonInstall, lay_out
    from tritonrepo.server import running

    try:
        TritonInstall().check()
    except NotInstalled as exc:
        pytest.skip(f"no Triton wheel: {exc}")
    version = "{}.{}".format(*sys.version_info[:2])
    lay_out(TritonInstall().wheel, tmp_path / "server", version)
    stubs = list((tmp_path / "server").rglob("triton_python_backend_stub"))
    assert [s.relative_to(tmp_path) for s in stubs] == [
        Path("server/backends/python/triton_python_backend_stub")
    ]
    (tmp_path / "repo" / "echo" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (tmp_path / "repo" / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    install = TritonInstall(server=tmp_path / "server")
    with running(
        tmp_path / "repo", tmp_path / "triton.log", install=install, watch=False, exit_timeout=2,
        **free_ports(("http", "grpc", "metrics")),
    ) as triton:  # fmt: skip
        body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.5, 2]}]}
        answer = requests.post(f"{triton.url}/v2/models/echo/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [3.0, 4.0]


def test_a_host_python_without_a_shared_libpython_is_lent_the_staged_one(
    tmp_path, monkeypatch, capsys
):
    """Triton's backend stub links libpythonX.Y.so.1.0: where the host's Python is a static
    build (a distribution's python3 without its libpython package), install puts the staged
    one (stripped, gzipped) among the wheel's libraries; with its own, nothing; with neither,
    it says Triton's stub cannot start."""
    import sysconfig

    library = Path(sysconfig.get_config_var("LIBDIR")) / stage.libpython_name(PYTHON)
    if not library.is_file():
        pytest.skip(f"this Python has no {library.name} to stage")
    with pytest.raises(StageError, match="not a file named libpython"):
        stage.found_libpython(PYTHON, tmp_path / "libpython.so")
    assert stage.found_libpython(PYTHON, library) == library
    packed = stage.packed_libpython(library, tmp_path)
    libs = tmp_path / "venv" / "lib" / f"python{PYTHON}" / "site-packages" / "nvidia_pytriton.libs"
    libs.mkdir(parents=True)
    monkeypatch.setattr(stage, "has_libpython", lambda python: False)
    stage.lend_libpython(tmp_path / "venv", packed, PYTHON)
    lent = libs / library.name
    assert lent.stat().st_mode & 0o111 and lent.read_bytes()[:4] == b"\x7fELF"
    stage.lend_libpython(tmp_path / "venv", tmp_path / "missing.gz", PYTHON)
    assert "Triton's backend stub cannot start (stage with --libpython)" in capsys.readouterr().err
    monkeypatch.setattr(stage, "has_libpython", lambda python: True)
    lent.unlink()
    stage.lend_libpython(tmp_path / "venv", packed, PYTHON)
    assert not lent.exists()


def test_the_decoder_wheels_are_requirements_gpu_txts_or_none(tmp_path):
    listed = tmp_path / "requirements-gpu.txt"
    listed.write_text(
        "# the GPU's JPEG engines\nnvidia-nvimgcodec-cu13==0.9.0.20\n\n"
        "nvidia-nvjpeg==13.0.1.86  # its nvJPEG\n"
    )
    assert stage.decoder_requirements(listed) == (
        ["nvidia-nvimgcodec-cu13==0.9.0.20", "nvidia-nvjpeg==13.0.1.86"],
        "requirements-gpu.txt",
    )
    assert stage.decoder_requirements(tmp_path / "absent.txt") == ([], "none (no absent.txt)")
