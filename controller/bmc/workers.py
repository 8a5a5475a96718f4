"""A small bounded executor of daemon threads, one per BMC protocol.

Why not ``concurrent.futures.ThreadPoolExecutor``: its worker threads are
joined at interpreter exit (``concurrent.futures.thread._python_exit``, run
through ``threading._register_atexit``) and by ``shutdown(wait=True)``, so one
call stuck inside a BMC library (pyghmi waiting for a BMC that never answers)
keeps the controller from exiting. These threads are daemons that nothing
joins: ``shutdown`` cancels what is queued and returns at once, and a thread
still inside a library call is abandoned with the process.

Calls come in two lanes. A *trusted* call is for a BMC whose last call got an
answer; an *untrusted* one is for a BMC never heard from yet or failing now.
Trusted calls are served first and may use every thread; untrusted calls may
hold at most ``untrusted_limit`` threads at once. So however many dead BMCs
there are, answering BMCs always find a free thread.

How many of the threads may run at once follows how late finished calls'
results reach the event loop (``loop_share``): threads that burn the
interpreter are held back so that the loop stays on time.

A call cancelled before a thread picks it up (its caller's deadline passed)
is dropped, never run late. At shutdown queued calls are cancelled and the
callers of running ones get ``WorkerPoolClosed`` at once; the threads finish
(or stay stuck) on their own.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, TypeVar

from controller.bmc.loop_share import DEFAULT_SLOW_ABOVE, LoopShare

LOG = logging.getLogger(__name__)
T = TypeVar("T")

_Item = tuple[Future[Any], Callable[[], Any]]


class WorkerPoolClosed(RuntimeError):
    """The pool was shut down before the call ran, or while it ran."""


@dataclass(frozen=True)
class WorkerStats:
    """A snapshot: threads started, calls running, calls queued per lane,
    and how many may run at once now (``loop_share``)."""

    threads: int
    running: int
    untrusted_running: int
    queued_trusted: int
    queued_untrusted: int
    limit: int


class WorkerPool(Executor):
    """At most ``max_workers`` daemon threads, started as calls need them.

    Args:
        name: names the threads (``kiln-bmc-NAME-N``) and appears in errors.
        max_workers: the most threads, hence the most calls running at once.
        untrusted_share: the fraction of ``max_workers`` that untrusted calls
            may hold at once (at least one thread).
        slow_above: the median lateness of results on the event loop that
            holds threads back (``loop_share``).
    """

    def __init__(
        self,
        name: str,
        max_workers: int,
        *,
        untrusted_share: float = 0.5,
        slow_above: float = DEFAULT_SLOW_ABOVE,
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        if not 0.0 < untrusted_share <= 1.0:
            raise ValueError("untrusted_share must be in (0, 1]")
        self.name = name
        self.max_workers = max_workers
        self.untrusted_share = untrusted_share
        self.untrusted_limit = max(1, int(max_workers * untrusted_share))
        self.share = LoopShare(max_workers, name=name, slow_above=slow_above)
        self._cv = threading.Condition()
        self._trusted: collections.deque[_Item] = collections.deque()
        self._untrusted: collections.deque[_Item] = collections.deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._running = 0
        self._in_progress: set[Future[Any]] = set()
        self._untrusted_running = 0
        self._shutdown = False

    # --- Executor API -----------------------------------------------------------
    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)`` in the trusted lane."""
        return self.submit_call(functools.partial(fn, *args, **kwargs), trusted=True)

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        """Refuse new calls, cancel queued ones and release the callers of
        running ones (``WorkerPoolClosed``) -- by default -- and let idle
        threads exit. Returns at once unless ``wait``; never waits for a call."""
        with self._cv:
            self._shutdown = True
            abandoned: list[Future[Any]] = []
            if cancel_futures:
                for lane in (self._trusted, self._untrusted):
                    while lane:
                        lane.popleft()[0].cancel()
                abandoned = list(self._in_progress)
            self._cv.notify_all()
            threads = list(self._threads)
        for future in abandoned:
            with contextlib.suppress(InvalidStateError):  # it just finished
                future.set_exception(WorkerPoolClosed(f"the {self.name} BMC worker pool closed"))
        if wait:
            for thread in threads:
                thread.join()

    # --- Kiln's API ---------------------------------------------------------------
    def submit_call(self, fn: Callable[[], T], *, trusted: bool) -> Future[T]:
        """Queue ``fn()`` in the trusted or untrusted lane.

        Raises:
            RuntimeError: the pool is shut down.
        """
        future: Future[T] = Future()
        with self._cv:
            if self._shutdown:
                raise WorkerPoolClosed(f"the {self.name} BMC worker pool is shut down")
            (self._trusted if trusted else self._untrusted).append((future, fn))
            queued = len(self._trusted) + len(self._untrusted)
            if queued > self._idle and len(self._threads) < self.share.limit:
                self._spawn()
            self._cv.notify()
        return future

    def stats(self) -> WorkerStats:
        with self._cv:
            return WorkerStats(
                threads=len(self._threads),
                running=self._running,
                untrusted_running=self._untrusted_running,
                queued_trusted=len(self._trusted),
                queued_untrusted=len(self._untrusted),
                limit=self.share.limit,
            )

    def observe_lateness(self, seconds: float, *, now: float | None = None) -> None:
        """A finished call's result reached the event loop ``seconds`` after
        its thread set it (called on the loop's thread; ``now``: monotonic)."""
        with self._cv:
            if self.share.observe(seconds, now):
                # A raised limit lets queued calls run: threads for them.
                queued = len(self._trusted) + len(self._untrusted)
                for _ in range(min(queued - self._idle, self.share.limit - len(self._threads))):
                    self._spawn()
                self._cv.notify_all()

    @property
    def closed(self) -> bool:
        return self._shutdown

    # --- inside ---------------------------------------------------------------
    def _spawn(self) -> None:
        thread = threading.Thread(
            target=self._work,
            name=f"kiln-bmc-{self.name}-{len(self._threads)}",
            daemon=True,  # never joined at exit: see the module docstring
        )
        self._threads.append(thread)
        thread.start()

    def _next(self) -> tuple[_Item, bool] | None:
        """The next call this thread may run (caller holds the condition)."""
        limit = self.share.limit
        if self._running >= limit:
            return None
        if self._trusted:
            return self._trusted.popleft(), False
        untrusted_limit = min(self.untrusted_limit, max(1, int(limit * self.untrusted_share)))
        if self._untrusted and self._untrusted_running < untrusted_limit:
            self._untrusted_running += 1
            return self._untrusted.popleft(), True
        return None

    def _work(self) -> None:
        while True:
            with self._cv:
                while True:
                    picked = self._next()
                    if picked is not None:
                        break
                    if self._shutdown:
                        self._threads.remove(threading.current_thread())
                        return
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                self._running += 1
            (future, fn), untrusted = picked
            run, cpu = False, 0.0
            try:
                with self._cv:  # atomic with shutdown's look at what is running
                    run = future.set_running_or_notify_cancel()
                    if run:
                        self._in_progress.add(future)
                if run:
                    cpu = time.thread_time()
                    try:
                        result = fn()
                    except BaseException as e:
                        with contextlib.suppress(InvalidStateError):  # abandoned at shutdown
                            future.set_exception(e)
                    else:
                        with contextlib.suppress(InvalidStateError):
                            future.set_result(result)
            finally:
                with self._cv:
                    if run:
                        self.share.spent(time.thread_time() - cpu)
                    self._in_progress.discard(future)
                    self._running -= 1
                    if untrusted:
                        self._untrusted_running -= 1
                    if untrusted or self._running + 1 >= self.share.limit:
                        self._cv.notify()  # a call may be waiting for this slot
                del future, fn, picked  # drop references before waiting again
