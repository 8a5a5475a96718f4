"""The per-protocol worker pool: lanes, dropped stale calls, a shutdown that
never waits (plain threads and events stand in for BMC calls)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError

import pytest

from controller.bmc.loop_share import READER_SLOW_ABOVE, LoopShare
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


class LateLoop:
    """Finished calls whose results the loop takes up late, window by window
    (a clock of its own: the pool judges each window when it is over)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.now = 1000.0

    def windows(self, seconds: float, count: int, *, cores: float = 1.0) -> None:
        """``count`` windows of five results, each taken up ``seconds`` late,
        while the pool's threads used ``cores`` of CPU."""
        window = self.pool.share.window
        for _ in range(count):
            for _ in range(5):
                self.pool.observe_lateness(seconds, now=self.now)
            self.pool.share.spent(cores * window)
            self.now += window
        self.pool.observe_lateness(seconds, now=self.now)  # judges the last window


@pytest.mark.timeout(10)
def test_a_late_loop_holds_threads_back_and_an_on_time_one_gives_them_back() -> None:
    pool = WorkerPool("t", 32, untrusted_share=0.5)
    loop = LateLoop(pool)
    loop.windows(0.1, 2, cores=0.1)  # late, but the threads barely ran: not their doing
    assert pool.stats().limit == 32
    loop.windows(0.03, 1)  # 30 ms late while the threads held a core: halved
    assert pool.stats().limit == 16
    loop.windows(0.1, 1)  # 100 ms late: cut by five
    assert pool.stats().limit == 3
    loop.windows(0.5, 3)
    assert pool.stats().limit == 2  # never below the floor
    loop.windows(0.01, 3)  # between the thresholds: kept
    assert pool.stats().limit == 2
    loop.windows(0.001, 6)  # on time again: +1 a window at this size
    assert pool.stats().limit == 8
    release = threading.Event()
    calls = [pool.submit_call(lambda: release.wait(10), trusted=True) for _ in range(12)]
    untrusted = [pool.submit_call(lambda: release.wait(10), trusted=False) for _ in range(4)]
    time.sleep(0.3)
    stats = pool.stats()
    assert stats.running == 8  # 16 asked, 8 may run
    assert stats.queued_trusted + stats.queued_untrusted == 8
    loop.windows(0.001, 1)  # the loop keeps up again: the limit grows
    time.sleep(0.3)
    assert pool.stats().limit == 9
    assert pool.stats().running == 9  # a waiting call was woken for the new slot
    loop.windows(0.001, 30)
    assert pool.stats().limit == 32  # back to every thread, not beyond
    time.sleep(0.3)
    assert pool.stats().running == 16
    release.set()
    assert all(f.result(timeout=5) for f in calls + untrusted)
    pool.shutdown()


@pytest.mark.timeout(10)
def test_a_late_loop_keeps_the_untrusted_lane_to_its_share_of_the_limit() -> None:
    pool = WorkerPool("t", 32, untrusted_share=0.5)
    loop = LateLoop(pool)
    loop.windows(0.1, 2)
    loop.windows(0.001, 6)  # 8 threads may run; unanswering BMCs get 4
    release = threading.Event()
    stuck = [pool.submit_call(lambda: release.wait(10), trusted=False) for _ in range(8)]
    time.sleep(0.3)
    assert pool.stats().untrusted_running == 4
    assert pool.submit_call(lambda: "fast", trusted=True).result(timeout=2) == "fast"
    release.set()
    assert all(f.result(timeout=5) for f in stuck)
    pool.shutdown()


@pytest.mark.timeout(10)
def test_a_reader_process_pool_bears_a_later_loop_before_holding_threads_back() -> None:
    """A BMC reader's loop only hands calls out and results back: 100 ms late
    with busy threads keeps every thread there (the controller's own pool
    would cut to a fifth), 300 ms cuts, and under a quarter of the bound the
    threads come back."""
    controller = WorkerPool("c", 256)
    reader = WorkerPool("r", 256, slow_above=READER_SLOW_ABOVE)
    LateLoop(controller).windows(0.1, 1)
    loop = LateLoop(reader)
    loop.windows(0.1, 1)
    assert controller.stats().limit == 51
    assert reader.stats().limit == 256
    loop.windows(0.3, 1)
    assert reader.stats().limit == 128
    loop.windows(0.1, 3)  # between the bounds: kept
    assert reader.stats().limit == 128
    loop.windows(0.05, 1)
    assert reader.stats().limit == 144
    with pytest.raises(ValueError, match="fast_below"):
        LoopShare(8, slow_above=0.1, fast_below=0.2)
    controller.shutdown()
    reader.shutdown()
