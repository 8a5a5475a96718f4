"""A helper process's CPU read from ``/proc`` (``controller.link.cpu_seconds``,
and ``cpu_demand``: its time on a CPU and waiting for one), what the report
pace compares the controller and its relay workers by."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from controller.link import cpu_demand, cpu_seconds, own_cpu_demand


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


def _spinner_on_cpu0() -> subprocess.Popen[bytes]:
    code = "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.mark.timeout(30)
def test_a_process_waiting_for_a_cpu_asks_for_more_than_it_gets() -> None:
    """Two spinners on one CPU: each gets about half of it, and its demand
    (``cpu_demand``: time on the CPU and runnable waiting for it) is about
    all of it, the wait its other half."""
    spinners = [_spinner_on_cpu0(), _spinner_on_cpu0()]
    try:
        time.sleep(0.5)  # both pinned and spinning
        used0 = [cpu_seconds(p.pid) for p in spinners]
        asked0 = [cpu_demand(p.pid) for p in spinners]
        t0 = time.monotonic()
        time.sleep(2.0)
        wall = time.monotonic() - t0
        used = [cpu_seconds(p.pid) for p in spinners]
        asked = [cpu_demand(p.pid) for p in spinners]
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    for u0, a0, u1, a1 in zip(used0, asked0, used, asked, strict=True):
        assert None not in (u0, a0, u1, a1)
        assert u0 is not None and a0 is not None and u1 is not None and a1 is not None
        share, demand = (u1 - u0) / wall, (a1 - a0) / wall
        assert share < 0.7, share  # half a CPU each, give or take
        assert demand > 0.85, demand  # the whole CPU asked for
        assert demand - share > 0.25
    assert cpu_demand(spinners[0].pid) is None  # reaped: no /proc entry


@pytest.mark.timeout(10)
def test_this_processs_own_demand_is_at_least_what_it_used() -> None:
    spent = time.process_time()
    asked = own_cpu_demand()
    assert asked >= spent - 0.05  # the same CPU, read from the kernel, and any wait
