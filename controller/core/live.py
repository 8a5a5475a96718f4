"""The fleet's latest health, in memory, persisted write-behind.

At 25,000 agents reporting every 10 s a database transaction per report is
2,500 commits a second for data that is replaced ten seconds later. So a
report lands here (``note``): the node's latest ``HealthReport`` and when its
agent was last heard from. Reads (``GetNode``, ``ListNodes``, the health
gate, the policies) see it at once. ``run`` writes what changed every
``flush_interval`` seconds, in batches of ``batch`` nodes, one bulk UPDATE each
(``NodeRepository.save_health_batch``).

What a crash can lose is bounded: at most ``flush_interval`` seconds of
*samples*. Never a state transition, an allocation or an event: those stay
transactional where they happen (a report that carries drift records its
``node.gpu_drift`` event in its own transaction, as before).

``pressure`` says how far behind the write-behind is (samples waiting vs the
batch it writes per flush), for the backpressure the agent service applies.

Each report is held packed (``core/health.py`` ``pack_report``: bytes,
plain tuples written by ``marshal``, which the cyclic garbage collector
never tracks), so a fleet's latest reports add nothing to its pauses;
``health`` unpacks a typed copy. ``version`` numbers each node's latest
report (it changes with every report), for what is worked out once per
report and kept (the baseline gate's verdict, a report's wire form).

``listen`` adds a function told of every report as it lands (not of a bare
sighting), once it is held, on the event loop, e.g. the per-allocation health tallies
(``controller/core/job_health.py``). A listener runs on the hot path of every
agent's every report: it must be cheap and must not block; one that raises
is logged and does not stop the report from landing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

from controller.core.health import (
    HealthReport,
    HealthSample,
    PackedReport,
    pack_report,
    unpack_report,
)
from controller.core.ports import Store

log = logging.getLogger(__name__)


def hottest_c(health: HealthReport) -> float | None:
    """The hottest GPU's temperature in a report (None: no GPU reads one)."""
    temps = [g.temp_c for g in health.gpus if g.temp_c is not None]
    return max(temps) if temps else None


DEFAULT_FLUSH_INTERVAL = 5.0  # seconds: the most samples a crash loses
# Nodes per bulk UPDATE (one transaction each): the writes queued behind a
# flush (an allocation, a transition) wait for one batch, not the whole fleet.
DEFAULT_BATCH = 250
HISTORY = 60  # recent (time, hottest GPU °C) points kept per node, for the dashboard

# Told of each report: (node, report, when it arrived, controller clock).
HealthListener = Callable[[str, HealthReport, float], None]


class LiveHealth:
    """Latest health and agent sightings per node; see the module docstring."""

    def __init__(
        self,
        store: Store,
        *,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        batch: int = DEFAULT_BATCH,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if flush_interval <= 0 or batch < 1:
            raise ValueError("flush_interval must be > 0 and batch >= 1")
        self._store = store
        self.flush_interval = flush_interval
        self.batch = batch
        self._clock = clock
        # Per node, in dicts of plain values (nothing for the collector to
        # track a report): when its agent was last heard from, and its
        # latest report packed with that report's version. A node with
        # sightings only is in ``_seen`` alone.
        self._seen: dict[str, float] = {}
        self._reports: dict[str, PackedReport] = {}
        self._versions: dict[str, int] = {}
        self._numbered = 0  # reports held since start
        self._dirty: set[str] = set()
        self._history: dict[str, deque[tuple[float, float]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.flushed = 0  # samples written since start
        self._failing = False
        self._listeners: list[HealthListener] = []
        self._listener_failures = 0  # reports a listener raised on

    # -- the hot path ----------------------------------------------------------

    def note(
        self,
        node: str,
        health: HealthReport | None,
        seen_at: float | None = None,
        packed: PackedReport | None = None,
    ) -> None:
        """The node's agent just reported ``health`` (None: a sighting only,
        e.g. a registration, which keeps the last report); ``packed``, when
        given, is ``health`` packed already (``pack_report``)."""
        at = self._clock() if seen_at is None else seen_at
        self._seen[node] = at
        self._dirty.add(node)
        if health is None:
            return  # a sighting: the report held stays (and the stored one, save_health_batch)
        self._hold(node, health, packed)
        hottest = hottest_c(health)
        if hottest is not None:
            points = self._history.get(node)
            if points is None:
                points = self._history[node] = deque(maxlen=HISTORY)
            points.append((health.sampled_at or at, hottest))
        for listener in self._listeners:
            try:
                listener(node, health, at)
            except Exception:
                self._listener_failed(node)

    def listen(self, listener: HealthListener) -> None:
        """Tell ``listener`` of every report from now on (see the module docstring)."""
        self._listeners.append(listener)

    def _listener_failed(self, node: str) -> None:
        self._listener_failures += 1
        failures = self._listener_failures
        if failures == 1 or failures % 10000 == 0:  # a bug, not a flood of logs
            log.exception("node %s: a health listener failed (%d reports so far)", node, failures)

    def forget(self, node: str) -> None:
        """Drop a removed node's samples (a pending one is not written)."""
        self._seen.pop(node, None)
        self._reports.pop(node, None)
        self._versions.pop(node, None)
        self._dirty.discard(node)
        self._history.pop(node, None)

    def history(self, node: str) -> list[tuple[float, float]]:
        """The node's recent (sampled at, hottest GPU °C) points since start, oldest first."""
        return list(self._history.get(node, ()))

    def seed(self, node: str, health: HealthReport | None, seen_at: float) -> None:
        """What the store already holds for ``node`` (at start): kept, not
        written again; a sample that came since wins."""
        if node not in self._seen:
            self._seen[node] = seen_at
            if health is not None:
                self._hold(node, health)

    def _hold(self, node: str, health: HealthReport, packed: PackedReport | None = None) -> None:
        """Keep ``health`` packed as the node's latest report, numbered anew."""
        self._numbered += 1
        self._versions[node] = self._numbered
        self._reports[node] = pack_report(health) if packed is None else packed

    def health(self, node: str) -> HealthReport | None:
        """The latest report held in memory (None: none since start), as a
        typed copy: equal each time until the next report, not the same object."""
        packed = self._reports.get(node)
        return unpack_report(packed) if packed is not None else None

    def version(self, node: str) -> int:
        """The number of the node's latest report: it changes with every
        report (0: none held)."""
        return self._versions.get(node, 0)

    def last_seen(self, node: str) -> float:
        """When the node's agent was last heard from since start (0: not yet)."""
        return self._seen.get(node, 0.0)

    def _sample(self, node: str) -> HealthSample | None:
        seen_at = self._seen.get(node)
        if seen_at is None:
            return None
        return HealthSample(node, self._reports.get(node), seen_at)

    @property
    def pending(self) -> int:
        """Samples not yet written."""
        return len(self._dirty)

    @property
    def pressure(self) -> float:
        """Samples waiting per sample a flush interval's batches can write
        (above 1: the write-behind falls behind)."""
        return len(self._dirty) / self.batch

    # -- write-behind ----------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kiln-health-write-behind")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush()

    async def flush(self) -> int:
        """Write the samples changed before this flush began; returns how
        many were written. A sample that lands while it writes waits for the
        next flush: under load a flush is one pass over the fleet per
        interval, not a loop that chases the reports (which kept the
        database busy with health writes and every other write queued
        behind them). A failed batch stays dirty, with the batches after it
        (unless a newer sample came), and is retried at the next flush; the
        failure is logged once until a flush succeeds."""
        written = 0
        # By name, not as they came: a node's row sits beside those enrolled
        # with it (names in order, most often), so a batch of neighbours
        # dirties fewer database pages than 250 nodes from across the fleet
        # (SQLite's commit was half a random batch's cost).
        names = sorted(self._dirty)
        self._dirty.clear()
        for start in range(0, len(names), self.batch):
            batch = names[start : start + self.batch]
            samples = [s for s in map(self._sample, batch) if s is not None]
            try:
                written += await self._store.tx(
                    lambda tx, s=samples: tx.nodes.save_health_batch(s)  # type: ignore[misc]
                )
            except Exception as e:
                self._dirty.update(names[start:])
                if not self._failing:
                    log.warning("health write-behind failed, retrying at the next flush: %s", e)
                self._failing = True
                break
            if self._failing:
                log.info("health write-behind writing again")
            self._failing = False
        self.flushed += written
        return written

    async def stop(self) -> None:
        """Stop the loop and write what is left (best effort)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await self.flush()
