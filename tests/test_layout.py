"""The shape the code keeps (issue #26): the request path is one package that imports no
serving engine, engines are thin adapters around it, and a request's values are made once."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from servecore.errors import InvalidImage
from servecore.stages import Failed

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "servecore"
ENGINES = ("ts", "triton_python_backend_utils", "tritonserver", "pytriton", "kserve")
MAX_PARAMETERS = 6
MAX_FUNCTION_LINES = 80  # bench/ and serveclient/ (the style guide; issue #69)
ADAPTER_LINES = 150


def modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def imported(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports (at any depth in the file)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def repo_modules() -> dict[str, Path]:
    """Every module of the repository by dotted name (virtualenvs and build output aside)."""
    found = {}
    for path in modules(REPO):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[0] not in ("build",) and not any(part.startswith(".") for part in parts):
            found[".".join(parts).removesuffix(".__init__")] = path
    return found


def module_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The repository's modules that module ``name`` imports, anywhere in the file (under
    ``TYPE_CHECKING`` too): ``from pkg import sub`` names the submodule; a module's own
    packages, which Python loads before it anyway, are left out."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(
                [*package[: len(package) - node.level + 1], *([node.module] if node.module else [])]
                if node.level
                else [node.module or ""]
            )
            names |= {
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            }
    return {n for n in names & known if n != name and not name.startswith(f"{n}.")}


def test_no_two_modules_import_each_other():
    """No import cycle of any length among the repository's modules, even for types only."""
    found = repo_modules()
    graph = {name: module_imports(name, path, set(found)) for name, path in found.items()}
    cycles = []
    for start in graph:
        path, seen = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                seen.discard(path.pop())
            elif step == start:
                cycles.append(" -> ".join([*path, start]))
            elif step not in seen and step > start:  # each cycle once, from its least module
                path.append(step)
                seen.add(step)
                stack.append(iter(sorted(graph[step])))
    assert cycles == []


def test_the_core_imports_no_engine():
    offenders = {
        str(p.relative_to(REPO)): sorted(imported(p) & set(ENGINES)) for p in modules(CORE)
    }
    assert {p: names for p, names in offenders.items() if names} == {}


def test_importing_the_whole_core_loads_no_engine():
    """What the source says, checked by the interpreter: every core module imported, and no
    engine module among everything that got loaded along the way."""
    names = [
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in modules(CORE)
    ]
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ENGINES!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


# Each engine's adapter: the module the engine loads and the modules of its own package that
# one imports, but its metrics sink (an implementation of the core's MetricsSink, bounded
# below on its own); with the packages every module importing that engine must live in.
ADAPTERS = {
    "ts": (REPO / "handlers" / "resnet_handler.py", REPO / "handlers" / "ts_metrics.py"),
    "triton_python_backend_utils": (
        REPO / "tritonrepo" / "model.py",
        REPO / "tritonrepo" / "metrics.py",
    ),
}
SINK_LINES = 100


def adapter_modules(entry: Path, sink: Path) -> set[Path]:
    found = repo_modules()
    package = entry.parent.name
    reached, todo = set(), [entry]
    while todo:
        path = todo.pop()
        reached.add(path)
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for imported_name in module_imports(name, path, set(found)):
            step = found[imported_name]
            if imported_name.startswith(f"{package}.") and step not in reached | {sink}:
                todo.append(step)
    return reached


@pytest.mark.parametrize("engine", sorted(ADAPTERS))
def test_each_engine_adapter_is_small(engine):
    """TorchServe's handler and Triton's model.py, with what they import of their own package,
    under ``ADAPTER_LINES`` each; every product module that imports the engine is one of them
    or the engine's metrics sink, so nothing of an adapter escapes the count (a benchmark's
    null model, bench/null, measures the engine itself)."""
    entry, sink = ADAPTERS[engine]
    adapter = adapter_modules(entry, sink)
    lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in adapter}
    assert sum(lines.values()) < ADAPTER_LINES, lines
    assert len(sink.read_text().splitlines()) < SINK_LINES
    facing = {
        path
        for name, path in repo_modules().items()
        if name.split(".")[0] not in ("tests", "bench") and engine in imported(path)
    }
    assert facing <= adapter | {sink}, facing


def test_both_adapters_call_the_core_the_same_way():
    """One call per batch, ``ImageModel.run(incoming, encode)``, and none of its steps."""
    steps = {"prepare", "infer", "answer", "run"}
    for entry, sink in ADAPTERS.values():
        called = [
            node.func.attr
            for path in adapter_modules(entry, sink)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in steps
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "model"
        ]
        assert called == ["run"], (entry, called)


def test_no_core_function_takes_more_than_six_parameters():
    wide = []
    for path in modules(CORE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [
                    p.arg
                    for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)
                    if p.arg not in ("self", "cls")
                ]
                params += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
                if len(params) > MAX_PARAMETERS:
                    wide.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}{params}")
    assert wide == []


@pytest.mark.parametrize("package", ["bench", "serveclient"])
def test_no_function_is_longer_than_eighty_lines(package):
    """Every function of the package, nested ones and methods too, its decorators to its last
    line: a longer one is split into named steps."""
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)"
        for path in modules(REPO / package)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for n in [
            node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
        ]
        if n > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_a_request_error_is_never_assigned_after_the_fact():
    """No ``x.error = ...`` anywhere in the request path, and a failed request's record
    cannot be changed: the step that failed it made its ``Failed``."""
    assignments = []
    for path in [*modules(CORE), *modules(REPO / "handlers")]:
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                else []
            )
            assignments += [
                f"{path.relative_to(REPO)}:{node.lineno}"
                for t in targets
                if isinstance(t, ast.Attribute) and t.attr == "error"
            ]
    assert assignments == []
    failed = Failed("r1", InvalidImage("not an image"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        failed.error = InvalidImage("something else")


def test_no_server_module_imports_the_client():
    """Server code (the core, both adapters, the launchers and build steps) reads the ports and
    keys it shares with the client from ``serveshared``, never from the client package: the
    Triton runtime image carries no client, and the client can change without the servers."""
    server_side = (
        "servecore",
        "handlers",
        "tritonrepo",
        "buildsteps",
        "model_files",
        "serveshared",
    )
    offenders = [
        str(p.relative_to(REPO))
        for folder in server_side
        for p in modules(REPO / folder)
        if "serveclient" in imported(p)
    ]
    assert offenders == []


def test_the_client_shares_by_public_names_in_short_functions():
    """What two of the client's modules share lives in a library module under a public name
    (cli/head.py took cli/batch.py's ``_collection`` before #69), and no function of the client
    is over 80 lines (the style's bound)."""
    private, long = [], []
    for name, path in repo_modules().items():
        for node in ast.walk(ast.parse(path.read_text())) if name.startswith("serveclient") else []:
            if isinstance(node, ast.ImportFrom) and node.module:
                private += [
                    f"{name}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.endswith("__")  # dunders aside
                ]
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno >= 80:
                long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert (private, long) == ([], [])


def packages() -> list[Path]:
    """Every package of the repository (a folder with an ``__init__.py``; tests aside)."""
    return sorted(
        path.parent
        for name, path in repo_modules().items()
        if path.name == "__init__.py" and not name.startswith("tests")
    )


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(REPO)))
def test_each_package_map_names_its_modules(package):
    """A newcomer reads a package's ``__init__.py`` first: its map names every module and
    subpackage in it (as ``name.py``, ````name````, ``name/`` or ``python -m pkg.name``;
    ``__main__.py`` aside)."""
    text = (package / "__init__.py").read_text()
    dotted = ".".join(package.relative_to(REPO).parts)
    members = [
        p.stem if p.suffix == ".py" else p.name
        for p in sorted(package.iterdir())
        if (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"))
        or (p.is_dir() and (p / "__init__.py").is_file())
    ]
    forms = ("{m}.py", "``{m}``", "{m}/", "{dotted}.{m}")
    unnamed = [m for m in members if not any(f.format(m=m, dotted=dotted) in text for f in forms)]
    assert unnamed == [], f"{package.relative_to(REPO)}/__init__.py does not name {unnamed}"


# The edges of the core: what a request and a reply are on the wire (#50, #69).
EDGES = CORE / "edges"
WIRE_WORDS = {"Retry-After", "UNAVAILABLE", "INVALID_ARG", "INTERNAL", "TritonError"}


# Who may import the edges: the engines' adapters (TorchServe's handlers/, Triton's tritonrepo/,
# KServe's transformer/, an HTTP edge of its own), what drives the core as they do, and the
# docs' reference tables, which quote the status table and Triton's codes.
EDGE_IMPORTERS = ("handlers", "tritonrepo", "transformer", "bench", "tests", "buildsteps.reference")


def test_only_the_adapters_import_the_edges():
    """The core reaches its edges only through its own values (``Incoming``, ``Payload``,
    ``Reply``): no module outside ``servecore/edges/`` imports it but the adapters'."""
    found = repo_modules()
    offenders = sorted(
        name
        for name, path in found.items()
        if not name.startswith(("servecore.edges", *EDGE_IMPORTERS))
        and any(n.startswith("servecore.edges") for n in module_imports(name, path, set(found)))
    )
    assert offenders == []


def test_error_statuses_and_triton_codes_live_at_the_edges():
    """The core keeps error kinds and retry delays as values: no module outside its edges
    imports ``http`` (``HTTPStatus``) or names ``Retry-After`` or a Triton error code."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        if path.is_relative_to(EDGES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "http":
                found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Import) and any(a.name == "http" for a in node.names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} imports http")
            elif isinstance(node, ast.Constant) and node.value in WIRE_WORDS:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} names {node.value!r}")
            elif isinstance(node, (ast.Name, ast.Attribute)) and "TritonError" in ast.unparse(node):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} names TritonError")
    assert not found, found


def test_the_explanation_stage_is_entered_once_per_batch_in_run():
    """Only the model loads the explanation stage, and only ``ImageModel.run`` calls it: the
    intake checks an explanation request by the rules it was given (a value), and ``infer``
    and ``answer`` compute and write what they are handed."""
    found = repo_modules()
    loaders = sorted(
        name
        for name, path in found.items()
        if name.startswith("servecore.")
        and not name.startswith("servecore.explain")
        and "servecore.explain.explanations" in module_imports(name, path, set(found))
    )
    assert loaders == ["servecore.service"]
    tree = ast.parse((CORE / "service.py").read_text())
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ImageModel")
    calls = [
        (method.name, node.func.attr)
        for method in model.body
        if isinstance(method, ast.FunctionDef)
        for node in ast.walk(method)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "self.explanations"
    ]
    assert calls == [("run", "run")]
