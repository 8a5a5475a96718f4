"""A helper process's CPU read from ``/proc`` (``controller.link.cpu_seconds``),
what the report pace compares the relay workers by."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from controller.link import cpu_seconds


@pytest.mark.timeout(30)
def test_a_busy_processs_cpu_grows_and_a_gone_one_reads_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first = cpu_seconds(child.pid)
        assert first is not None and first >= 0
        time.sleep(0.6)
        later = cpu_seconds(child.pid)
        assert later is not None and later - first >= 0.2  # it spins on a core of its own
    finally:
        child.kill()
        child.wait()
    assert cpu_seconds(child.pid) is None  # reaped: no /proc entry


@pytest.mark.timeout(10)
def test_this_processs_own_cpu_is_read_as_the_interpreter_counts_it() -> None:
    mine = cpu_seconds(os.getpid())
    assert mine is not None
    assert abs(mine - time.process_time()) < 0.5  # clock ticks apart, not seconds
