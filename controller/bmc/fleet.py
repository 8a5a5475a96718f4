"""Bulk operations over many BMCs with bounded concurrency.

A broken BMC only ever occupies one of ``concurrency`` slots for at most its
guard's timeout x retries (or nothing at all once its breaker is open), so
healthy BMCs keep flowing through the other slots.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from controller.bmc.handle import Bmc
from controller.core.errors import KilnError
from controller.core.spread import Spread

LOG = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class NodeOutcome(Generic[T]):
    """One node's result: ``ok`` with ``value``, or ``error`` (a reason)."""

    node: str
    ok: bool
    value: T | None = None
    error: str | None = None
    error_type: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class BulkProgress:
    done: int
    total: int
    failed: int
    last: NodeOutcome[Any]


@dataclass
class BulkResult(Generic[T]):
    outcomes: dict[str, NodeOutcome[T]] = field(default_factory=dict)
    wall_seconds: float = 0.0

    @property
    def succeeded(self) -> list[str]:
        return [n for n, o in self.outcomes.items() if o.ok]

    @property
    def failed(self) -> dict[str, str]:
        return {n: o.error or "" for n, o in self.outcomes.items() if not o.ok}

    @property
    def summary(self) -> str:
        total = len(self.outcomes)
        failed = len(self.failed)
        return f"{total - failed}/{total} ok, {failed} failed in {self.wall_seconds:.1f}s"


async def run_bulk(
    targets: Sequence[tuple[str, Bmc]],
    op: Callable[[Bmc], Awaitable[T]],
    concurrency: int = 64,
    progress: Callable[[BulkProgress], None] | None = None,
    spread: float = 0.0,
) -> BulkResult[T]:
    """Run ``op`` on every target, at most ``concurrency`` at a time, the
    calls after the first few begun evenly over ``spread`` seconds
    (``controller.core.spread``; 0: each as soon as a slot is free).

    Never raises for a node's failure: Kiln errors become the node's outcome
    (other exceptions too, as a programming error worth reporting). Cancelling
    the caller cancels the outstanding operations.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    result: BulkResult[T] = BulkResult()
    total = len(targets)
    counters = {"done": 0, "failed": 0}
    started = time.monotonic()
    queue: asyncio.Queue[tuple[int, str, Bmc]] = asyncio.Queue()
    for index, (node, bmc) in enumerate(targets):
        queue.put_nowait((index, node, bmc))
    turns = Spread(total, spread)

    async def one(node: str, bmc: Bmc) -> NodeOutcome[T]:
        t0 = time.monotonic()
        try:
            value = await op(bmc)
        except KilnError as e:
            return NodeOutcome(
                node,
                False,
                error=str(e),
                error_type=type(e).__name__,
                seconds=time.monotonic() - t0,
            )
        except Exception as e:
            LOG.exception("node %s: bulk operation failed unexpectedly", node)
            return NodeOutcome(
                node,
                False,
                error=repr(e),
                error_type=type(e).__name__,
                seconds=time.monotonic() - t0,
            )
        return NodeOutcome(node, True, value=value, seconds=time.monotonic() - t0)

    async def worker() -> None:
        while True:
            try:
                index, node, bmc = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await turns.turn(index)
            outcome = await one(node, bmc)
            result.outcomes[node] = outcome
            counters["done"] += 1
            if not outcome.ok:
                counters["failed"] += 1
            if progress is not None:
                progress(BulkProgress(counters["done"], total, counters["failed"], outcome))

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, total)):
            group.create_task(worker())
    result.wall_seconds = time.monotonic() - started
    return result
