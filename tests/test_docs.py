"""The docs stay honest: what they link, run and name exists. Fast, no server.

Checked in README.md, docs/*.md, bench/README.md, kserve/README.md and results/history.md:
every relative Markdown link points to an existing file (and heading, for ``#anchor``); every
``make TARGET`` is a target of the Makefile; every ``tsctl COMMAND`` is a subcommand of
serveclient.cli's parser; every ``python -m MODULE`` of this repository resolves to a module.
In the docs this renovation wrote (all but kserve/README.md, whose paths are relative to
kserve/ and name upstream files), every repository path in backticks or a code block exists,
except the generated ones listed in GENERATED, and every test named as ``file.py::test`` is a
function of that file in tests/; the README's layout map names only what exists;
and the README stays a front door (at most README_MAX_LINES lines).

Numbers, in NUMBER_DOCS: the settings, status and metrics tables are generated from the code
(buildsteps/reference.py; tests/test_reference.py holds them current), and a setting prose
repeats as "`name` (value" must state its value; where a paragraph, list item or table row
links a report (results/, or a test for its bound), its figures from the link on are in that
report; the README's results table names for each row the date and the commit of its report,
and its figures are in that report.
"""

from __future__ import annotations

import argparse
import fnmatch
import inspect
import re
import shlex
import subprocess
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
    *("build/", "logs/", ".venv/", "model-store/*.mar", "key_file.json", "results/*.png"),
    *("config/config.properties", "kserve/config.properties", "kserve/runtime/config.properties"),
    *("results/*.json", "*.egg-info/"),
)
# File names the path checks treat as files (a dot alone, as in "e.g.", is not an extension).
EXTENSIONS = (
    "py|sh|yaml|yml|md|json|properties|toml|ini|txt|mar|png|jpg|jpeg|npy|pt|onnx|xml|bin|gz|cfg"
)
SHELL_FENCES = ("bash", "sh", "shell", "console")
PATHLIKE = re.compile(rf"^[A-Za-z_.][\w.\-/*]*(?:/|\.(?:{EXTENSIONS}))$")


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


def arguments(command: str, text: str, valued: set[str]) -> list[list[str]]:
    """For each ``command ...`` in ``text``, its words that are no option, no value of an
    option in ``valued`` and no VAR=value."""
    found = []
    for m in re.finditer(rf"(?:^|[\s;&|(/]){command}((?:[ \t]+[^\s;&|#)]+)*)", text):
        words, skip = [], False
        try:  # as the shell reads it: VAR="a b c" is one word
            read = shlex.split(m.group(1))
        except ValueError:  # an unbalanced quote, a span cut mid-command
            read = m.group(1).split()
        for word in read:
            if skip:
                skip = False
            elif word in valued:
                skip = True
            elif not (word.startswith("-") or "=" in word or word in ("...", "…")):
                words.append(word)
        found.append(words)
    return found


def make_goals(text: str) -> list[str]:
    return [w for words in arguments("make", text, {"-o", "-C", "-f", "-W", "-j"}) for w in words]


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
    """tsctl's own argparse parser, from the function of serveclient.cli that builds it."""
    from serveclient import cli

    for _name, fn in inspect.getmembers(cli, inspect.isfunction):
        if (
            fn.__module__ == cli.__name__
            and not any(p.default is p.empty for p in inspect.signature(fn).parameters.values())
            and inspect.signature(fn).return_annotation
            in (argparse.ArgumentParser, "argparse.ArgumentParser")
        ):
            return fn()
    raise AssertionError("serveclient.cli has no function returning its ArgumentParser")


def tsctl_commands() -> tuple[set[str], set[str]]:
    """(subcommands, global options that take a value)."""
    p = tsctl_parser()
    subs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    valued = {s for a in p._actions if a.option_strings and a.nargs != 0 for s in a.option_strings}
    return set(subs.choices), valued


def tsctl_subcommands_named(text: str) -> list[str]:
    _, valued = tsctl_commands()
    return [
        words[0]
        for words in arguments("tsctl", text, valued)
        if words and re.fullmatch(r"[a-z][a-z-]*", words[0])
    ]


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


NAMED_TEST = re.compile(r"^(?:tests/)?(test_\w+\.py)?::(test_\w+)$")


def named_test_problems(doc: Doc) -> list[str]:
    """Each test a doc names (`test_x.py::test_y`, or `::test_y` of the file named last) is a
    function of that file in tests/."""
    problems, file = [], None
    for line in doc.prose:
        file = None if line.startswith("#") else file
        for span in (m.group(2) for m in CODE_SPAN.finditer(line)):
            m = NAMED_TEST.match(span)
            if not m:
                continue
            file = m.group(1) or file
            source = ROOT / "tests" / (file or "?")
            if not source.is_file() or not re.search(
                rf"^\s*(?:async )?def {m.group(2)}\(", source.read_text(), re.M
            ):
                problems.append(f"{doc.name}: `{span}`: no such test in tests/{file}")
    return problems


@pytest.mark.parametrize("path", _own_docs(), ids=rel)
def test_named_tests_exist(path):
    problems = named_test_problems(parse(path))
    assert not problems, _problems_message(problems)


def test_named_test_check_catches_breakage(tmp_path):
    bad = tmp_path / "bad.md"
    bad.write_text("`test_docs.py::test_named_tests_exist`, `::test_no_such`, `test_x.py::test_y`")
    assert [p.split("`")[1] for p in named_test_problems(parse(bad))] == [
        "::test_no_such",
        "test_x.py::test_y",
    ]


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


# ---- settings stated in prose ----------------------------------------------------------------
#
# The settings, statuses and metrics tables are generated (buildsteps/reference.py; their test:
# tests/test_reference.py). Prose that repeats a setting as "`name` (value" states its value.

NUMBER_DOCS = (
    "README.md",
    "docs/api.md",
    "docs/backends.md",
    "docs/configuration.md",
    "docs/explanations.md",
    "docs/guarantees.md",
    "docs/operations.md",
    "docs/testing.md",
)
STATED = re.compile(r"`((?:explain\.)?[a-z][a-z_]+)` \(([^)]*)")


def setting_values() -> dict[str, int]:
    """Every handler setting's default ("explain.x" for the nested section), and each key of
    config/server-base.properties that is a number."""
    from servecore.config import ExplainConfig, HandlerConfig

    values = {
        f"{p}{k}": v
        for p, c in (("", HandlerConfig), ("explain.", ExplainConfig))
        for k, v in vars(c()).items()
        if isinstance(v, int)
    }
    for line in (ROOT / "config" / "server-base.properties").read_text().splitlines():
        name, _, value = line.partition("=")
        if value.strip().isdigit():
            values[name.strip()] = int(value)
    return values


def written(n: int) -> set[str]:
    """The ways the docs write a number: as is, grouped (40 000 000), in MiB, in MP."""
    forms = {str(n), f"{n:,}".replace(",", " "), f"{n / 1e6:g} MP"}
    return forms | ({f"{n >> 20} MiB"} if n and n % (1 << 20) == 0 else set())


def setting_problems(doc: Doc, values: dict[str, int] | None = None) -> list[str]:
    values = setting_values() if values is None else values
    problems = []
    for m in STATED.finditer(flat("\n".join(doc.prose))):
        name, said = m.groups()
        if name in values and said[:1].isdigit():
            number = re.match(r"[\d ,.]*\d(?: (?:MiB|MP))?", said).group(0)
            if number not in written(values[name]):
                problems.append(f"{doc.name}: `{name}` ({number}...: its value is {values[name]}")
    return problems


@pytest.mark.parametrize("doc", NUMBER_DOCS)
def test_settings_stated_in_prose_are_their_values(doc):
    problems = setting_problems(parse(ROOT / doc))
    assert not problems, _problems_message(problems)


def test_setting_check_catches_breakage(tmp_path):
    bad = tmp_path / "bad.md"
    bad.write_text("`max_batch_images` (63) and `job_queue_size` (16, fine) `topk` (1..1000)\n")
    assert setting_problems(parse(bad), {"max_batch_images": 64, "job_queue_size": 16}) == [
        "bad.md: `max_batch_images` (63...: its value is 64"
    ]


# ---- measured figures: each traced to the report it comes from -------------------------------


def flat(text: str) -> str:
    """Text with every run of whitespace as one space (docs wrap lines anywhere)."""
    return " ".join(text.split())


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
    phrase = "p50 0.59x, 5xx, int8+bf16, 0.13-0.16 s, 22.2/338, 2%"
    assert figures(phrase) == ["0.59", "0.13", "0.16", "22.2", "338", "2%"]
    assert traced("2%", ("0.02",)) and not traced("3%", ("3", "0.02"))
    # a phrase's figures come from one block: one run's row, not numbers scattered over a file
    h = ("results/history.md",)
    assert untraced("74.4 img/s, batches already full at 10", h) == []
    assert untraced("74.4 img/s, about 3 s of 12.4-19.8 s", h)
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


# The docs say where a measured figure comes from by linking its report (results/*.md, or the
# test whose bound they quote). In a paragraph or list item, each sentence from the first that
# links a report on has its figures in one block of a report the unit links (the sentences
# before it set the scene: settings, sizes); a table row, or a list item, that links none takes
# the links of the paragraph above its table or list. Dates, times, "#41", "1e-6", "top-1",
# HTTP statuses, "`setting` (value" and code spans (but an output quoted with 3+ figures) are
# names, not figures.
CITED = re.compile(r"^(results/[^/]+\.md|tests/\w+\.py)$")
NOT_FIGURES = re.compile(
    r"\]\([^)]*\)|\d{4}-\d\d-\d\d|\b\d\d:\d\d\b|#\d+|\d+(?:\.\d+)?e-?\d+|top-\d+"
    r"|\b[45]\d\d\b(?![.,]\d| ?(?:ms|s|MiB|MB|GiB|GB|KB|img|px|x)\b)"  # an HTTP status
)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)|(?<=[:;])\s+(?=[A-Z(*`])")
LIST_ITEM = re.compile(r"([-*+]|\d+\.)\s")


def cites(doc: Doc, text: str) -> tuple[str, ...]:
    """The reports ``text`` links (results/*.md, tests/*.py), as paths from the root."""
    found = [rel((doc.path.parent / t.partition("#")[0]).resolve()) for t in LINK.findall(text)]
    return tuple(dict.fromkeys(r for r in found if CITED.match(r)))


def units(doc: Doc) -> list[tuple[tuple[str, ...], list[str]]]:
    """(the reports it cites, the pieces to trace) of each paragraph and list item (its
    sentences) and each table row (the row) of the doc."""
    out: list[tuple[tuple[str, ...], list[str]]] = []
    lines: list[str] = []
    lead: tuple[str, ...] = ()  # what the paragraph above the current list or table cites
    for line in [*doc.prose, ""]:
        s = line.strip()
        if lines and (not s or s.startswith(("#", "|")) or LIST_ITEM.match(s)):
            text = " ".join(lines)
            item = LIST_ITEM.match(text)
            pieces = SENTENCE_END.split(text)
            first = next((i for i, p in enumerate(pieces) if cites(doc, p)), 0)
            out.append((cites(doc, text) or (lead if item else ()), pieces[first:]))
            lead = lead if item else cites(doc, text)
            lines.clear()
        if s.startswith("|"):
            out.append((cites(doc, s) or lead, [s]))
        elif s.startswith("#"):
            lead = ()
        elif s:
            lines.append(s)
    return out


def counted(piece: str) -> str:
    """``piece`` less what is no figure (the names in the comment above)."""
    piece = re.sub(r"` \([\d ,.]*\d", "` (", piece)
    piece = CODE_SPAN.sub(lambda m: m.group(2) if len(figures(m.group(2))) > 2 else " ", piece)
    return NOT_FIGURES.sub(" ", piece)


def figure_problems(doc: Doc) -> list[str]:
    """Each piece of a unit that cites reports has its figures in one block of one of them."""
    return [
        f"{doc.name}: {missing} of {piece!r} in none of {list(reports)}"
        for reports, pieces in units(doc)
        for piece in pieces
        if reports
        for missing in [untraced(counted(piece), reports)]
        if missing
    ]


@pytest.mark.parametrize("doc", NUMBER_DOCS)
def test_measured_figures_are_traced(doc):
    """Each figure a doc quotes beside a link to a report is in that report."""
    problems = figure_problems(parse(ROOT / doc))
    assert not problems, _problems_message(problems)


def test_figure_collection_catches_breakage():
    """A figure beside a report link that the report lacks is reported, in the linking
    sentence, a later one, a list item or a table row under it; what precedes the link, and
    settings, dates, issues and statuses, are not figures."""
    prose = [
        "Tuned by hand to 999 img/s. One run ([b](../results/benchmark.md), 2026-11-25 03:00,",
        "issue #41, `batchSize` 16, `max_batch_delay` (10)): small JPEG 130.4 img/s. Stock",
        "21.3, answering 503 when full, top-1 agreement; `auto -> f32 (in 3.7 s; 22.2/338 ms)`.",
        "",
        "- 130.4 img/s",
        "",
        "| what | figure |",
        "| small JPEG | 130.4 img/s, 6.1x |",
    ]
    doc = Doc(ROOT / "docs" / "fake.md", prose)
    assert figure_problems(doc) == []
    cases = (("130.4", "131.4", 3), ("21.3", "21.4", 1), ("338", "339", 1), ("6.1x", "6.3x", 1))
    for old, new, count in cases:
        problems = figure_problems(Doc(doc.path, [line.replace(old, new) for line in prose]))
        assert len(problems) == count, problems
        assert all(f"{new.rstrip('x')!r}]" in p for p in problems), problems
