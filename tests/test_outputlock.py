"""The per-output lock of tsctl embed / index build / head train (serveclient/outputlock.py):
one holder at a time, a clear refusal naming the holder, waiting on request, and a holder
killed with SIGKILL never leaves the output locked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from serveclient.outputlock import OutputBusy, hold, lock_path

HOLDER = textwrap.dedent(
    """
    import sys, time
    from serveclient.outputlock import hold
    with hold(sys.argv[1], what="tsctl embed photos"):
        print("held", flush=True)
        time.sleep(600)
    """
)


def _holder(out):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_the_lock_is_beside_the_output_never_inside(tmp_path):
    assert lock_path(tmp_path / "vindex") == tmp_path / "vindex.lock"
    assert lock_path(tmp_path / "pictures.parquet") == tmp_path / "pictures.parquet.lock"


def test_a_second_run_is_refused_naming_the_holder_and_the_flag(tmp_path):
    out = tmp_path / "pictures.parquet"
    proc = _holder(out)
    try:
        with pytest.raises(OutputBusy) as err, hold(out):
            pass
        text = str(err.value)
        assert "tsctl embed photos" in text and f"pid {proc.pid}" in text
        assert "--wait" in text and err.value.exit_code == 8
    finally:
        proc.kill()
        proc.wait()


def test_a_holder_killed_with_sigkill_releases_it(tmp_path):
    out = tmp_path / "vindex"
    proc = _holder(out)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with hold(out) as path:  # not refused: the kernel dropped the dead holder's lock
        assert path.exists()


def test_wait_blocks_until_the_holder_lets_go(tmp_path):
    out = tmp_path / "head"
    order: list[str] = []
    with hold(out):
        waiter = threading.Thread(target=lambda: _wait_then(out, order))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and order == []  # still waiting while we hold it
        order.append("released")
    waiter.join(10)
    assert order == ["released", "acquired"]


def _wait_then(out, order):
    with hold(out, wait=True):
        order.append("acquired")
