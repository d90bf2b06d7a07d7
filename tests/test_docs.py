"""The docs stay honest: what they link, run and name exists. Fast, no server.

Checked in README.md, docs/*.md, bench/README.md, kserve/README.md and results/history.md:
every relative Markdown link points to an existing file (and heading, for ``#anchor``); every
``make TARGET`` is a target of the Makefile; every ``tsctl COMMAND`` is a subcommand of
tsclient.cli's parser; every ``python -m MODULE`` of this repository resolves to a module.
In the docs this renovation wrote (all but kserve/README.md, whose paths are relative to
kserve/ and name upstream files), every repository path in backticks or a code block exists,
except the generated ones listed in GENERATED; the README's layout map names only what exists;
and the README stays a front door (at most README_MAX_LINES lines).
"""

from __future__ import annotations

import argparse
import fnmatch
import inspect
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

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

    for name, fn in inspect.getmembers(cli, inspect.isfunction):
        if fn.__module__ == cli.__name__ and not any(
            p.default is p.empty for p in inspect.signature(fn).parameters.values()
        ):
            if inspect.signature(fn).return_annotation in (
                argparse.ArgumentParser,
                "argparse.ArgumentParser",
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
