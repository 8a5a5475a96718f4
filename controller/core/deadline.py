"""The deadline of the request being served, for work done on its behalf.

An operator's ``kiln power status`` gives up after its ``--timeout``; a BMC
that stalls would otherwise keep the controller retrying past that moment, so
the client sees only "deadline exceeded" instead of what the BMC did. The API
edge opens :func:`caller_deadline` around each call with the seconds its
client has left; code doing slow I/O for that call (the BMC guard) bounds
itself by :func:`seconds_left` and gives up early enough to answer with its
own error.

The deadline lives in a ``ContextVar``: each request (an asyncio task, and
every task it starts) sees its own; background work outside a request sees
none. Times are ``time.monotonic()`` values.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Part of the client's remaining time kept back to carry the answer to it.
REPLY_SHARE = 0.1
REPLY_MIN = 0.2  # seconds
REPLY_MAX = 1.0  # seconds
NO_DEADLINE = 365 * 24 * 3600.0  # gRPC reports "none" as a huge time left

_CALLER_DEADLINE: ContextVar[float | None] = ContextVar("kiln_caller_deadline", default=None)


def reply_margin(seconds: float) -> float:
    """Seconds of ``seconds`` kept back for the answer to reach the client."""
    return min(REPLY_MAX, max(REPLY_MIN, seconds * REPLY_SHARE))


@contextmanager
def caller_deadline(seconds: float | None) -> Iterator[None]:
    """Within this block, work for the caller ends ``seconds`` from now, less
    the reply margin (``None`` or a huge value: the caller set no deadline)."""
    if seconds is None or seconds >= NO_DEADLINE:
        yield
        return
    usable = max(0.0, seconds - reply_margin(seconds))
    token = _CALLER_DEADLINE.set(time.monotonic() + usable)
    try:
        yield
    finally:
        _CALLER_DEADLINE.reset(token)


def seconds_left() -> float | None:
    """Seconds until the current caller's deadline (never negative); ``None``
    outside a request with a deadline."""
    deadline = _CALLER_DEADLINE.get()
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def bounded(timeout: float) -> float:
    """``timeout`` cut to what the current caller has left."""
    left = seconds_left()
    return timeout if left is None else min(timeout, left)
