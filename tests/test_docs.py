"""The docs stay honest: what they link, run and name exists. Fast, no server.

Checked in README.md, docs/*.md, bench/README.md, kserve/README.md and results/history.md:
every relative Markdown link points to an existing file (and heading, for ``#anchor``); every
``make TARGET`` is a target of the Makefile; every ``tsctl COMMAND`` is a subcommand of
tsclient.cli's parser; every ``python -m MODULE`` of this repository resolves to a module.
In the docs this renovation wrote (all but kserve/README.md, whose paths are relative to
kserve/ and name upstream files), every repository path in backticks or a code block exists,
except the generated ones listed in GENERATED; the README's layout map names only what exists;
and the README stays a front door (at most README_MAX_LINES lines).

Numbers, in NUMBER_DOCS: every setting, default, limit, port and status code stated is a row
of FACTS, checked against its one source in code or config; every measured figure quoted is a
row of FIGURES, found in the report (results/) it comes from; the README's results table names
for each row the date and the commit of its report, and its figures are in that report.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import functools
import inspect
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 250


def _docs() -> list[Path]:
    return [
        README,
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "bench" / "README.md",
        ROOT / "kserve" / "README.md",
        ROOT / "results" / "history.md",
    ]


def _own_docs() -> list[Path]:
    """The docs whose code names repository paths relative to the repository root."""
    return [d for d in _docs() if d != ROOT / "kserve" / "README.md"]


# Build output and run-time files: named by the docs, never in git (fnmatch patterns; a
# pattern ending in "/" covers everything below it).
GENERATED = (
    "build/",
    "logs/",
    ".venv/",
    "model-store/*.mar",
    "key_file.json",
    "config/config.properties",
    "kserve/config.properties",
    "kserve/runtime/config.properties",
    "results/*.png",
    "results/*.json",
    "*.egg-info/",
)
# File names the path checks treat as files (a dot alone, as in "e.g.", is not an extension).
EXTENSIONS = (
    "py",
    "sh",
    "yaml",
    "yml",
    "md",
    "json",
    "properties",
    "toml",
    "ini",
    "txt",
    "mar",
    "png",
    "jpg",
    "jpeg",
    "npy",
    "pt",
    "onnx",
    "xml",
    "bin",
    "gz",
    "cfg",
)
SHELL_FENCES = ("bash", "sh", "shell", "console")
PATHLIKE = re.compile(rf"^[A-Za-z_.][\w.\-/*]*(?:/|\.(?:{'|'.join(EXTENSIONS)}))$")


@dataclass
class Doc:
    """One Markdown file split into prose (code spans kept), fenced blocks and headings."""

    path: Path
    prose: list[str] = field(default_factory=list)
    fences: list[tuple[str, str]] = field(default_factory=list)  # (info string, text)
    headings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return rel(self.path)

    def spans(self) -> list[str]:
        """Inline code spans of the prose."""
        return [m.group(2) for line in self.prose for m in CODE_SPAN.finditer(line)]

    def shell(self) -> list[str]:
        """Lines of the fenced blocks that hold shell commands, comments cut off."""
        return [
            re.sub(r"(^|\s)#.*", "", line)
            for info, text in self.fences
            if info in SHELL_FENCES
            for line in text.splitlines()
        ]


CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


@cache
def parse(path: Path) -> Doc:
    doc = Doc(path)
    fence, info, block = None, "", []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence, info, block = m.group(1), m.group(2).lower(), []
        elif fence is not None and line.strip().startswith(fence):
            doc.fences.append((info, "\n".join(block)))
            fence = None
        elif fence is not None:
            block.append(line)
        else:
            doc.prose.append(line)
            h = HEADING.match(line)
            if h:
                doc.headings.append(h.group(2))
    return doc


def rel(path: Path) -> str:
    """``path`` as the docs name it: from the repository root (a file outside: its name)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in parse(path).headings:
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _problems_message(problems: list[str]) -> str:
    return "\n".join(["", *problems])


# ---- links -----------------------------------------------------------------------------------


def link_problems(doc: Doc) -> list[str]:
    problems = []
    for line in doc.prose:
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][\w+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (doc.path.parent / file_part).resolve() if file_part else doc.path
            if not dest.exists():
                problems.append(f"{doc.name}: link {target!r}: {file_part} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{doc.name}: link {target!r}: no heading #{anchor} in {rel(dest)}")
    return problems


# ---- make targets ----------------------------------------------------------------------------


@cache
def makefile_targets() -> frozenset[str]:
    """Every target a rule of the Makefile names (read, not run: no `make -p`)."""
    targets = set()
    rule = re.compile(r"^([^\s#:=][^:=#]*?)\s*::?(?!=)")
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = rule.match(line)
        if m:
            targets.update(m.group(1).split())
    return frozenset(targets)


def make_goals(text: str) -> list[str]:
    """The goals of every `make ...` command in ``text``: words that are no option or VAR=."""
    goals = []
    for m in re.finditer(r"(?:^|[\s;&|(])make((?:[ \t]+[^\s;&|#)]+)*)", text):
        words = m.group(1).split()
        skip = False
        for word in words:
            if skip:
                skip = False
            elif word in ("-o", "-C", "-f", "-W", "-j"):
                skip = True
            elif word.startswith("-") or "=" in word or word in ("...", "…"):
                continue
            else:
                goals.append(word)
    return goals


def make_problems(doc: Doc) -> list[str]:
    problems = []
    for text in (*doc.shell(), *doc.spans()):
        for goal in make_goals(text):
            if goal not in makefile_targets():
                problems.append(
                    f"{doc.name}: `make {goal}`: no such target in the Makefile "
                    f"(in {text.strip()!r})"
                )
    return problems


# ---- tsctl commands --------------------------------------------------------------------------


@cache
def tsctl_parser() -> argparse.ArgumentParser:
    """tsctl's own argparse parser, from the function of tsclient.cli that builds it."""
    from tsclient import cli

    for _name, fn in inspect.getmembers(cli, inspect.isfunction):
        if (
            fn.__module__ == cli.__name__
            and not any(p.default is p.empty for p in inspect.signature(fn).parameters.values())
            and inspect.signature(fn).return_annotation
            in (argparse.ArgumentParser, "argparse.ArgumentParser")
        ):
            return fn()
    raise AssertionError("tsclient.cli has no function returning its ArgumentParser")


def tsctl_commands() -> tuple[set[str], set[str]]:
    """(subcommands, global options that take a value)."""
    p = tsctl_parser()
    subs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    valued = {s for a in p._actions if a.option_strings and a.nargs != 0 for s in a.option_strings}
    return set(subs.choices), valued


def tsctl_subcommands_named(text: str) -> list[str]:
    names = []
    _, valued = tsctl_commands()
    for m in re.finditer(r"(?:^|[\s/(])tsctl((?:[ \t]+\S+)*)", text):
        skip = False
        for word in m.group(1).split():
            if skip:
                skip = False
            elif word in valued:
                skip = True
            elif word.startswith("-"):
                continue
            else:
                if re.fullmatch(r"[a-z][a-z-]*", word):
                    names.append(word)
                break
    return names


def tsctl_problems(doc: Doc) -> list[str]:
    known, _ = tsctl_commands()
    return [
        f"{doc.name}: `tsctl {name}`: tsctl has no such command (it has {sorted(known)})"
        for text in (*doc.shell(), *doc.spans())
        for name in tsctl_subcommands_named(text)
        if name not in known
    ]


# ---- python -m -------------------------------------------------------------------------------


def module_problems(doc: Doc) -> list[str]:
    problems = []
    for text in (*doc.shell(), *doc.spans()):
        for m in re.finditer(r"python[\d.]*\s+-m\s+([\w.]+)", text):
            parts = m.group(1).split(".")
            if not (ROOT / parts[0]).is_dir():
                continue  # not this repository's (pip, venv, pytest)
            base = ROOT.joinpath(*parts)
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                problems.append(f"{doc.name}: `python -m {m.group(1)}`: no such module")
    return problems


# ---- repository paths ------------------------------------------------------------------------


def generated(path: str) -> bool:
    path = path.removeprefix("./")
    return any(
        path.startswith(p) if p.endswith("/") else fnmatch.fnmatch(path, p) for p in GENERATED
    )


def path_words(text: str) -> list[str]:
    """Words of ``text`` that look like repository paths (relative, no placeholders)."""
    words = []
    for token in text.split():
        if "://" in token or "<" in token or "{" in token or "..." in token or "…" in token:
            continue
        token = re.sub(r"\$\{?[A-Z_][A-Z0-9_]*\}?/\S*", "", token)  # under $HOME, $TMPDIR...
        for word in re.split(r"[\"'`()=,;:|&$\[\]]", token):
            word = word.lstrip("@").rstrip(".")
            if "/" in word and not word.startswith(("/", "~")) and PATHLIKE.match(word):
                words.append(word)
    return words


def exists(word: str, doc: Path) -> bool:
    for base in (ROOT, doc.parent):
        if any(c in word for c in "*?["):
            if list(base.glob(word)):
                return True
        elif (base / word).exists():
            return True
    return False


def path_problems(doc: Doc) -> list[str]:
    layout = layout_block(doc)
    texts = [*doc.spans(), *(text for _, text in doc.fences if text is not layout)]
    return sorted(
        {
            f"{doc.name}: `{word}` does not exist"
            for text in texts
            for word in path_words(text)
            if not generated(word) and not exists(word, doc.path)
        }
    )


@pytest.mark.parametrize(
    "check",
    [link_problems, make_problems, tsctl_problems, module_problems],
    ids=lambda check: check.__name__,
)
@pytest.mark.parametrize("path", _docs(), ids=rel)
def test_docs_are_honest(check, path):
    """Links resolve, and every make target, tsctl command and python module named exists."""
    problems = check(parse(path))
    assert not problems, _problems_message(problems)


@pytest.mark.parametrize("path", _own_docs(), ids=rel)
def test_named_paths_exist(path):
    problems = path_problems(parse(path))
    assert not problems, _problems_message(problems)


def layout_block(doc: Doc) -> str | None:
    """The layout map: the code block with a line starting 'handlers/' (entries relative to
    the root, the names after them relative to each entry)."""
    return next(
        (
            text
            for info, text in doc.fences
            if info in ("", "text") and re.search(r"^handlers/\s", text, re.M)
        ),
        None,
    )


def layout_problems(doc: Doc) -> list[str]:
    """The README's layout map: each entry exists, and each file or folder it names inside
    an entry exists somewhere below that entry."""
    block = layout_block(doc)
    if block is None:
        return [f"{doc.name}: no layout map (a code block starting a line with 'handlers/')"]
    problems, entry = [], None
    for line in block.splitlines():
        head, _, rest = line.partition(" ") if not line.startswith(" ") else ("", "", line)
        if head:
            # "Makefile, requirements.txt, ..." lists root files; any other head is one entry.
            names = line.split(",") if head.endswith(",") else [head]
            for name in (n.split()[0] for n in names if n.split()):
                if not generated(name) and not (ROOT / name).exists():
                    problems.append(f"{doc.name} layout: {name} does not exist")
            entry = ROOT / head if head.endswith("/") else None
            rest = "" if head.endswith(",") else rest
        for word in re.findall(r"[\w.\-/*]+", rest):
            word = word.rstrip(".")
            if not PATHLIKE.match(word):
                continue
            inside = str((entry / word).relative_to(ROOT)) if entry else word
            if generated(word) or generated(inside):
                continue
            if "/" in word.rstrip("/") or entry is None:
                ok = exists(word, doc.path) or (entry is not None and (entry / word).exists())
            else:
                ok = any(entry.rglob(word.rstrip("/")))
            if not ok:
                where = f" under {entry.relative_to(ROOT)}/" if entry else ""
                problems.append(f"{doc.name} layout: {word} does not exist{where}")
    return problems


def test_readme_layout_map_names_what_exists():
    problems = layout_problems(parse(README))
    assert not problems, _problems_message(problems)


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move details to docs/"
    )


# ---- the checks can fail ---------------------------------------------------------------------


def test_checks_catch_breakage(tmp_path):
    """A broken link, a missing anchor, an unknown target, command, module or path: each is
    reported (so a green run above means something)."""
    (tmp_path / "other.md").write_text("# Real heading\n")
    bad = tmp_path / "bad.md"
    bad.write_text(
        "# Title\n\n"
        "[gone](missing.md) [anchor](other.md#no-such-heading) [ok](other.md#real-heading)\n"
        "[self](#title) [self-bad](#nope) [web](https://example.com/x.md)\n\n"
        "```bash\nmake serve\nmake no-such-target WEIGHTS=seeded   # comment\n"
        ".venv/bin/tsctl --json list\n.venv/bin/tsctl frobnicate x\n"
        "python -m bench.no_such_tool\n```\n\n"
        "See `handlers/no_such_module.py`, `build/weights/`, `tests/test_docs.py`.\n"
    )
    doc = parse(bad)
    assert link_problems(doc) == [
        "bad.md: link 'missing.md': missing.md does not exist",
        "bad.md: link 'other.md#no-such-heading': no heading #no-such-heading in other.md",
        "bad.md: link '#nope': no heading #nope in bad.md",
    ]
    assert any("no-such-target" in p for p in make_problems(doc))
    assert not any("`make serve`" in p for p in make_problems(doc))
    tsctl = tsctl_problems(doc)
    assert len(tsctl) == 1 and "frobnicate" in tsctl[0]
    assert any("bench.no_such_tool" in p for p in module_problems(doc))
    assert path_problems(doc) == ["bad.md: `handlers/no_such_module.py` does not exist"]


# ---- numbers: each setting a doc states, against its one source --------------------------------
#
# Every setting, default, limit, port and status code the docs state is a row of FACTS: the doc,
# the phrase as written with "{}" where each value stands, and where that value lives. A row
# fails when the code's value changes and the doc does not. Measured figures are rows of
# FIGURES (each number of the phrase must appear in the file it comes from), and the README's
# results table is checked row by row (test_readme_results_are_traced).

# The docs whose numbers are checked here (docs/triton.md and docs/architecture.md join once
# rewritten; kserve/README.md's numbers describe the cluster side).
NUMBER_DOCS = (
    "README.md",
    "docs/api.md",
    "docs/backends.md",
    "docs/configuration.md",
    "docs/explanations.md",
    "docs/operations.md",
    "docs/testing.md",
)
SOURCE_ROOT = ROOT  # where the sources are read (a test points it at a changed copy)


@dataclass(frozen=True)
class Source:
    """Where one value lives (``where``, as a reader would look it up) and how to read it."""

    where: str
    get: Callable[[], Any]


def default(name: str) -> Source:
    """A ``HandlerConfig`` default; ``explain.x`` for the nested section."""

    def get():
        from servecore import config

        value: Any = config.HandlerConfig()
        for part in name.split("."):
            value = getattr(value, part)
        return value

    return Source(f"servecore/config.py HandlerConfig.{name}", get)


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def model_setting(model: str, name: str) -> Source:
    """What ``model`` serves: its YAML's ``handler:`` value, else the HandlerConfig default."""

    def get():
        section = _yaml(SOURCE_ROOT / "config" / "models" / f"{model}.yaml").get("handler") or {}
        return section[name] if name in section else default(name).get()

    return Source(f"config/models/{model}.yaml handler.{name} (else its default)", get)


def frontend(key: str) -> Source:
    """A frontend key every model's YAML sets alike (the docs state it once for both)."""

    def get():
        values = {
            p.name: _yaml(p)[key]
            for p in sorted((SOURCE_ROOT / "config" / "models").glob("*.yaml"))
        }
        assert len(set(values.values())) == 1, f"the models differ in {key}: {values}"
        return next(iter(values.values()))

    return Source(f"config/models/*.yaml {key}", get)


def prop(key: str, path: str = "config/server-base.properties") -> Source:
    """A key of a TorchServe .properties file."""

    def get():
        for line in (SOURCE_ROOT / path).read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not line.lstrip().startswith("#") and name.strip() == key:
                return value.strip()
        raise AssertionError(f"{path} sets no {key}")

    return Source(f"{path} {key}", get)


def vmarg(option: str) -> Source:
    """The value of a JVM option in ``vmargs`` (``-Xmx`` -> ``3g``)."""
    base = prop("vmargs")

    def get():
        return next(arg[len(option) :] for arg in base.get().split() if arg.startswith(option))

    return Source(f"{base.where}: {option}", get)


def const(path: str, name: str) -> Source:
    """A module-level constant, read from the source with ast: no import (torch is slow)."""

    def get():
        tree = ast.parse((SOURCE_ROOT / path).read_text())
        for node in tree.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name:
                    return _literal(node.value, path)
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for element, value in zip(target.elts, node.value.elts):
                        if isinstance(element, ast.Name) and element.id == name:
                            return _literal(value, path)
        raise AssertionError(f"{path} has no constant {name}")

    return Source(f"{path} {name}", get)


def _literal(node: ast.expr, path: str) -> Any:
    """A constant's value: a literal, or arithmetic on literals (``32 * 1024 * 1024``)."""
    # No builtins and literal nodes only: nothing but arithmetic can run.
    return eval(compile(ast.Expression(node), path, "eval"), {"__builtins__": {}})


def param_default(path: str, function: str, name: str) -> Source:
    """The default of parameter ``name`` of ``function`` ("Class.method" or "function")."""

    def get():
        scope: list[ast.stmt] = ast.parse((SOURCE_ROOT / path).read_text()).body
        for part in function.split("."):
            node = next(
                n
                for n in scope
                if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part
            )
            scope = node.body
        args = node.args  # type: ignore[union-attr]
        positional = args.posonlyargs + args.args
        pairs = [
            *zip(positional[len(positional) - len(args.defaults) :], args.defaults),
            *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None),
        ]
        return next(_literal(d, path) for a, d in pairs if a.arg == name)

    return Source(f"{path} {function}({name}=...)", get)


def make_var(name: str) -> Source:
    """A variable's default in the Makefile (``NAME ?= value``)."""

    def get():
        m = re.search(rf"^{name}\s*\??=\s*(\S+)", (SOURCE_ROOT / "Makefile").read_text(), re.M)
        assert m, f"the Makefile sets no {name}"
        return m.group(1)

    return Source(f"Makefile {name}", get)


def status(kind: str) -> Source:
    """The HTTP status servecore/errors.py's STATUS table gives an error kind."""

    def get():
        from servecore import errors

        return int(errors.STATUS[getattr(errors, kind)])

    return Source(f"servecore/errors.py STATUS[{kind}]", get)


def retry_after() -> Source:
    def get():
        from servecore import errors

        return errors.Overloaded("").headers["Retry-After"]

    return Source("servecore/errors.py Overloaded.headers", get)


def port(name: str) -> Source:
    return const("serveshared/ports.py", name)


# How the docs write values.
def mib(n: int) -> str:
    assert n % (1 << 20) == 0, n
    return f"{n >> 20} MiB"


def kib(n: int) -> str:
    assert n % 1024 == 0, n
    return f"{n >> 10} KiB"


def mp(n: int) -> str:
    return f"{n / 1e6:g} MP"


def spaced(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def commas(n: int) -> str:
    return f"{n:,}"


def jvm_size(value: str) -> str:
    return f"{value[:-1]} {value[-1].upper()}iB"


def percent(share: float) -> str:
    return f"{share * 100:g}%"


def minutes_in_words(minutes: float) -> str:
    """1440 -> "one day", 1 -> "a minute"; any other value as "N minutes" (so a changed
    value fails a doc that still says "one day")."""
    return {1: "a minute", 60: "an hour", 1440: "one day"}.get(minutes, f"{minutes:g} minutes")


def seconds_in_words(seconds: float) -> str:
    return minutes_in_words(seconds / 60) if seconds % 60 == 0 else f"{seconds:g} s"


def number_word(n: int) -> str:
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    return words[n] if 0 <= n <= 10 else str(n)


@dataclass(frozen=True)
class Fact:
    """A phrase of ``doc`` as written, ``{}`` where each value of ``sources`` stands."""

    doc: str
    phrase: str
    sources: tuple[Source, ...]
    fmt: Callable[[Any], str] = str

    def expected(self) -> str:
        text = self.phrase
        for source in self.sources:
            text = text.replace("{}", self.fmt(source.get()), 1)
        return text


def flat(text: str) -> str:
    """Text with every run of whitespace as one space (docs wrap lines anywhere)."""
    return " ".join(text.split())


@cache
def doc_text(doc: str) -> str:
    return flat((ROOT / doc).read_text(encoding="utf-8"))


def fact_problem(fact: Fact, text: str) -> str | None:
    """None when ``text`` holds the phrase with today's values; else what it says instead."""
    expected = flat(fact.expected())
    if expected in text:
        return None
    pattern = r"(.{1,40}?)".join(re.escape(part) for part in flat(fact.phrase).split("{}"))
    found = re.search(pattern, text)
    said = f"it says {found.group(0)!r}" if found else "no such phrase"
    return f"{fact.doc}: expected {expected!r} ({'; '.join(s.where for s in fact.sources)}); {said}"


R, API, BACK, CONF, EXPL, OPS, TEST = NUMBER_DOCS
TAGGER = "resnet50-tagger"
PIXELS = {"max_image_pixels": mp, "max_request_pixels": mp, "max_batch_pixels": mp}
BYTES = {"max_image_bytes": mib, "max_json_bytes": mib, "max_response_bytes": mib}
EMBEDDING_DIM = const("model_files/resnet_dual.py", "EMBEDDING_DIM")
FLUSH_S = param_default("tsclient/batchjob.py", "PartSink.__init__", "flush_s")
FLUSH_ROWS = param_default("tsclient/batchjob.py", "PartSink.__init__", "flush_rows")
CROP = 224  # IMAGENET1K_V2's centre crop (the weights' transforms(); importing them is slow)
OCCLUSION_PASSES = Source(
    f"servecore/explain/compute.py OCCLUSION_PASSES at the {CROP} px crop",
    lambda: (
        (
            (CROP - const("servecore/explain/compute.py", "OCCLUSION_WINDOW").get())
            // const("servecore/explain/compute.py", "OCCLUSION_STRIDE").get()
            + 1
        )
        ** 2
    ),
)
STATUSES = (
    "InvalidRequest",
    "InvalidParameter",
    "InvalidImage",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "Overloaded",
    "InternalError",
    "NotSupported",
    "DeadlineExceeded",
)

FACTS: tuple[Fact, ...] = (
    # README.md
    Fact(
        R,
        "inference on port {}, management on {}, metrics on {}",
        (port("INFERENCE"), port("MANAGEMENT"), port("METRICS")),
    ),
    Fact(R, "`make serve-triton`, on port {}", (port("TRITON_HTTP"),)),
    Fact(
        R,
        "keys live {};",
        (prop("token_expiration_min", "config/server.properties"),),
        lambda m: minutes_in_words(int(m)),
    ),
    Fact(
        R,
        "rotating it first when it expires within {}",
        (const("tsclient/cli.py", "ROTATE_MARGIN_S"),),
        seconds_in_words,
    ),
    Fact(
        R,
        "`topk` (1..{}, default {})",
        (const("servecore/parse.py", "MAX_TOP_K"), model_setting(TAGGER, "top_k")),
    ),
    Fact(R, '`{"embedding": [{} floats]}`', (EMBEDDING_DIM,)),
    Fact(R, "`embedding` (`FP32`, `[n, {}]`)", (EMBEDDING_DIM,)),
    Fact(
        R,
        "(`{}`, `{}`, `{}`, `{}` with `Retry-After`",
        tuple(
            status(k)
            for k in ("InvalidRequest", "PayloadTooLarge", "UnsupportedMediaType", "Overloaded")
        ),
    ),
    Fact(
        R,
        "(TorchServe itself, v1 and v2 on port {})",
        (prop("inference_address", "kserve/runtime/server.properties"),),
        lambda url: url.rsplit(":", 1)[1],
    ),
    Fact(R, "UI on 127.0.0.1:{}", (make_var("MONITOR_PORT"),)),
    # docs/api.md
    Fact(API, "| {} | `POST /predictions/{model}[/{version}]`", (port("INFERENCE"),)),
    Fact(API, "| {} | `/models`, `/models/{model}[/{version}]`", (port("MANAGEMENT"),)),
    Fact(API, "| {} | `GET /metrics` |", (port("METRICS"),)),
    Fact(API, "Every call on {} and {} carries", (port("INFERENCE"), port("MANAGEMENT"))),
    Fact(API, "`/v2/models/{model}/explain` answers {} |", (status("NotSupported"),)),
    Fact(API, '`{"embedding": [{} floats]}`', (EMBEDDING_DIM,)),
    Fact(API, "`embedding` is `FP32`, shape `[n, {}]`", (EMBEDDING_DIM,)),
    Fact(
        API,
        "`topk` (1..{}, default `top_k` from the model's config, {})",
        (const("servecore/parse.py", "MAX_TOP_K"), model_setting(TAGGER, "top_k")),
    ),
    Fact(API, "a bad `topk` is a `{}` for that request alone", (status("InvalidParameter"),)),
    *(Fact(API, f"| {{}} | `{kind}` |", (status(kind),)) for kind in STATUSES),
    Fact(
        API,
        "`id` not a string or longer than {} characters",
        (const("servecore/parse.py", "MAX_ID_CHARS"),),
    ),
    Fact(
        API,
        "a v2 `id`, which the answer echoes, is at most {} characters",
        (const("servecore/parse.py", "MAX_ID_CHARS"),),
    ),
    Fact(API, "`max_json_depth` ({})", (default("max_json_depth"),)),
    Fact(API, "`topk` not an integer in 1..{}", (const("servecore/parse.py", "MAX_TOP_K"),)),
    Fact(API, "`n_steps` over `explain.max_n_steps` ({})", (default("explain.max_n_steps"),)),
    Fact(API, "more than `explain.max_targets` ({}) targets", (default("explain.max_targets"),)),
    Fact(
        API,
        "needing more than `explain.max_passes_per_batch` ({}) passes",
        (default("explain.max_passes_per_batch"),),
    ),
    Fact(
        API,
        "`explain.max_passes_per_batch` ({} passes); carries `Retry-After: {}`",
        (default("explain.max_passes_per_batch"), retry_after()),
    ),
    *(
        Fact(API, f"`{name}` ({{}}", (default(name),), fmt)
        for name, fmt in {
            **PIXELS,
            **BYTES,
            "max_images_per_request": str,
            "max_batch_images": str,
            "bulk_batch_images": str,
            "interactive_window_ms": str,
        }.items()
    ),
    Fact(
        API,
        "a request body over `max_request_size` ({}, `config/server-base.properties`)",
        (prop("max_request_size"),),
        lambda n: mib(int(n)),
    ),
    Fact(API, "(a full queue: more than `job_queue_size`, {}, requests", (prop("job_queue_size"),)),
    Fact(
        API,
        "at most `max_images_per_request` ({}). Every image",
        (default("max_images_per_request"),),
    ),
    Fact(
        API,
        "16 clients flooding requests of {} one-colour 8x8 PNGs",
        (default("max_images_per_request"),),
    ),
    Fact(
        API,
        "at most `max_batch_images` ({}) rows and decodes at most `max_batch_pixels` ({})",
        (default("max_batch_images"), default("max_batch_pixels")),
        lambda n: str(n) if n < 10_000 else mp(n),
    ),
    Fact(
        API,
        "first and last {}; the last {} refused)",
        (const("servecore/stages.py", "_SAMPLE"), const("servecore/admission.py", "REMEMBERED")),
        lambda n: kib(n) if n % 1024 == 0 and n > 10_000 else commas(n),
    ),
    Fact(API, "far below the {} s `responseTimeout`", (frontend("responseTimeout"),)),
    Fact(
        API,
        "quotes at most {} characters of a value",
        (const("servecore/errors.py", "ECHO_CHARS"),),
    ),
    Fact(
        API,
        "is itself at most {} characters",
        (const("servecore/errors.py", "MESSAGE_CHARS"),),
        commas,
    ),
    # docs/configuration.md
    Fact(
        CONF,
        "keys living `token_expiration_min={}` minutes",
        (prop("token_expiration_min", "config/server.properties"),),
    ),
    Fact(
        CONF,
        "request and response size limits ({})",
        (prop("max_request_size"), prop("max_response_size")),
        lambda n: mib(int(n)),
    ),
    Fact(
        CONF,
        "request and response size limits (32 MiB), `job_queue_size={}`",
        (prop("job_queue_size"),),
    ),
    Fact(
        CONF,
        "(`vmargs`: {} heap, {} direct memory, `ExitOnOutOfMemoryError`;",
        (vmarg("-Xmx"), vmarg("-XX:MaxDirectMemorySize=")),
        jvm_size,
    ),
    *(
        Fact(CONF, f"| `{name}` | {{}} |", (default(name),), fmt)
        for name, fmt in {
            "task": lambda v: f"`{v}`",
            "top_k": str,
            "normalize_embedding": lambda v: f"`{v}`".lower(),
            "device": lambda v: f"`{v}`",
            "half_precision": lambda v: f"`{v}`".lower(),
            "precision": lambda v: f"`{v}`",
            "threads": str,
            "decode_threads": str,
            "onnx_spinning": lambda v: f"`{v}`".lower(),
            "draft_decode": lambda v: f"`{v}`".lower(),
            "max_image_pixels": spaced,
            "max_image_bytes": mib,
            "max_images_per_request": str,
            "max_batch_images": str,
            "bulk_batch_images": str,
            "interactive_window_ms": str,
            "forward_rows": str,
            "max_response_bytes": mib,
            "max_request_pixels": spaced,
            "max_batch_pixels": spaced,
            "max_json_depth": str,
            "max_json_bytes": mib,
            "explain.method": lambda v: f"`{v}`",
            "explain.n_steps": str,
            "explain.max_n_steps": str,
            "explain.internal_batch_size": str,
            "explain.max_targets": str,
            "explain.png_max_side": str,
            "explain.max_passes_per_batch": str,
        }.items()
    ),
    Fact(
        CONF,
        "one per usable core (the cgroup CPU quota, so a pod's CPU limit, not the node's "
        "cores), at most {} on a CPU worker, uncapped on a GPU worker |",
        (const("servecore/intake.py", "MAX_DECODE_THREADS"),),
    ),
    Fact(
        CONF,
        "tags when a request gives no `topk` (1..{})",
        (const("servecore/parse.py", "MAX_TOP_K"),),
    ),
    Fact(
        CONF,
        "`batchSize: {}`, `maxBatchDelay: {}` ms, one worker per model",
        (frontend("batchSize"), frontend("maxBatchDelay")),
    ),
    Fact(
        CONF,
        "one worker per model",
        (frontend("maxWorkers"),),
        lambda n: "one worker per model" if n == 1 else f"{n} workers per model",
    ),
    Fact(
        CONF,
        "(`decode_threads: 0` = one per core, at most {})",
        (const("servecore/intake.py", "MAX_DECODE_THREADS"),),
    ),
    # docs/explanations.md
    Fact(EXPL, "`/v2/models/{model}/explain` answers {})", (status("NotSupported"),)),
    Fact(EXPL, "(at most `explain.max_targets`, {})", (default("explain.max_targets"),)),
    Fact(
        EXPL,
        "`gradcam` (default, `explain.method`)",
        (default("explain.method"),),
        lambda m: "`gradcam` (default" if m == "gradcam" else m,
    ),
    Fact(
        EXPL,
        "`occlusion` ({} px window, stride {})",
        (
            const("servecore/explain/compute.py", "OCCLUSION_WINDOW"),
            const("servecore/explain/compute.py", "OCCLUSION_STRIDE"),
        ),
    ),
    Fact(
        EXPL,
        "IG steps (default `explain.n_steps` {}, at most `explain.max_n_steps` {}) and "
        "rows per pass (`explain.internal_batch_size`, {})",
        (
            default("explain.n_steps"),
            default("explain.max_n_steps"),
            default("explain.internal_batch_size"),
        ),
    ),
    Fact(
        EXPL,
        "`ig` and `occlusion` {}×{}",
        (
            const("servecore/explain/compute.py", "INPUT_GRID"),
            const("servecore/explain/compute.py", "INPUT_GRID"),
        ),
    ),
    Fact(
        EXPL,
        "longer side at most `explain.png_max_side` ({} px;",
        (default("explain.png_max_side"),),
    ),
    Fact(
        EXPL,
        "(ours is {}; a request carries at most {} images x {} targets",
        (
            prop("max_response_size"),
            default("max_images_per_request"),
            default("explain.max_targets"),
        ),
        lambda n: mib(int(n)) if int(n) > 1000 else str(n),
    ),
    Fact(
        EXPL,
        "are `{} InvalidParameter`; the budget's refusals are `{} Overloaded`",
        (status("InvalidParameter"), status("Overloaded")),
    ),
    Fact(
        EXPL,
        "| `ig`, `n_steps` {}, `internal_batch_size` {} | {} forward + backward",
        (
            default("explain.n_steps"),
            default("explain.internal_batch_size"),
            default("explain.n_steps"),
        ),
    ),
    Fact(
        EXPL,
        "| `occlusion`, {} px window, stride {} | {} forward |",
        (
            const("servecore/explain/compute.py", "OCCLUSION_WINDOW"),
            const("servecore/explain/compute.py", "OCCLUSION_STRIDE"),
            OCCLUSION_PASSES,
        ),
    ),
    Fact(
        EXPL,
        "at most `explain.max_passes_per_batch` ({}) passes of explanation work",
        (default("explain.max_passes_per_batch"),),
    ),
    Fact(EXPL, "IG `n_steps`, occlusion {})", (OCCLUSION_PASSES,)),
    Fact(
        EXPL,
        "the rest get {} with `Retry-After: {}`, and one request needing more than the "
        "budget on its own is a {}",
        (status("Overloaded"), retry_after(), status("InvalidParameter")),
    ),
    Fact(
        EXPL,
        "wait for at most {} passes (two IG explanations at the default {} steps)",
        (default("explain.max_passes_per_batch"), default("explain.n_steps")),
    ),
    Fact(EXPL, "Keep `responseTimeout` ({} s)", (frontend("responseTimeout"),)),
    # docs/operations.md
    Fact(
        OPS,
        "talks to `127.0.0.1:{}/{}/{}`",
        (port("INFERENCE"), port("MANAGEMENT"), port("METRICS")),
    ),
    Fact(OPS, "over {} characters: allowed are letters", (const("tsclient/base.py", "MAX_NAME"),)),
    Fact(
        OPS,
        "rows are written every {} s (or {} rows)",
        (FLUSH_S, FLUSH_ROWS),
        lambda n: commas(n) if n > 100 else f"{n:g}",
    ),
    Fact(OPS, "the last {} s of answers", (FLUSH_S,), lambda n: f"{n:g}"),
    Fact(
        OPS,
        "scans the index in chunks of {} vectors",
        (const("tsclient/search.py", "CHUNK_ROWS"),),
        commas,
    ),
    Fact(
        OPS,
        "`token_expiration_min=1440` (one day)",
        (prop("token_expiration_min", "config/server.properties"),),
        lambda m: f"`token_expiration_min={m}` ({minutes_in_words(int(m))})",
    ),
    Fact(
        OPS,
        "(`--print` rotates a key first when it expires within {})",
        (const("tsclient/cli.py", "ROTATE_MARGIN_S"),),
        seconds_in_words,
    ),
    Fact(
        OPS, "A burst beyond `job_queue_size`** ({} requests per model", (prop("job_queue_size"),)
    ),
    Fact(
        OPS,
        "its memory follows `max_request_size` ({}) times",
        (prop("max_request_size"),),
        lambda n: mib(int(n)),
    ),
    Fact(
        OPS,
        "per model `job_queue_size` ({}) waiting plus `batchSize` ({}) in the running batch",
        (prop("job_queue_size"), frontend("batchSize")),
    ),
    Fact(
        OPS,
        "`-Xmx{}`: room for 2 models x ({} + {}) x {} =",
        (vmarg("-Xmx"), prop("job_queue_size"), frontend("batchSize"), prop("max_request_size")),
        lambda v: mib(int(v)) if str(v).isdigit() and int(v) > 1000 else str(v),
    ),
    Fact(OPS, "`-XX:MaxDirectMemorySize={}`", (vmarg("-XX:MaxDirectMemorySize="),)),
    Fact(
        OPS,
        "24 clients each sending two bodies of {} of random bytes",
        (prop("max_request_size"),),
        lambda n: mib(int(n)),
    ),
    Fact(OPS, "`forward_rows` (the model's `batchSize`, {})", (frontend("batchSize"),)),
    Fact(OPS, "`/metrics` on port {}", (port("METRICS"),)),
    Fact(OPS, "scraping `make serve`'s metrics port (127.0.0.1:{})", (port("METRICS"),)),
    Fact(OPS, "its UI is on <http://127.0.0.1:{}>", (make_var("MONITOR_PORT"),)),
    Fact(
        OPS,
        "(scrapes port {} of every predictor pod",
        (prop("metrics_address", "kserve/runtime/server.properties"),),
        lambda url: url.rsplit(":", 1)[1],
    ),
    Fact(OPS, "Lines fit {} columns", (const("tsclient/top.py", "WIDTH"),)),
    # docs/backends.md
    Fact(
        BACK,
        "while the whole measurement (loading and warm-up included) fits in {} s",
        (const("servecore/autoprecision.py", "BUDGET_S"),),
        lambda s: f"{s:g}",
    ),
    Fact(
        BACK,
        "at most {}; one round when there is a single candidate",
        (const("servecore/autoprecision.py", "MAX_ROUNDS"),),
        number_word,
    ),
    Fact(
        BACK,
        "unless another is within the **{} margin** of it",
        (const("servecore/precision.py", "MARGIN"),),
        percent,
    ),
    Fact(
        BACK,
        "(`f32` > `f16` > `bf16` > `int8+f32` > `int8+bf16`)",
        (const("servecore/precision.py", "PRECISE_FIRST"),),
        lambda order: "(" + " > ".join(f"`{p}`" for p in order) + ")",
    ),
    Fact(
        BACK,
        "a batch of {} images per execution",
        (const("bench/null/package.py", "BATCH_IMAGES"),),
    ),
    Fact(
        BACK,
        "more rounds run only while the whole measurement fits in {} s",
        (const("servecore/autoprecision.py", "BUDGET_S"),),
        lambda s: f"{s:g}",
    ),
    # docs/testing.md
    Fact(
        TEST,
        "and the README stays under {} lines",
        (Source("tests/test_docs.py README_MAX_LINES", lambda: README_MAX_LINES),),
    ),
)


@pytest.mark.parametrize("doc", NUMBER_DOCS)
def test_settings_stated_match_their_source(doc):
    """Each setting, default, limit, port and status a doc states is its source's value."""
    problems = [
        p for fact in FACTS if fact.doc == doc for p in [fact_problem(fact, doc_text(doc))] if p
    ]
    assert not problems, _problems_message(problems)


def test_number_checks_catch_breakage(tmp_path, monkeypatch):
    """Each kind of source, changed while the doc keeps the old value, fails its fact (so a
    green run above means the docs say what the code does)."""
    from servecore import config, errors

    facts = {
        "HandlerConfig default": Fact(
            CONF, "| `max_images_per_request` | {} |", (default("max_images_per_request"),)
        ),
        "model YAML handler:": Fact(
            R, "`topk` (1..1000, default {})", (model_setting(TAGGER, "top_k"),)
        ),
        "model YAML frontend key": Fact(CONF, "`batchSize: {}`", (frontend("batchSize"),)),
        ".properties key": Fact(CONF, "`job_queue_size={}`", (prop("job_queue_size"),)),
        "JVM option": Fact(CONF, "`vmargs`: {} heap", (vmarg("-Xmx"),), jvm_size),
        "module constant": Fact(R, "inference on port {},", (port("INFERENCE"),)),
        "parameter default": Fact(OPS, "every {} s (or", (FLUSH_S,), lambda n: f"{n:g}"),
        "Makefile variable": Fact(R, "UI on 127.0.0.1:{}", (make_var("MONITOR_PORT"),)),
        "status table": Fact(API, "| {} | `PayloadTooLarge` |", (status("PayloadTooLarge"),)),
    }
    for kind, fact in facts.items():
        assert fact_problem(fact, doc_text(fact.doc)) is None, kind

    def change(path: str, old: str, new: str) -> None:
        text = (ROOT / path).read_text()
        assert old in text, (path, old)
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text.replace(old, new))

    change("config/models/resnet50-embedding.yaml", "batchSize: 16", "batchSize: 32")
    change("config/models/resnet50-tagger.yaml", "top_k: 5", "top_k: 7")
    text = (tmp_path / "config/models/resnet50-tagger.yaml").read_text()
    (tmp_path / "config/models/resnet50-tagger.yaml").write_text(
        text.replace("batchSize: 16", "batchSize: 32")
    )
    change("config/server-base.properties", "job_queue_size=16", "job_queue_size=8")
    text = (tmp_path / "config/server-base.properties").read_text()
    (tmp_path / "config/server-base.properties").write_text(text.replace("-Xmx3g", "-Xmx4g"))
    change("serveshared/ports.py", "INFERENCE = 8080", "INFERENCE = 9080")
    change("tsclient/batchjob.py", "flush_s: float = 2.0", "flush_s: float = 5.0")
    change("Makefile", "MONITOR_PORT ?= 9090", "MONITOR_PORT ?= 9191")
    monkeypatch.setattr(sys.modules[__name__], "SOURCE_ROOT", tmp_path)
    monkeypatch.setattr(
        config, "HandlerConfig", functools.partial(config.HandlerConfig, max_images_per_request=9)
    )
    monkeypatch.setitem(errors.STATUS, errors.PayloadTooLarge, HTTPStatus.BAD_REQUEST)
    for kind, fact in facts.items():
        problem = fact_problem(fact, doc_text(fact.doc))
        assert problem is not None and fact.sources[0].where in problem, kind
    assert "it says '`topk` (1..1000, default 5)'" in fact_problem(
        facts["model YAML handler:"], doc_text(R)
    )


# ---- measured figures: each traced to the report it comes from -------------------------------

# A figure as the docs write it: "1,414", "6.1x", "0.13-0.16", "22.2/338" (a number glued to a
# word, as in "bf16", "p50" or "5xx", is a name, not a figure).
FIGURE = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(%|(?=x\b|[^\w]|$))")
REPORT_NUMBER = re.compile(r"(?<![\d.])\d+(?:,\d{3})*(?:\.\d+)?%?")


def figures(text: str) -> list[str]:
    return [m.group(0) for m in FIGURE.finditer(text)]


HAND_WRITTEN = ("results/history.md",)  # the rest of results/ is generated by the tools


@cache
def report_blocks(path: str) -> tuple[tuple[str, ...], ...]:
    """The numbers of each block of a report that one quoted phrase must come from: a section
    (from one heading to the next) of a generated report; a paragraph, list item or table row
    of a hand-written one, whose sections mix many runs."""
    blocks, block = [], []
    for line in [*(ROOT / path).read_text(encoding="utf-8").splitlines(), "#"]:
        if line.startswith("#") or (
            path in HAND_WRITTEN and (not line.strip() or line.lstrip().startswith(("- ", "|")))
        ):
            blocks.append(" ".join(block))
            block = []
        block.append(line)
    return tuple(tuple(REPORT_NUMBER.findall(b)) for b in blocks if b.strip())


def traced(figure: str, numbers: tuple[str, ...]) -> bool:
    """``figure`` is one of ``numbers``, or one of them rounded to the figure's decimals
    ("6.1" is a report's 6.119, "0.13" its 0.133; "16" is not its 15.9); "96%" is a report's
    96% or 0.96."""
    if figure.endswith("%"):
        share = float(figure[:-1].replace(",", "")) / 100
        return figure in numbers or traced(f"{share:.{len(figure) + 2}g}", numbers)
    places = len(figure.partition(".")[2])
    value = float(figure.replace(",", ""))
    for number in numbers:
        if number.endswith("%"):
            continue
        exact = float(number.replace(",", ""))
        if exact == value or (
            len(number.partition(".")[2]) > places > 0
            and abs(exact - value) <= 0.5 * 10**-places + 1e-9
        ):
            return True
    return False


def untraced(text: str, reports: tuple[str, ...]) -> list[str]:
    """The figures of ``text`` that no one block of the ``reports`` (``report_blocks``) holds
    together: [] when one holds them all, else what the closest block lacks."""
    wanted = figures(text)
    for report in reports:
        for numbers in report_blocks(report):
            if all(traced(f, numbers) for f in wanted):
                return []
    best = min(
        (
            ([f for f in wanted if not traced(f, numbers)])
            for report in reports
            for numbers in report_blocks(report)
        ),
        key=len,
        default=wanted,
    )
    return best


@dataclass(frozen=True)
class Figure:
    """A measured phrase of ``doc`` as written; each figure in it must be in ``reports``."""

    doc: str
    phrase: str
    reports: tuple[str, ...]


def figure_problem(figure: Figure, text: str) -> str | None:
    if flat(figure.phrase) not in text:
        return f"{figure.doc}: no longer says {figure.phrase!r}: update FIGURES"
    missing = untraced(figure.phrase, figure.reports)
    return (
        f"{figure.doc}: {missing} of {figure.phrase!r} appear in none of {list(figure.reports)}"
        if missing
        else None
    )


RESULTS_HEADER = ["what", "figure", "measured", "report"]
MEASURED = re.compile(r"^(\d{4}-\d{2}-\d{2}), `([0-9a-f]{7,40})`$")


def results_rows(doc: Doc) -> list[dict[str, str]]:
    """The rows of the doc's results table (the one headed | what | figure | measured |
    report |), each a dict by column."""
    rows: list[dict[str, str]] = []
    header = None
    for line in doc.prose:
        cells = (
            [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|")
            else None
        )
        if cells == RESULTS_HEADER:
            header = cells
        elif header and cells and not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
        elif header and not cells:
            break
    return rows


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def results_row_problems(row: dict[str, str], history: bool = True) -> list[str]:
    """A row of the README's results table: its figures are in the results it links, and its
    measured cell names the date and the commit that added that report as it is now."""
    what = row.get("what", "?")
    reports = [
        rel((README.parent / target.partition("#")[0]).resolve())
        for target in LINK.findall(row.get("report", ""))
    ]
    reports = [r for r in reports if r.startswith("results/") and r.endswith(".md")]
    if not reports:
        return [f"results row {what!r}: links no report in results/"]
    problems = []
    missing = untraced(row.get("figure", ""), tuple(reports))
    if missing:
        problems.append(f"results row {what!r}: {missing} appear in none of {reports}")
    m = MEASURED.match(row.get("measured", ""))
    if not m:
        return [
            *problems,
            f"results row {what!r}: measured should read 'YYYY-MM-DD, `commit`', "
            f"not {row.get('measured')!r}",
        ]
    date, commit = m.groups()
    for report in reports:
        stated = re.search(r"^- Date: (\d{4}-\d{2}-\d{2})", (ROOT / report).read_text(), re.M)
        if stated and stated.group(1) != date:
            problems.append(
                f"results row {what!r}: measured {date}, {report} says {stated.group(1)}"
            )
    if history:
        problems += commit_problems(what, commit, reports)
    return problems


def commit_problems(what: str, commit: str, reports: list[str]) -> list[str]:
    if git("merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        return [f"results row {what!r}: commit {commit} is not in this branch's history"]
    problems = []
    for report in reports:
        then = git("show", f"{commit}:{report}")
        if then.returncode != 0 or then.stdout != (ROOT / report).read_text():
            last = git("log", "-1", "--format=%h", "--", report).stdout.strip()
            problems.append(
                f"results row {what!r}: {report} is not as commit {commit} added it "
                f"(it last changed in {last}): name the commit of the current report"
            )
    return problems


def full_history() -> bool:
    return git("rev-parse", "--is-shallow-repository").stdout.strip() == "false"


def test_readme_results_are_traced():
    """Every figure of the README's results table is in the report its row links, and each
    row names its date and the commit that added that report (in this branch's history)."""
    rows = results_rows(parse(README))
    assert rows, "README.md has no results table headed | what | figure | measured | report |"
    history = full_history()
    problems = [p for row in rows for p in results_row_problems(row, history)]
    assert not problems, _problems_message(problems)
    if not history:
        pytest.skip("not a full git clone: the rows' commits were not checked")


def test_figure_checks_catch_breakage():
    """A figure no report holds, a date the report contradicts, a commit outside the history
    or one whose report has changed since: each is reported."""
    assert traced("6.1", ("6.119",)) and traced("1,414", ("1414",)) and traced("12", ("12.0",))
    assert not traced("6.2", ("6.119",)) and not traced("16", ("15.9",))
    assert figures("p50 0.59x, 5xx, int8+bf16, 0.13-0.16 s, 22.2/338, 2%") == [
        "0.59",
        "0.13",
        "0.16",
        "22.2",
        "338",
        "2%",
    ]
    assert traced("2%", ("0.02",)) and not traced("3%", ("3", "0.02"))
    # a phrase's figures come from one block: one run's row, not numbers scattered over a file
    assert untraced("74.4 img/s, batches already full at 10", (H,)) == []
    assert untraced("74.4 img/s, about 3 s of 12.4-19.8 s", (H,))
    assert untraced("bf16 2%, int8 7%", ("tests/reference.py",)) == ["7%"]
    row = {
        "what": "w",
        "figure": "small JPEG 6.1x (130.4 img/s)",
        "measured": "2026-11-25, `79f312a`",
        "report": "[b](results/benchmark.md)",
    }
    assert results_row_problems(row, history=False) == []
    assert "['6.3']" in results_row_problems({**row, "figure": "6.3x"}, history=False)[0]
    assert (
        "says 2026-11-25"
        in results_row_problems({**row, "measured": "2026-11-24, `79f312a`"}, history=False)[0]
    )
    assert (
        "measured should read"
        in results_row_problems({**row, "measured": "last week"}, history=False)[0]
    )
    assert "links no report" in results_row_problems({**row, "report": "[d](docs/api.md)"})[0]
    if not full_history():
        pytest.skip("not a full git clone: the commit checks need the history")
    assert "not in this branch's history" in commit_problems("w", "0000000", [])[0]
    first = git("rev-list", "--max-parents=0", "HEAD").stdout.split()[0]
    assert "is not as commit" in commit_problems("w", first, ["results/benchmark.md"])[0]


H, BENCH, INGEST, COLL, SOAK, SOAK_TRITON, TRAFFIC, CEIL = (
    "results/history.md",
    "results/benchmark.md",
    "results/ingestion.md",
    "results/collection.md",
    "results/soak.md",
    "results/soak-triton.md",
    "results/traffic.md",
    "results/ceiling.md",
)
FIGURES: tuple[Figure, ...] = (
    # docs/backends.md
    Figure(
        BACK,
        "(1.07x OpenVINO's on an Intel Xeon, issue #17; 1.14-1.29x on this project's AMD EPYC)",
        (H,),
    ),
    Figure(BACK, "served 14.4 img/s against OpenVINO's 14.7", (H,)),
    Figure(BACK, "(1.8x f32 on one host, 60% of it on another)", (H,)),
    Figure(BACK, "its time is printed, 27-45 s on 2 cores", (H,)),
    Figure(
        BACK,
        "203.5 ms in the handler per batch of 15.9 (parse and admit 2.3, decode 33.8, "
        "forward 166.9, encode 0.5), 3.8 ms of socket transport, the worker busy 0.96 "
        "of the wall time: 73.1 img/s, 0.74x the raw forward of the same precision at "
        "batch 16 (98.2 img/s)",
        (INGEST,),
    ),
    Figure(BACK, "| batches of 10.7 -> 15.9; 63.8 -> 76.6 img/s (1.2x) |", (H,)),
    Figure(BACK, "| 67.0 (delay 1), 75.7 (delay 10) img/s: no gain on 2 cores |", (H,)),
    Figure(BACK, "| 74.4 img/s, batches already full at 10 |", (H,)),
    Figure(BACK, "| 101.4 vs 99.4 img/s raw: within noise |", (H,)),
    Figure(BACK, "(PIL decode and resize, ~2.4 ms per image on one thread)", (H,)),
    Figure(BACK, "OpenVINO's bf16 ran at 60% of its f32 speed (issue #17)", (H,)),
    Figure(
        BACK,
        "bf16 moves the embedding by about 0.4-0.8% relative to float32 "
        "(`tests/test_openvino.py` allows 2%)",
        (H, "tests/test_openvino.py"),
    ),
    Figure(BACK, "| 2.8 s (load ~2) | about 2 s |", (H,)),
    Figure(BACK, "| 12.4-19.8 s (load 6-8) | about half |", (H,)),
    Figure(
        BACK,
        "A forward at batch 16 took 0.8 s (f32) when the machine was quieter and 3-5 s "
        "under that load, so the two-candidate figure on a quiet machine is about 3 s.",
        (H,),
    ),
    Figure(
        BACK,
        "`auto` measured all four candidates in 3.7 s at worker start (ms per batch of "
        "1/16: f32 22.2/338, bf16 12.2/172.7, int8+f32 8.3/93.3, int8+bf16 8.8/87.2)",
        (BENCH,),
    ),
    Figure(
        BACK,
        "Raw forward at batch 16: OpenVINO f32 50.5 img/s, bf16 101.7, int8+f32 208.0, "
        "int8+bf16 210.8.",
        (BENCH,),
    ),
    Figure(
        BACK,
        "| small JPEG | 130.4 img/s | 21.3 img/s | 6.1x | 4.5x where int8 runs on VNNI: met |",
        (BENCH,),
    ),
    Figure(BACK, "| smooth 12 MP photo | 74.2 img/s | 10.4 img/s | 7.2x | 3x: met |", (BENCH,)),
    Figure(BACK, "| noisy 12 MP photo | 27.1 img/s | 8.67 img/s | 3.1x | 4x: missed |", (BENCH,)),
    Figure(
        BACK, "| 1 client, small JPEG, p50 | 29.8 ms | 50.8 ms | 0.59x | 0.5x: missed |", (BENCH,)
    ),
    Figure(
        BACK,
        "| small JPEG vs our own raw forward at batch 16 | 130.4 img/s | 210.8 img/s | "
        "0.62x | 0.75x: missed |",
        (BENCH,),
    ),
    Figure(
        BACK,
        "the served tagger reached 0.94x the in-process pipeline (decode, preprocess and "
        "forward in one process, no HTTP: 138.9 img/s)",
        (BENCH,),
    ),
    Figure(BACK, "The same request path on Triton served 154.2 img/s", (BENCH,)),
    Figure(BACK, "with 1 ms it was about 20 ms on earlier runs", (H,)),
    Figure(
        BACK,
        "its decode+preprocess+forward takes 38.9 ms where the forward alone runs 165.8 "
        "images a second at batch 1",
        (BENCH,),
    ),
    Figure(BACK, "measured 6.9x, 4.4x and 0.83x for the same rows", (H,)),
    # docs/backends.md "Planning a GPU server": the null rows, and the plan from them and
    # issue #41's H100 figures (which results/ceiling.md quotes beside its plan)
    Figure(BACK, "(load average 9.4)", (CEIL,)),
    Figure(
        BACK,
        "TorchServe 1.55 ms (1 image) and 13.34 ms (8 images) of worker CPU, Triton 0.51 and 6.10",
        (CEIL,),
    ),
    Figure(BACK, "Carrying the H100's 10,167 img/s (raw forward, f16 channels_last, b64)", (CEIL,)),
    Figure(
        BACK, "8-image v2 requests: 1,271 requests/s, 17 workers and 4.8 frontend cores", (CEIL,)
    ),
    Figure(BACK, "1-image requests: 16 workers and 10.1 frontend cores", (CEIL,)),
    Figure(BACK, "more than the issue's 16-core H100 host", (CEIL,)),
    Figure(
        BACK,
        "4,794 img/s (8 workers and 2.3 frontend cores at 8 images per request)",
        (CEIL,),
    ),
    Figure(
        BACK,
        "6 instances and 3.5 frontend cores; 8-image v2 JSON requests: 8 instances and 4.8 "
        "frontend cores",
        (CEIL,),
    ),
    Figure(BACK, "12 MP photos (295 img/s on the GPU) need 1 worker", (CEIL,)),
    Figure(BACK, "Triton with 6-8 instances, or TorchServe with 8 workers", (CEIL,)),
    Figure(
        BACK,
        "(measured by worker pid 21465 in 3.7 s; f32 22.2/338 ms at batch 1/16; bf16 "
        "12.2/172.7 ms at batch 1/16; int8+f32 8.3/93.3 ms at batch 1/16; int8+bf16 "
        "8.8/87.2 ms at batch 1/16): kept from the last start on this host: within 10% "
        "of the fastest, int8+f32; vs f32: embedding cosine min 0.9998, top-1 agreement "
        "1.00",
        (BENCH,),
    ),
    # docs/configuration.md
    Figure(CONF, "one-client p50 was 3-4 ms lower without it at equal throughput", (H,)),
    Figure(CONF, "(0.6 s per batch of 16)", (H,)),
    Figure(CONF, "batches of about 9 while", (H,)),
    Figure(
        CONF,
        "10 ms filled the batches (15.9 of 16) and served 1.2x the images per second at "
        "16 clients (63.8 -> 76.6 img/s;",
        (H,),
    ),
    # docs/api.md
    Figure(
        API,
        "the embedding stays within 2% relative error (cosine ≥ 0.9995, same top class)",
        ("tests/test_images.py",),
    ),
    Figure(
        API,
        "runs at 35–45 MP/s per thread on this project's 2-core machine, so a full budget "
        "is about 3 s here",
        (H,),
    ),
    Figure(API, "autograd keeps about 180 MiB per row", (H,)),
    # docs/explanations.md
    Figure(EXPL, "about 150-260 KB of PNG", (H,)),
    Figure(EXPL, "TorchServe's stock handler answers 4.4 MB of raw IG floats", (H,)),
    Figure(EXPL, "(2,114 ms against GradCAM's 41 in the benchmark's run)", (BENCH,)),
    Figure(EXPL, "each `.mar` grows from about 95 MB to 189 MB", (H,)),
    # docs/operations.md
    Figure(
        OPS,
        "3,000 photos was 1.22x its idle value on TorchServe and the job kept 0.95x of its "
        "solo speed (the issue's goals: 1.5x, 0.85x); on Triton 1.64x and 1.01x, between "
        "1.47x and 1.64x over three runs",
        (TRAFFIC,),
    ),
    Figure(OPS, "(6 s on a quiet 2-core machine, 20-37 s on a loaded one)", (H,)),
    Figure(OPS, "under a second over 100,000 vectors", (COLL,)),
    Figure(OPS, "The frontend's RSS grows to about 4.4 GiB in such a burst and keeps it", (H,)),
    Figure(OPS, "for frontend plus workers, 7.5 GiB", (H,)),
    Figure(OPS, "0.67 GiB compiled, 1.14 GiB after the first pass through batch 16", (H,)),
    Figure(OPS, "took a worker from 1.3 to 2.5 GiB; after it, 1.08 to 1.10 GiB", (H,)),
    Figure(OPS, "left the worker at 1.03 GiB throughout", (H,)),
    Figure(
        OPS,
        "5 minutes of every traffic class at once, the tagger's worker at 1,230 MiB "
        "after the first minute and 1,210 MiB at the end (peak 1,267), the embedding "
        "worker flat at 1,030 MiB, the frontend at 284-287 MiB",
        (SOAK,),
    ),
    Figure(
        OPS,
        "5 minutes, the tagger's stub at 1,077 MiB after the first minute and 1,080 MiB at "
        "the end, the embedding's at 959-960 MiB, tritonserver at 45-47 MiB",
        (SOAK_TRITON,),
    ),
    Figure(
        OPS,
        "Before the fix, 8 minutes of the same took the tagger's worker from 1,705 to "
        "1,997 MiB (peak 2,153)",
        (H,),
    ),
    # docs/testing.md
    Figure(TEST, "15 minutes of tests after about 6.5 minutes of set-up", (H,)),
    Figure(TEST, "21.6 minutes in all", (H,)),
    Figure(TEST, "(`python -m bench --quick`, about 3 minutes with its Triton row;", (H,)),
    Figure(
        TEST,
        "relative error ≤ 1e-4 at f32; the served precision sets the bound: bf16 2%, int8 6%",
        ("tests/reference.py",),
    ),
)


@pytest.mark.parametrize("doc", NUMBER_DOCS)
def test_measured_figures_are_traced(doc):
    """Each measured figure a doc quotes is in the report or history entry it comes from."""
    problems = [
        p
        for figure in FIGURES
        if figure.doc == doc
        for p in [figure_problem(figure, doc_text(doc))]
        if p
    ]
    assert not problems, _problems_message(problems)


def test_number_tables_name_checked_docs():
    assert {f.doc for f in (*FACTS, *FIGURES)} <= set(NUMBER_DOCS)
