"""The per-protocol worker pool: lanes, dropped stale calls, a shutdown that
never waits (plain threads and events stand in for BMC calls)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError

import pytest

from controller.bmc.workers import WorkerPool, WorkerPoolClosed


def blocker() -> tuple[threading.Event, threading.Event, Callable[[], str]]:
    """A call that reports it started and then waits to be released."""
    started, release = threading.Event(), threading.Event()

    def call() -> str:
        started.set()
        release.wait(10)
        return "done"

    return started, release, call


@pytest.mark.timeout(10)
def test_untrusted_calls_hold_at_most_their_share_and_trusted_ones_go_first() -> None:
    pool = WorkerPool("t", 4, untrusted_share=0.5)
    release = threading.Event()
    stuck = [pool.submit_call(lambda: release.wait(10), trusted=False) for _ in range(6)]
    time.sleep(0.2)
    stats = pool.stats()
    assert (stats.untrusted_running, stats.queued_untrusted) == (2, 4)
    answered = pool.submit_call(lambda: "fast", trusted=True)
    assert answered.result(timeout=1) == "fast"  # two threads were left for it
    release.set()
    assert all(f.result(timeout=5) for f in stuck)
    pool.shutdown()


@pytest.mark.timeout(10)
def test_a_call_cancelled_while_queued_never_runs() -> None:
    pool = WorkerPool("t", 1)
    started, release, call = blocker()
    first = pool.submit(call)
    assert started.wait(2)
    ran: list[str] = []
    late = pool.submit(lambda: ran.append("late"))
    assert late.cancel()  # its caller's deadline passed
    release.set()
    assert first.result(timeout=2) == "done"
    pool.submit(lambda: None).result(timeout=2)  # the thread went past it
    assert ran == []
    pool.shutdown()


@pytest.mark.timeout(10)
def test_shutdown_returns_at_once_and_releases_every_caller() -> None:
    pool = WorkerPool("t", 1)
    started, release, call = blocker()
    running = pool.submit(call)
    assert started.wait(2)
    queued = pool.submit(lambda: "never")
    began = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - began < 0.1
    with pytest.raises(WorkerPoolClosed):
        running.result(timeout=0)
    with pytest.raises(CancelledError):
        queued.result(timeout=0)
    with pytest.raises(WorkerPoolClosed):
        pool.submit(lambda: None)
    threads = [t for t in threading.enumerate() if t.name.startswith("kiln-bmc-t-")]
    assert threads and all(t.daemon for t in threads)  # never joined at exit
    release.set()


def test_threads_start_only_as_calls_need_them() -> None:
    pool = WorkerPool("t", 8)
    for _ in range(3):
        pool.submit(lambda: None).result(timeout=2)
    assert pool.stats().threads == 1
    pool.shutdown()
