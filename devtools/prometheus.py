"""A real Prometheus with config/monitoring's rules, scraping TorchServe's or Triton's
metrics ports (the core's series have the same names and labels on both).

Used by ``make monitor`` (in the foreground, against ``make serve``'s metrics port, or
``make serve-triton``'s with ``MONITOR_ENGINE=triton``) and by the integration tests
(``LocalPrometheus``: a free port, its own storage, always stopped):

    with LocalPrometheus(workdir, ["127.0.0.1:8082"], interval_s=1) as prom:
        prom.query("model_name:ts_inference_requests:rate1m")

    python -m devtools.prometheus [--engine torchserve|triton] [--target HOST:PORT ...]
                                  [--port 9090]                              # make monitor
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import requests
import yaml

from devtools.server import free_port, stop_processes, tails
from serveshared import ports

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "config" / "monitoring"
RULES = MONITORING / "rules.yml"
UNIT_TESTS = MONITORING / "tests.yml"
# The rules' and alerts' job label (the KServe PodMonitor relabels to it), whichever engine is
# scraped: the rules on the core's series then apply to Triton unchanged.
JOB = "torchserve"
# Each engine's metrics port on this host (make serve, make serve-triton).
DEFAULT_TARGETS = {
    "torchserve": f"{ports.HOST}:{ports.METRICS}",
    "triton": f"{ports.HOST}:{ports.TRITON_METRICS}",
}


def alert_rules(path: Path = RULES) -> dict[str, dict]:
    """``{alert name: rule}`` of every alerting rule in a rule file."""
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def recording_rules(path: Path = RULES) -> dict[str, str]:
    """``{recorded name: expr}`` of every recording rule (one name may be recorded by several
    rules with different labels: the last expr is kept)."""
    groups = yaml.safe_load(path.read_text())["groups"]
    return {
        rule["record"]: rule["expr"]
        for group in groups
        for rule in group["rules"]
        if "record" in rule
    }


# Keywords and aggregations a PromQL expression may use bare (without parentheses after them).
PROMQL_WORDS = frozenset(
    {"sum", "max", "min", "avg", "count", "rate", "by", "without", "ignoring", "on"}
    | {"group_left", "group_right", "and", "or", "unless", "offset", "bool"}
)


def series_names(expr: str) -> set[str]:
    """The series a PromQL expression reads: identifiers outside label matchers, grouping
    clauses and durations that are not functions or keywords."""
    bare = re.sub(r'\{[^}]*\}|\[[^\]]*\]|"[^"]*"', " ", expr)
    bare = re.sub(r"\b(by|without|ignoring|on)\s*\([^)]*\)", " ", bare)
    tokens = re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\()?", bare)
    return {name for name, call in tokens if not call and name not in PROMQL_WORDS}


def config(targets: list[str], interval_s: float, rules: Path = RULES) -> dict:
    """prometheus.yml: one job scraping ``targets`` (host:port of TorchServe or Triton metrics
    ports, both serve ``/metrics``) every ``interval_s``, and the rules evaluated as often."""
    every = f"{interval_s:g}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
    }


def command(config_file: Path, storage: Path, port: int) -> list[str]:
    """The ``prometheus`` command line: UI and API on 127.0.0.1 only."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError(
            "prometheus not found: `make setup` installs it (devtools/ensure_prometheus.sh)"
        )
    return [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={storage}",
        f"--web.listen-address={ports.HOST}:{port}",
        "--storage.tsdb.retention.time=1d",
    ]


class LocalPrometheus:
    """A ``prometheus`` process in ``workdir`` (its config, storage and log) on a free port;
    ``stop()`` always leaves nothing behind."""

    def __init__(self, workdir: Path, targets: list[str], *, interval_s: float = 1.0) -> None:
        self.workdir = Path(workdir)
        self.targets = targets
        self.interval_s = interval_s
        self.port = free_port()
        self.url = ports.url(self.port)
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> LocalPrometheus:
        """Start, then wait until Prometheus says it is ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config(self.targets, self.interval_s)))
        with open(self.workdir / "prometheus.log", "ab") as log:
            self._proc = subprocess.Popen(
                command(config_file, self.workdir / "data", self.port),
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"Prometheus on {self.url} not ready after {timeout:.0f}s\n"
            + tails(self.workdir, ("prometheus.log",))
        )

    def stop(self) -> None:
        """SIGTERM (Prometheus shuts down cleanly), then SIGKILL if it lingers."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            stop_processes({self._proc.pid}, grace=20)
            self._proc.wait(timeout=10)

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def value(self, expr: str) -> float | None:
        """The one value ``expr`` evaluates to now; None when it is not exactly one series."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def query(self, expr: str) -> list[dict]:
        """The instant vector ``expr`` evaluates to now:
        ``[{"metric": {...}, "value": [t, "v"]}]``."""
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        answer.raise_for_status()
        body = answer.json()
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {expr!r}: {body}")
        return body["data"]["result"]


def main(argv: list[str] | None = None) -> int:
    """``make monitor``: Prometheus in the foreground (Ctrl-C stops it), its config and storage
    under build/monitor/."""
    p = argparse.ArgumentParser(prog="make monitor", description=main.__doc__)
    p.add_argument(
        "--engine",
        choices=sorted(DEFAULT_TARGETS),
        default="torchserve",
        help="whose metrics port to scrape by default: make serve's "
        f"({DEFAULT_TARGETS['torchserve']}) or make serve-triton's "
        f"({DEFAULT_TARGETS['triton']})",
    )
    p.add_argument(
        "--target",
        action="append",
        help="a metrics port, host:port, instead of the engine's default; repeat for more",
    )
    p.add_argument("--port", type=int, default=9090, help="the UI and API port (9090)")
    p.add_argument("--interval", type=float, default=5.0, help="scrape every N seconds (5)")
    args = p.parse_args(argv)
    workdir = REPO / "build" / "monitor"
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    targets = args.target or [DEFAULT_TARGETS[args.engine]]
    config_file.write_text(yaml.safe_dump(config(targets, args.interval)))
    argv_ = command(config_file, workdir / "data", args.port)
    print(
        f"Prometheus on {ports.url(args.port)} scraping {', '.join(targets)} every "
        f"{args.interval:g}s with {RULES.relative_to(REPO)}; try "
        f"{ports.url(args.port)}/graph?g0.expr=model%3Aresnet50_requests%3Arate1m"
        " (Ctrl-C stops it)",
        file=sys.stderr,
        flush=True,
    )
    os.execv(argv_[0], argv_)  # Ctrl-C goes straight to Prometheus, which stops cleanly


if __name__ == "__main__":
    raise SystemExit(main())
