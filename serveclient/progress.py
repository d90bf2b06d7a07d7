"""Progress on stderr, drawn by tqdm: a collection job's bar on a terminal (done/total, img/s,
ETA, failures), else a plain log line every ``every_s`` seconds (for CI logs and pods); and the
elapsed time of one slow call (registration, scaling) while a terminal watches."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def waiting(
    label: str, work: Callable[[], T], *, stream: IO[str] | None = None, every_s: float = 0.5
) -> T:
    """``work()``'s result, with ``label`` and the seconds elapsed redrawn every ``every_s``
    while it runs (only when ``stream``, stderr by default, is a terminal)."""
    stream = stream or sys.stderr
    stop = threading.Event()
    with tqdm(
        desc=label, bar_format="{desc} waiting {elapsed}", file=stream, disable=not stream.isatty()
    ) as bar:

        def tick() -> None:
            while not stop.wait(every_s):
                bar.refresh()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            return work()
        finally:
            stop.set()
            ticker.join()


class JobProgress:
    """Counts files done, failed and skipped; ``total`` may arrive later (``set_total``), from
    a walk running beside the job."""

    def __init__(
        self,
        label: str,
        *,
        stream: IO[str] | None = None,
        every_s: float = 10.0,
        bar: bool | None = None,
    ) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.total: int | None = None
        self.done = self.failed = self.skipped = 0
        self.start = time.monotonic()
        self._last_log = self.start
        self._lock = threading.Lock()
        use_bar = self.stream.isatty() if bar is None else bar
        self._bar = None
        if use_bar:
            self._bar = tqdm(
                desc=label, unit="img", file=self.stream, dynamic_ncols=True, smoothing=0.1
            )

    def set_total(self, total: int) -> None:
        with self._lock:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
                self._bar.refresh()

    def update(self, done: int = 0, failed: int = 0, skipped: int = 0) -> None:
        with self._lock:
            self.done += done
            self.failed += failed
            self.skipped += skipped
            if self._bar is not None:
                self._bar.update(done + failed + skipped)
                self._bar.set_postfix(failed=self.failed, skipped=self.skipped, refresh=False)
            elif time.monotonic() - self._last_log >= self.every_s:
                self._log()

    def rate(self) -> float:
        """Files answered (done or failed) per second since the start."""
        elapsed = time.monotonic() - self.start
        return (self.done + self.failed) / elapsed if elapsed > 0 else 0.0

    def _log(self) -> None:
        self._last_log = time.monotonic()
        seen = self.done + self.failed + self.skipped
        rate = self.rate()
        total = "?" if self.total is None else str(self.total)
        eta = ""
        if self.total is not None and rate > 0:
            eta = f", ETA {max(0.0, (self.total - seen) / rate):.0f} s"
        self.stream.write(
            f"{self.label}: {seen}/{total} ({self.done} done, {self.failed} "
            f"failed, {self.skipped} skipped), {rate:.1f} img/s{eta}\n"
        )
        self.stream.flush()

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            else:
                self._log()
