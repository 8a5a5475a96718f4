"""The cyclic garbage collector, set for a long-running controller.

CPython's defaults (a young collection every 700 net allocations, the whole
heap traversed whenever a quarter of it is new) are made for short scripts.
A serving controller allocates fast (every RPC, report and unit of work
makes coroutines, protobufs and dicts that die by reference counting) over a
large long-lived heap (the fleet's records, views and caches). Measured with
``bench/fleet_scale.py`` at 32 allocation clients, the collector took 8.6 %
of the controller's CPU, and each full collection stopped the process for
about 110 ms, which is what a p99 sees.

``GcPauses`` times every collection (``kiln_gc_pause_seconds``) and logs
the long ones.

``settle`` is called once the controller serves: what exists then (the
loaded fleet, the modules, the servers) is moved out of the collector's
sight (``gc.freeze``), and young collections run every ``YOUNG`` net
allocations instead of 700. Cycles are still collected; they are just looked
for less often.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

YOUNG = 20_000  # net allocations between young collections (CPython: 700)
REFREEZE_AFTER = 0.25  # seconds: a whole-heap pause this long freezes its survivors
OLDER = 10  # young collections between middle ones, and middle between full (as CPython)


def settle() -> None:
    """Freeze the heap built so far and collect less often from now on."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, OLDER, OLDER)


class GcPauses:
    """Times the collector's pauses, each generation apart, while started.

    ``observe(generation, seconds)`` is called after every collection (the
    metrics' ``kiln_gc_pause_seconds``). A pause of ``slow`` seconds or more
    is logged, at most once a minute, with how many such pauses there were
    since the last line; one of ``very_slow`` or more (a whole-heap
    collection of a large fleet: rare, and what a p99 sees) always is.
    Registered in ``gc.callbacks`` between ``start`` and ``stop`` (a
    process may run several controllers: each has its own).

    ``refreeze_after`` (seconds; None: never, the default): after a
    whole-heap collection that long, what survived it is frozen too, on the
    event loop that called ``start``. A fleet that grew after ``settle``
    (nodes enrolled while serving) otherwise has every later whole-heap
    collection walk it again: 1.2 s at 25,000 nodes on a 2-core machine.
    Frozen objects are still freed by reference counting; only a cycle among
    them is never collected, as for ``settle``'s.
    """

    def __init__(
        self,
        observe: Callable[[int, float], None],
        *,
        slow: float = 0.1,
        very_slow: float = 0.5,
        refreeze_after: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        process: str = "the controller",
    ) -> None:
        self._observe = observe
        self._process = process
        self.refreeze_after = refreeze_after
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slow = slow
        self._very_slow = very_slow
        self._clock = clock
        self._began = 0.0
        self._slow_since_log = 0
        self._logged_at = float("-inf")

    def start(self) -> None:
        with contextlib.suppress(RuntimeError):  # no loop: nothing to refreeze on
            self._loop = asyncio.get_running_loop()
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = self._clock()
            return
        now = self._clock()
        seconds = now - self._began
        generation = info.get("generation", 0)
        self._observe(generation, seconds)
        limit = self.refreeze_after
        if generation == 2 and limit is not None and seconds >= limit and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed
                self._loop.call_soon_threadsafe(self._refreeze, seconds)
        if seconds >= self._slow:
            self._slow_since_log += 1
            if seconds >= self._very_slow or now - self._logged_at >= 60.0:
                log.info(
                    "the garbage collector paused %s %.0f ms (generation %d; "
                    "%d pauses of %.0f ms or more since the last such line)",
                    self._process,
                    seconds * 1000,
                    generation,
                    self._slow_since_log,
                    self._slow * 1000,
                )
                self._logged_at = now
                self._slow_since_log = 0

    def _refreeze(self, seconds: float) -> None:
        before = gc.get_freeze_count()
        gc.freeze()
        log.info(
            "after a %.0f ms collection of the whole heap, %d more objects are out of the "
            "collector's sight (gc.freeze; %d in all)",
            seconds * 1000,
            gc.get_freeze_count() - before,
            gc.get_freeze_count(),
        )


def settle_worker(process: str) -> GcPauses:
    """``settle`` for a worker process (a BMC reader, a relay worker), with
    its pauses timed, logged as ``process``'s, and what survives a long
    whole-heap collection frozen (its heap grows after it starts). Call on
    the worker's event loop; ``stop`` the result when the worker ends."""
    settle()
    pauses = GcPauses(
        lambda _generation, _seconds: None, refreeze_after=REFREEZE_AFTER, process=process
    )
    pauses.start()
    return pauses
