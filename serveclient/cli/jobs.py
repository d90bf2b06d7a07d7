"""What the job commands (``tag``, ``embed``, ``explain --html``, ``head train``) read from
their command line for ``serveclient.jobs``: the collection named (``collection_of``) and the
job's options (``job_options``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from serveclient.collection import STDIN, Collection
from serveclient.jobs import JobOptions


def collection_of(args: argparse.Namespace) -> Collection:
    """The sources given (files, folders, ``-``), and stdin's paths with ``--from-stdin``:
    read as the file system's names (bytes that are not UTF-8 kept, as ``os.fsdecode`` keeps
    them in argv), not in the locale's strict decoding."""
    sources = list(args.sources) + (
        [STDIN] if args.from_stdin and STDIN not in args.sources else []
    )
    if STDIN in sources and hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(encoding=sys.getfilesystemencoding(), errors="surrogateescape")
    return Collection(sources, stdin=sys.stdin)


def job_options(args: argparse.Namespace) -> JobOptions:
    """The ``JobOptions`` the command's parser holds; those it has no option for at their
    defaults."""
    given = vars(args)
    return JobOptions(
        **{f.name: given[f.name] for f in dataclasses.fields(JobOptions) if f.name in given}
    )
