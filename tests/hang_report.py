"""Where a hung asyncio test waits, said before pytest-timeout ends the run.

pytest-timeout's thread method prints every thread's stack and ends the whole
run, but an asyncio test that hangs shows only its event loop idle in
``select``: the await that never completes lives in a coroutine, not on a
thread's stack. Shortly before the timeout, this prints every task of every
running event loop (each task's await chain) to stderr, and cancels the
test's own coroutine with a message naming where each task waits: the test
fails on its own, with the await in its summary line, and the run goes on.
A loop that does not answer (blocked in a C call) is read from this thread
and left to pytest-timeout.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Printed this long before pytest-timeout's own report.
LEAD_S = 20.0


def _running_loops() -> list[asyncio.AbstractEventLoop]:
    return [
        o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()
    ]


def _where(task: asyncio.Task[object]) -> str:
    """The innermost frame a task waits in, as ``file:line (function)``."""
    stack = task.get_stack()
    if not stack:
        return f"{task.get_name()} (no frame)"
    frame = stack[-1]
    code = frame.f_code
    return f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} ({code.co_name})"


def _print_tasks(tasks: set[asyncio.Task[object]], name: str) -> None:
    print(f"\n===== {len(tasks)} asyncio task(s) of {name} still waiting =====", file=sys.stderr)
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"--- {task.get_name()}: {task.get_coro()!r}", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


def _report_and_cancel(loop: asyncio.AbstractEventLoop, test: str, function: str) -> None:
    tasks = asyncio.all_tasks(loop)
    _print_tasks(tasks, test)
    waits = "; ".join(sorted({_where(t) for t in tasks}))
    for task in tasks:
        if getattr(task.get_coro(), "__name__", "") == function:
            task.cancel(f"hung near its timeout; tasks wait at: {waits}")


def report_waiting_tasks(test: str, function: str) -> None:
    """Print each running loop's tasks and cancel the test's coroutine, on the
    loop itself when it answers."""
    for loop in _running_loops():
        done = threading.Event()

        def on_loop(loop: asyncio.AbstractEventLoop = loop, done: threading.Event = done) -> None:
            try:
                _report_and_cancel(loop, test, function)
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(on_loop)
        except RuntimeError:  # closed meanwhile
            continue
        if not done.wait(5.0):  # the loop is blocked, not waiting: read it from here
            _print_tasks(asyncio.all_tasks(loop), f"{test} (its loop did not answer)")


@contextmanager
def hang_reporter(test: str, function: str, timeout_s: float) -> Iterator[None]:
    """Arm the report ``LEAD_S`` before ``timeout_s``; ``function`` is the
    test function's name (its coroutine is the one cancelled)."""
    if timeout_s <= LEAD_S:
        yield
        return
    timer = threading.Timer(timeout_s - LEAD_S, report_waiting_tasks, args=(test, function))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
