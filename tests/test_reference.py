"""The reference tables in docs/ are what ``python -m buildsteps.reference`` writes from the
code (settings, error statuses, metrics), and each declared setting range is the one enforced."""

from __future__ import annotations

import dataclasses
from http import HTTPStatus

import pytest

from buildsteps import reference
from servecore import errors
from servecore.config import ConfigError, ExplainConfig, HandlerConfig
from servecore.edges import bodies


def test_the_committed_docs_are_what_the_step_writes():
    stale = reference.stale()
    assert not stale, f"{stale} differ from the code: run `{reference.COMMAND}` and commit"


def test_a_changed_source_makes_its_doc_stale(monkeypatch):
    """The check can fail: a status changed in ``bodies.STATUS`` alone leaves docs/api.md
    stale, and the step rewrites only its block."""
    monkeypatch.setitem(bodies.STATUS, errors.PayloadTooLarge, HTTPStatus.BAD_REQUEST)
    assert reference.stale() == ["docs/api.md"]
    text = "prose before\n" + reference.BEGIN + "\nold table\n" + reference.END + "\nprose after\n"
    new = reference.render(text, reference.status_table())
    assert new.startswith("prose before\n") and new.endswith("\nprose after\n")
    assert "| `PayloadTooLarge` | 400 Bad Request |" in new and "old table" not in new
    with pytest.raises(ValueError, match="must hold one"):
        reference.render("no markers", "table")


def test_the_tables_name_every_setting_kind_and_metric():
    """What a reader looks up is there, in the form the docs write it."""
    settings = reference.settings_table()
    assert "| `max_image_bytes` | 30 MiB | 1..2 GiB |" in settings
    assert "| `explain.n_steps` | 32 | 1..`max_n_steps` |" in settings
    assert "| `device` | `auto` | `auto`, `cpu`, `cuda` |" in settings
    for cls, prefix in ((HandlerConfig, ""), (ExplainConfig, "explain.")):
        for f in dataclasses.fields(cls):
            assert f"| `{prefix}{f.name}" in settings, f.name
    statuses = reference.status_table()
    assert "| `DeadlineExceeded` | 504 Gateway Timeout | 503 Service Unavailable" in statuses
    assert "Carries `Retry-After: 1`." in statuses
    assert "`ClientError`" not in statuses  # a base class, never a body's type
    from servecore.metrics import METRICS

    for metric in METRICS:
        assert f"| `{metric.name}` | {metric.kind.value} |" in reference.metrics_table()


@pytest.mark.parametrize(
    ("prefix", "field"),
    [
        (prefix, f)
        for prefix, cls in (("", HandlerConfig), ("explain.", ExplainConfig))
        for f in dataclasses.fields(cls)
        if f.metadata.get("range")
    ],
    ids=lambda x: getattr(x, "name", x),
)
def test_each_declared_range_is_the_one_enforced(prefix, field):
    """One past the declared bounds is refused with the bounds in the message; the bounds
    themselves pass the range check (another rule may still refuse them)."""
    defaults = HandlerConfig() if not prefix else ExplainConfig()
    low, high = (getattr(defaults, b) if isinstance(b, str) else b for b in field.metadata["range"])
    for value in (low - 1, high + 1):
        section = {field.name: value}
        with pytest.raises(ConfigError) as caught:
            HandlerConfig.from_mapping({"explain": section} if prefix else section)
        assert f"handler.{prefix}{field.name} must be in {low}..{high}, got {value}" in str(
            caught.value
        )
    for value in (low, high):
        section = {field.name: value}
        try:
            HandlerConfig.from_mapping({"explain": section} if prefix else section)
        except ConfigError as error:
            assert f"{field.name} must be in" not in str(error)
