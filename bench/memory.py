"""What a server's processes use: ``PeakRss``, the peak resident memory of a running server
sampled in a background thread; ``rss``, one process's; ``Cpu``, CPU seconds over a run.

The server is whatever ``LocalTorchServe.processes`` lists: the Java frontend plus every
descendant (the Python workers). Summed RSS counts shared pages once per process, so it is an
upper bound of what the server really holds; it is the same measure for every server compared.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psutil


def rss(proc: psutil.Process) -> int:
    try:
        return proc.memory_info().rss
    except psutil.Error:  # a worker may exit between listing and sampling
        return 0


class PeakRss:
    """``with PeakRss(server.processes, watch={"tagger worker": pid}) as peak: ...`` samples every
    ``interval_s`` until the block ends; then ``peak.total_mb`` is the peak summed RSS of the
    whole server and ``peak.watched_mb[name]`` the peak RSS of each watched process."""

    def __init__(
        self,
        processes: Callable[[], list[psutil.Process]],
        watch: dict[str, int] | None = None,
        interval_s: float = 0.2,
    ) -> None:
        self.processes = processes
        self.watch = dict(watch or {})
        self.interval_s = interval_s
        self.total_mb = 0.0
        self.watched_mb = dict.fromkeys(self.watch, 0.0)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def sample(self) -> None:
        """Take one sample now (also called once at start and once at the end)."""
        by_pid = {p.pid: rss(p) for p in self.processes()}
        self.total_mb = max(self.total_mb, sum(by_pid.values()) / 2**20)
        for name, pid in self.watch.items():
            self.watched_mb[name] = max(self.watched_mb[name], by_pid.get(pid, 0) / 2**20)
        self.samples += 1

    def _run(self) -> None:
        # Event.wait both paces the loop and ends it promptly when the block exits.
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakRss:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()


class Cpu:
    """CPU seconds (user + system) of a set of processes, summed over those alive at both
    reads: ``start``, then ``spent``."""

    def __init__(self, processes: Callable[[], list[psutil.Process]]) -> None:
        self.processes = processes
        self.before: dict[int, float] = {}

    def _read(self) -> dict[int, float]:
        seconds = {}
        for proc in self.processes():
            try:
                times = proc.cpu_times()
            except psutil.Error:  # it exited: its time is lost, not counted twice
                continue
            seconds[proc.pid] = times.user + times.system
        return seconds

    def start(self) -> Cpu:
        self.before = self._read()
        return self

    def spent(self) -> float:
        after = self._read()
        return sum(after[p] - self.before[p] for p in after.keys() & self.before.keys())
