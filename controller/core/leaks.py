"""Coolant leaks: every node's leak detectors, watched through its BMC.

Every ``interval`` seconds (5 by default, so that a tray is off within 10 s
of the reading that found its leak) the watcher reads the leak detectors of
every node's chassis through the ``BmcGateway``, at most ``concurrency``
nodes at once, each call behind its BMC's guard and breaker. A node whose
protocol has none (IPMI) answers NotSupported without a BMC call and is
skipped from then on, without a log line. A Redfish BMC whose chassis has no
leak detectors (an HGX box, an air-cooled server) is read again only after
``rediscover`` seconds (600 by default, as often as the Redfish driver looks
for detectors afresh), then after twice that for each read in a row that
shows none, up to ``rediscover_max`` (an hour), each wait shortened by up to
half at random: in a fleet of such nodes the watcher then costs next to
nothing between those reads. A pass looks only at the nodes that may be
due (``_candidates``): every node on the first pass, then those whose read
ended or that a commit saved since the last pass (the view's ``NodeFeed``:
a node enrolled is read by the next pass), and those whose wait is over (a
heap of timers). The reads do not depend on the node's agent: a
tray whose agent is silent (or whose OS hung) is watched all the same. A BMC
that is slow holds up only its own node: a pass does not wait for a read
still in flight from the last one. A pass hands its reads out evenly over
``spread`` of the interval (0.8), the first ``burst`` (32) at once, the nodes
whose detectors are watched first and always in the same order (each is then
read at the same point of every pass): a wave of reads (25,000 BMCs asked
again whether they have detectors) does not take the event loop from the
agents' reports in bursts. A pass that outlasts the interval (a
fleet with more BMCs than one controller reads in it) goes on, and the next
begins once it has handed every node to a reader: no node is read twice
before every node was read once, and a warning says so, once. A BMC that
cannot be read is read again after ``interval``, then after twice that, and
so on up to 5 minutes (jittered, ``backoff``); a good read starts it afresh.
The BMCs that became unreadable are said in one log line a pass, not one
line each (a BMC network down is 25,000 of them at once).

Each reading is classified (``classify``, the rule in docs/leaks.md):

1. a detector whose document Kiln cannot read is a **fault**;
2. ``Status.State`` present and not Enabled, Degraded or Qualified (e.g.
   UnavailableOffline, Disabled, Absent, InTest): the detector is not
   sensing, a **fault**, whatever its ``DetectorState`` says;
3. ``DetectorState`` absent or null: a **fault**;
4. ``DetectorState`` Critical: a **critical** leak;
5. ``DetectorState`` Warning: a leak **warning**;
6. ``DetectorState`` OK with ``Status.Health`` Warning or Critical: the
   detector reports a fault of its own, a **fault**;
7. otherwise **ok**.

What follows a change of a detector's state (each change is one
``node.leak`` event with the detector, its state and the reading's time):

* **critical**: in one transaction the node's power is blocked (stored with
  the node, so a restart keeps it), it is drained towards powered_off and
  the job that holds it is told (``allocation.notice``); then its BMC powers
  it off at once, forced: no ``for:`` window, no grace for the job, and no
  policy cap (a safety action). Then it is powered_off and its allocation
  loses it as a failed node (``Allocations.node_failed``). While a detector
  stays Critical, every pass checks that the node is still off and powers it
  off again if it is not.
* two or more trays of one rack blocked: every other node of the rack is
  drained (its job told) and ``rack.isolation_requested`` is recorded once
  for the building system.
* **warning**, **fault**, back to **ok**: recorded; no power action. A fault
  flags the detector for repair.

A blocked node is refused power-on: ``Nodes.power`` refuses on, cycle and
restart (so do the API, the lifecycle and the policies, which all go through
it), and ``PowerBlockGate`` (``core.power_block``) refuses them to any other user
of the gateway (the preparation's reboot). ``clear`` lifts the block (``kiln nodes
clear-leak``), and is refused while a detector of the node still reads
Critical.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controller.core import scan
from controller.core.backoff import StepBackoff, doubling
from controller.core.errors import FailedPrecondition, InvalidArgument, KilnError, NotSupported
from controller.core.eventlog import record, tell_job
from controller.core.kinds import EventKind
from controller.core.leak_racks import RACK_ISOLATION_TRAYS, isolate
from controller.core.model import BmcTarget, DetectorHealth, LeakReading, LeakState
from controller.core.node_view import NodeFeed, NodeView
from controller.core.nodes import Nodes
from controller.core.ports import BmcGateway, Store, Tx
from controller.core.records import LeakLook, NodeRecord
from controller.core.spread import DEFAULT_BURST, Spread
from controller.core.states import OUT_OF_SERVICE, NodeState, PowerState
from controller.core.tasks import BackgroundTasks
from controller.core.transitions import load_node, move
from controller.core.unreadable import say_unreadable

log = logging.getLogger(__name__)

DEFAULT_LEAK_INTERVAL = 5.0
DEFAULT_LEAK_CONCURRENCY = 256  # the Redfish thread pool's default size
# A BMC that showed no leak detectors is asked again after this long (as
# often as the Redfish driver looks afresh for detectors it found; a BMC
# that showed none is read afresh at each of these asks).
DEFAULT_LEAK_REDISCOVER = 600.0
# A BMC that keeps showing none is asked ever less often (doubling), up to
# hourly: an air-cooled box never grows detectors, and 25,000 of them asked
# every 10 minutes were 42 reads a second, most of an idle controller's CPU.
DEFAULT_LEAK_REDISCOVER_MAX = 3600.0
DEFAULT_LEAK_MAX_BACKOFF = 300.0  # s: the longest wait before an unreadable BMC is read again
_STREAKS = 66  # reads in a row without detectors past which the wait is the same (``doubling``)
# A pass hands its reads out over this share of the interval, the first
# DEFAULT_BURST at once (``core/spread.py``).
DEFAULT_LEAK_SPREAD = 0.8
# DMTF Resource.State values in which a detector is sensing (None: not reported).
SENSING_STATES = frozenset({"Enabled", "Degraded", "Qualified"})
MAX_REASON = 1024


def classify(reading: LeakReading) -> tuple[LeakState, str]:
    """What one reading means, and why (the rule in this module's docstring).

    Pure; a detector Kiln cannot trust is a fault, never a leak.
    """
    if reading.problem:
        return LeakState.FAULT, f"its document is unreadable: {reading.problem}"
    if reading.status_state is not None and reading.status_state not in SENSING_STATES:
        return LeakState.FAULT, f"Status.State is {reading.status_state}: it is not sensing"
    state = reading.detector_state
    if state is None:
        return LeakState.FAULT, "it reports no DetectorState"
    if state is DetectorHealth.CRITICAL:
        return LeakState.CRITICAL, "DetectorState Critical"
    if state is DetectorHealth.WARNING:
        return LeakState.WARNING, "DetectorState Warning"
    health = reading.status_health
    if health in (DetectorHealth.WARNING, DetectorHealth.CRITICAL):
        return LeakState.FAULT, f"DetectorState OK but Status.Health {_dmtf(health)}"
    return LeakState.OK, "DetectorState OK"


def _dmtf(health: DetectorHealth | None) -> str | None:
    """The DMTF spelling ("OK", "Warning", "Critical") of a health value."""
    if health is None:
        return None
    return "OK" if health is DetectorHealth.OK else health.value.capitalize()


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fields(r: LeakReading, state: LeakState, before: LeakState, rack: str) -> dict[str, Any]:
    """A ``node.leak`` event's data."""
    return {
        "detector": r.detector,
        "detector_name": r.name,
        "state": state.value,
        "previous": before.value,
        "detector_state": _dmtf(r.detector_state),
        "status_state": r.status_state,
        "status_health": _dmtf(r.status_health),
        "read_at": r.read_at,
        "rack": rack,
        "action": "power_off" if state is LeakState.CRITICAL else "none",
        "repair": state is LeakState.FAULT,
    }


@dataclass
class _Watched:
    """What the watcher remembers of one node, in memory only."""

    states: dict[str, LeakState]  # detector → its last state (absent: OK)
    target: BmcTarget | None = None
    unreadable: str = ""  # the last read's error ("" after a good read)
    none_at: float | None = None  # monotonic: when the BMC last showed no detectors
    none_streak: int = 0  # reads in a row that showed none
    none_share: float = 1.0  # of the wait after none_at (jitter, drawn at the read)
    failures: int = 0  # reads in a row that failed
    retry_at: float = 0.0  # monotonic: not read again before (after a failed read)
    seen: int = 0  # detectors the last good read showed


class _Feed:
    """One pass's nodes, handed to its readers one at a time with their BMC
    targets, unsealed ``batch`` nodes at a time as the readers need them
    (``unseal``); ``dropped(node)`` for each node left unread when the store
    fails."""

    def __init__(
        self,
        nodes: list[NodeRecord],
        batch: int,
        unseal: Callable[[list[NodeRecord]], Awaitable[dict[str, BmcTarget]]],
        dropped: Callable[[str], None],
        *,
        span: float = 0.0,
        burst: int = 0,
    ) -> None:
        self._unseal = unseal
        self._dropped = dropped
        self.size = len(nodes)
        self.began = time.monotonic()
        self._waiting = nodes[::-1]  # popped from the end: the pass's order
        self._batch = batch
        self._ready: list[tuple[NodeRecord, BmcTarget]] = []
        self._lock = asyncio.Lock()
        self._spread = Spread(self.size, span, burst, began=self.began)
        self._handed = 0

    @property
    def left(self) -> int:
        """Nodes not yet handed to a reader."""
        return len(self._waiting) + len(self._ready)

    async def next(self) -> tuple[NodeRecord, BmcTarget] | None:
        """The next node to read and its target, at its turn; None when none is left."""
        while not self._ready:
            if not self._waiting:
                return None
            async with self._lock:  # one reader unseals the next batch
                if not self._ready and self._waiting:
                    await self._unseal_next()
        taken = self._ready.pop()
        self._handed += 1
        await self._spread.turn(self._handed - 1)
        return taken

    async def _unseal_next(self) -> None:
        take = self._waiting[-self._batch :]
        del self._waiting[-self._batch :]
        try:
            targets = await self._unseal(take)
        except Exception:
            # The store failed: this pass reads nothing more; the next tries again.
            left = take + self._waiting
            self._waiting = []
            for node in left:
                self._dropped(node.name)
            log.exception("leak detector pass: the BMC targets of %d nodes unreadable", len(left))
            return
        self._ready = [(node, targets[node.name]) for node in take]


class LeakWatcher:
    """Reads every node's leak detectors and acts on them (module docstring).

    ``interval``, ``concurrency``, ``rediscover`` and ``backoff`` are plain attributes and
    may be changed while it runs. ``on_node_failed`` is ``Allocations.node_failed``.
    """

    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        bmc: BmcGateway,
        on_node_failed: Callable[[str, str], Awaitable[None]],
        *,
        interval: float = DEFAULT_LEAK_INTERVAL,
        concurrency: int = DEFAULT_LEAK_CONCURRENCY,
    ) -> None:
        if interval <= 0:
            raise InvalidArgument(f"the leak detector interval must be positive, not {interval}")
        self._store = store
        self._nodes = nodes
        self._bmc = bmc
        self._on_node_failed = on_node_failed
        self.interval = interval
        self.concurrency = concurrency
        self.rediscover = DEFAULT_LEAK_REDISCOVER
        self.rediscover_max = DEFAULT_LEAK_REDISCOVER_MAX
        # Each wait shortened by up to this share, at random: a fleet enrolled
        # in a few minutes would otherwise be asked again all at once.
        self.rediscover_jitter = 0.5
        self.spread = DEFAULT_LEAK_SPREAD
        self.burst = DEFAULT_BURST
        self.clock: Callable[[], float] = time.monotonic  # tests may set it
        self.wall: Callable[[], float] = time.time  # the stored looks' clock; tests may set it
        # A BMC that cannot be read is read again after a doubling delay, up
        # to 5 minutes: a fleet of dead BMCs must not cost a read each every
        # interval (25,000 of them held a restarted controller's one core).
        self.backoff = StepBackoff(first_delay_s=interval, max_delay_s=DEFAULT_LEAK_MAX_BACKOFF)
        self._rng = random.Random()
        self._watched: dict[str, _Watched] = {}
        self._unsupported: dict[str, str] = {}  # node → the BMC URL that has no detectors
        # Which nodes a pass looks at (``_candidates``): not the whole fleet
        # each pass, but the nodes whose read ended or that were saved since
        # the last pass, and those whose wait (no detectors, a failed read)
        # is over, from a heap of (when, node).
        self._changes: NodeFeed | None = None  # the view's feed of saved nodes
        self._scan_all = True  # the first pass, a reloaded view, changed waits
        self._look_again: set[str] = set()
        self._timers: list[tuple[float, str]] = []
        self._waits_set: tuple[object, ...] = ()  # the settings the timers were set with
        self._blocked: dict[str, str] = {}  # node whose power is blocked → its rack
        self.looked = 0  # nodes the passes looked at, in all (``_candidates``)
        # The reads that showed no detectors, kept in the store (``LeakLook``)
        # a pass at a time, and taken back once at start: a restarted
        # controller goes on with each BMC's wait instead of asking them all.
        self._looks_restored = False
        self._looks_to_save: dict[str, LeakLook | None] = {}
        self._looks_failing = False
        self._node_locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._rack_lock = asyncio.Lock()
        self._isolated: set[str] = set()  # racks whose isolation was requested
        self._in_flight: set[str] = set()
        self._newly_unreadable: list[tuple[str, str]] = []  # node, error
        self._reads = BackgroundTasks()
        self._feed: _Feed | None = None  # the latest pass's
        self._readers: list[asyncio.Task[None]] = []  # its readers
        self._behind_since: float | None = None  # a pass outlasting the interval began
        self.scan_slice = scan.SLICE  # nodes a pass's choice looks at between loop turns
        self.last_pass_seconds = 0.0

    # -- the loop ----------------------------------------------------------------

    async def run(self) -> None:
        """Read every node each ``interval`` until cancelled."""
        while True:
            started = time.monotonic()
            try:
                await self.run_once(timeout=self.interval)
            except Exception:
                log.exception("leak detector pass failed")
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def run_once(self, *, timeout: float | None = None) -> None:
        """One pass: read every node not already being read, and act on what
        changed; then isolate racks with enough blocked trays. Waits for this
        pass's reads at most ``timeout`` seconds (None: all of them); a read
        still running goes on in the background and its node is skipped by
        the passes that start meanwhile. While the last pass still has nodes
        to hand out, no new one begins: this call waits for its readers."""
        started = self.clock()
        await self._catch_up()
        feed = self._feed
        if feed is not None and feed.left:
            # The last pass has not reached every node yet: it goes on, and
            # no node is read twice before every node was read once.
            self._say_behind(feed, started)
        else:
            self._feed, self._readers = await self._begin(started)
            self._finished(feed, started)
        if self._readers:
            await asyncio.wait(self._readers, timeout=timeout)
        self._say_unreadable()
        await self._save_looks()
        await self._check_racks()
        self.last_pass_seconds = time.monotonic() - started

    async def _catch_up(self) -> None:
        """Take what commits saved since the last look from the view's feed:
        those nodes are looked at by the next pass (a new node, a new BMC
        URL), and the blocked nodes are kept (``_check_racks``). The first
        look, and one after the view was loaded anew, is at every node."""
        view = await self._nodes.loaded()
        if self._changes is None:
            self._changes = view.watch()
        everything, names = self._changes.take()
        if everything:
            self._scan_all = True
            self._blocked = {n.name: n.rack for n in view.all() if n.power_block}
            if not self._looks_restored:
                await self._restore_looks(view)
            return
        self._look_again |= names
        for name in names:
            node = view.get(name)
            if node is not None and node.power_block:
                self._blocked[name] = node.rack
            else:
                self._blocked.pop(name, None)

    async def _restore_looks(self, view: NodeView) -> None:
        """Take back the stored reads that showed no detectors (once, at
        start): each node waits out what is left of its wait, as if this
        process had made those reads. A look through another BMC URL than the
        node's is forgotten; one at a node this process has read already is
        left."""
        try:
            looks = await self._store.read(lambda tx: tx.nodes.leak_looks())
        except Exception:
            log.exception("leak detectors: the stored reads without detectors could not be read")
            return
        self._looks_restored = True
        now, wall = self.clock(), self.wall()
        taken = 0
        for name, look in looks.items():
            node = view.get(name)
            if node is None or node.bmc_url != look.bmc_url or look.none_streak < 1:
                self._looks_to_save[name] = None  # another BMC now: read afresh
                continue
            if name in self._watched:
                continue
            memory = self._memory(name)
            memory.none_at = now - max(0.0, wall - look.none_at)
            memory.none_streak = look.none_streak
            memory.none_share = 1.0 - self.rediscover_jitter * self._rng.random()
            taken += 1
        if taken:
            log.info(
                "leak detectors: %d BMCs showed none at their last reads; each is asked "
                "again when its wait ends, not now",
                taken,
            )

    async def _save_looks(self) -> None:
        """Keep this pass's reads that showed no detectors (and forget the
        looks of nodes that now show some), in one transaction."""
        if not self._looks_to_save:
            return
        batch, self._looks_to_save = self._looks_to_save, {}
        try:
            await self._store.tx(lambda tx: tx.nodes.save_leak_looks(batch))
        except Exception as e:
            for name, look in batch.items():  # the next pass tries again; newer first
                self._looks_to_save.setdefault(name, look)
            if not self._looks_failing:
                log.warning(
                    "leak detectors: %d reads without detectors not kept in the store "
                    "(tried again each pass): %s",
                    len(batch),
                    e,
                )
            self._looks_failing = True
            return
        if self._looks_failing:
            log.info("leak detectors: the reads without detectors are kept in the store again")
        self._looks_failing = False

    async def _candidates(self, now: float) -> list[NodeRecord]:
        """The nodes a pass beginning at ``now`` looks at, by name: every node
        on the first pass (and after the view was loaded anew, or the waits'
        settings changed); else those whose read ended, that were forgotten
        or saved since the last pass, and those whose wait is over. At 25,000
        nodes of which few have detectors, a pass then looks at a few dozen
        nodes, not the fleet (``_due`` judges each and sets the timer of one
        still waiting)."""
        view = await self._nodes.loaded()
        waits_set = (self.rediscover, self.rediscover_max, self.backoff, self.clock)
        if self._scan_all or waits_set != self._waits_set:
            self._scan_all, self._waits_set = False, waits_set
            self._look_again, self._timers = set(), []
            return view.all()
        names, self._look_again = self._look_again, set()
        timers = self._timers
        while timers and timers[0][0] <= now:
            names.add(heapq.heappop(timers)[1])
        return [node for name in sorted(names) if (node := view.get(name)) is not None]

    def _unread(self, name: str) -> None:
        """A node handed to no reader after all (its target could not be
        unsealed): looked at again by the next pass."""
        self._in_flight.discard(name)
        self._look_again.add(name)

    async def _begin(self, now: float) -> tuple[_Feed, list[asyncio.Task[None]]]:
        """A new pass: its feed of the nodes to read, and its readers."""
        candidates = await self._candidates(now)
        self.looked += len(candidates)
        due = await scan.select(candidates, self._due(now), size=self.scan_slice)
        # The nodes whose detectors are being watched come first, in a stable
        # order: the spread below then reads each at the same point of every
        # pass. Those only asked whether they have detectors yet follow.
        watched: list[NodeRecord] = []
        asked: list[NodeRecord] = []
        for n in due:
            (watched if self._has_detectors(n.name) else asked).append(n)
        nodes = watched + asked
        # ``concurrency`` readers take the pass's nodes in turn, the targets
        # unsealed a batch at a time: a first pass over 25,000 nodes is not
        # 25,000 tasks and one long unseal ahead of everything else. Their
        # reads are handed out over ``spread`` of the interval (``burst`` at
        # once): a wave of BMC reads does not hold up the event loop.
        for node in nodes:
            self._in_flight.add(node.name)
        feed = _Feed(
            nodes,
            max(1, self.concurrency),
            self._targets,
            self._unread,
            span=self.spread * self.interval,
            burst=self.burst,
        )
        readers = [
            self._reads.spawn(self._reader(feed))
            for _ in range(min(len(nodes), max(1, self.concurrency)))
        ]
        return feed, readers

    def _say_behind(self, feed: _Feed, now: float) -> None:
        """Once per episode: a pass outlasted the interval."""
        if self._behind_since is not None:
            return
        self._behind_since = feed.began
        log.warning(
            "leak detectors: the pass begun %.0fs ago still has %d of %d nodes to read "
            "(interval %gs): this controller reads fewer BMCs a second than the fleet "
            "needs at this interval; the next pass begins once this one has reached every node",
            now - feed.began,
            feed.left,
            feed.size,
            self.interval,
        )

    def _finished(self, feed: _Feed | None, now: float) -> None:
        """The pass before ``now``'s had reached every node: if it was one that
        outlasted the interval, say how long it took."""
        if feed is None or self._behind_since is None:
            return
        self._behind_since = None
        log.info(
            "leak detectors: a pass over %d nodes reached the last of them after %.0fs "
            "(interval %gs)",
            feed.size,
            now - feed.began,
            self.interval,
        )

    def _say_unreadable(self) -> None:
        """One log line for the BMCs that became unreadable since the last one."""
        found, self._newly_unreadable = self._newly_unreadable, []
        say_unreadable(log, "leak detectors", found, "read again after a growing delay")

    async def settle(self) -> None:
        """Wait for the reads (and what they set off) in flight (tests use this)."""
        await self._reads.settle()

    async def stop(self) -> None:
        await self._reads.stop()

    def forget(self, node: str) -> None:
        """Drop what is remembered of ``node`` (its credentials or BMC changed, or
        it was removed): the next pass reads it afresh."""
        self._watched.pop(node, None)
        self._unsupported.pop(node, None)
        self._look_again.add(node)
        self._looks_to_save[node] = None

    async def _targets(self, nodes: Collection[NodeRecord]) -> dict[str, BmcTarget]:
        """Each node's BMC target, unsealed once and kept while its BMC URL,
        username and TLS settings stay (``forget`` drops it)."""
        found: dict[str, BmcTarget] = {}
        missing = []
        for node in nodes:
            kept = self._watched.get(node.name)
            target = kept.target if kept is not None else None
            if target is not None and (
                target.url,
                target.username,
                target.insecure,
                target.ca_bundle,
            ) == (node.bmc_url, node.bmc_username, node.bmc_insecure, node.bmc_ca_bundle):
                found[node.name] = target
            else:
                missing.append(node)
        if missing:
            for target in await self._nodes.targets(missing):
                found[target.node] = target
                self._memory(target.node).target = target
        return found

    def _due(self, now: float) -> Callable[[NodeRecord], bool]:
        """Whether a pass beginning at ``now`` reads a node: its protocol may
        have detectors, it is not being read, and neither a failed read nor
        a read that showed none was too recent. One look at what is
        remembered of the node, with the waits after reads that showed none
        worked out once a pass (on the first pass it runs for every node).
        A node still waiting gets a timer for its wait's end; one being read
        is looked at again when its read ends, one whose protocol has no
        detectors when it is saved (a new BMC URL)."""
        in_flight, unsupported, watched = self._in_flight, self._unsupported, self._watched
        timers = self._timers
        cap = max(self.rediscover, self.rediscover_max)
        waits = [doubling(self.rediscover, cap, streak) for streak in range(_STREAKS)]

        def due(node: NodeRecord) -> bool:
            name = node.name
            if name in in_flight or unsupported.get(name) == node.bmc_url:
                return False
            kept = watched.get(name)
            if kept is None:
                return True
            if now < kept.retry_at:
                heapq.heappush(timers, (kept.retry_at, name))
                return False
            at = kept.none_at
            if at is None:
                return True
            when = at + waits[min(kept.none_streak, _STREAKS - 1)] * kept.none_share
            if now >= when:
                return True
            heapq.heappush(timers, (when, name))
            return False

        return due

    def _has_detectors(self, name: str) -> bool:
        """Whether ``name``'s last good read showed detectors (or a state is kept)."""
        kept = self._watched.get(name)
        return kept is not None and (bool(kept.states) or kept.seen > 0)

    def _memory(self, name: str) -> _Watched:
        kept = self._watched.get(name)
        if kept is None:
            kept = self._watched[name] = _Watched(states={})
        return kept

    async def _reader(self, feed: _Feed) -> None:
        """Read the feed's nodes one after another until it runs dry."""
        while (taken := await feed.next()) is not None:
            await self._watch(*taken)

    async def _watch(self, node: NodeRecord, target: BmcTarget) -> None:
        name = node.name
        try:
            readings = await self._read(node, target)
            if readings is not None:
                async with self._node_locks[name]:
                    await self._judge(name, node.rack, readings)
        except KilnError as e:  # e.g. the node was removed meanwhile
            log.info("node %s: leak detectors not acted on: %s", name, e)
        except Exception as e:
            # A bug: its traceback once per node, not once per node per pass.
            memory = self._memory(name)
            failure = f"{type(e).__name__}: {e}"
            if memory.unreadable != failure:
                log.exception("node %s: leak detector check failed", name)
            memory.unreadable = failure
        finally:
            self._in_flight.discard(name)
            self._look_again.add(name)  # the next pass judges it by what this read left

    async def _read(self, node: NodeRecord, target: BmcTarget) -> list[LeakReading] | None:
        """The node's readings; None when they could not be read."""
        name = node.name
        try:
            readings = await self._bmc.leak_detectors(target)
        except NotSupported:
            log.debug("node %s: its BMC has no leak detectors; not watched", name)
            self._unsupported[name] = node.bmc_url
            return None
        except KilnError as e:
            memory = self._memory(name)
            memory.failures += 1
            delay = self.backoff.delay(memory.failures, self._rng)
            memory.retry_at = self.clock() + delay
            if not memory.unreadable:
                log.debug("node %s: leak detectors unreadable: %s", name, e)
                self._newly_unreadable.append((name, str(e)))
            memory.unreadable = str(e)
            return None
        memory = self._memory(name)
        memory.failures, memory.retry_at = 0, 0.0
        memory.seen = len(readings)
        if memory.unreadable:
            log.info("node %s: leak detectors readable again", name)
            memory.unreadable = ""
        if not readings and not memory.states:
            # Nothing to watch (and nothing remembered that could change):
            # look again after ``rediscover``.
            log.debug("node %s: its BMC shows no leak detectors", name)
            memory.none_at = self.clock()
            memory.none_streak += 1
            memory.none_share = 1.0 - self.rediscover_jitter * self._rng.random()
            self._looks_to_save[name] = LeakLook(node.bmc_url, self.wall(), memory.none_streak)
        else:
            if memory.none_at is not None:  # it showed none before: no longer
                self._looks_to_save[name] = None
            memory.none_at, memory.none_streak = None, 0
        return readings

    # -- judging ---------------------------------------------------------------

    async def _judge(self, name: str, rack: str, readings: list[LeakReading]) -> None:
        """Act on one node's readings: a detector newly Critical powers the node
        off (first: it is the safety action); every other change of a
        detector's state is recorded; a detector still Critical keeps it off.
        The states are remembered only once acted on: a change whose record
        failed is acted on again by the next pass."""
        memory = self._memory(name)
        states = dict(memory.states)
        changes: list[tuple[LeakReading, LeakState, LeakState, str]] = []
        still_critical: LeakReading | None = None
        for reading in readings:
            state, why = classify(reading)
            before = states.get(reading.detector, LeakState.OK)
            states[reading.detector] = state
            if state is not before:
                changes.append((reading, state, before, why))
            elif state is LeakState.CRITICAL and still_critical is None:
                still_critical = reading
        leaks = [c for c in changes if c[1] is LeakState.CRITICAL]
        if leaks:
            reading, _, before, why = leaks[0]
            await self._leak(name, rack, reading, before, why)
        elif still_critical is not None:
            await self._keep_off(name, rack, still_critical)
        for reading, state, before, why in changes:
            if not leaks or reading is not leaks[0][0]:
                await self._changed(name, reading, state, before, why)
        memory.states = states

    async def _changed(
        self, name: str, r: LeakReading, state: LeakState, before: LeakState, why: str
    ) -> None:
        """Record a detector's new state (a leak's own event is ``_leak``'s)."""
        if state is LeakState.FAULT:
            reason = (
                f"leak detector {r.name} has a sensor fault ({why}): flagged for repair, "
                "no power action"
            )
            log.warning("node %s: %s", name, reason)
        elif state is LeakState.WARNING:
            reason = f"leak warning: detector {r.name} reports {why} (no power action)"
            log.warning("node %s: %s", name, reason)
        elif state is LeakState.CRITICAL:
            reason = f"coolant leak: detector {r.name} reports {why} too"
            log.error("node %s: %s", name, reason)
        else:
            reason = f"leak detector {r.name} reads OK again (was {before.value})"
            log.info("node %s: %s", name, reason)

        def write(tx: Tx) -> None:
            node = tx.nodes.get(name)
            if node is not None:
                extra = "; its power stays blocked until cleared" if node.power_block else ""
                record(
                    tx,
                    EventKind.NODE_LEAK,
                    node=name,
                    allocation=node.allocation_id,
                    reason=reason + extra,
                    **_fields(r, state, before, node.rack),
                )

        await self._store.tx(write)

    async def _leak(
        self, name: str, rack: str, r: LeakReading, before: LeakState, why: str
    ) -> None:
        """A detector of the node just turned Critical: block, drain, tell the
        job, power off now, then hand the node over as failed."""
        cause = f"coolant leak: detector {r.name} reports {why}"
        reason = f"{cause}; powering the tray off"
        log.error("node %s: %s", name, reason)
        await self._store.tx(lambda tx: self._block(tx, name, r, why, reason, before))
        await self._power_off(name, cause, r.read_at, known_on=True)
        await self._check_rack(rack, again=True)

    @staticmethod
    def _block(
        tx: Tx, name: str, r: LeakReading, why: str, reason: str, before: LeakState | None
    ) -> None:
        """Block the node's power (keeping an earlier block's words), drain it
        towards powered_off and, for a new leak (``before`` given), record it
        and tell the job that holds the node."""
        node = load_node(tx, name)
        if not node.power_block:
            node.power_block = (
                f"coolant leak: detector {r.name} ({r.detector}) reported {why} "
                f"at {_when(r.read_at)}"
            )
        node.drained = True
        node.drain_target = NodeState.POWERED_OFF
        node.expected_power = PowerState.OFF
        tx.nodes.save(node)
        if before is not None:
            record(
                tx,
                EventKind.NODE_LEAK,
                node=name,
                allocation=node.allocation_id,
                reason=reason,
                **_fields(r, LeakState.CRITICAL, before, node.rack),
            )
            tell_job(tx, node, f"{name}: {reason}", action="power_off")
        if node.state not in OUT_OF_SERVICE and node.state != NodeState.DRAINING:
            move(tx, node, NodeState.DRAINING, reason)

    async def _keep_off(self, name: str, rack: str, r: LeakReading) -> None:
        """A detector is still Critical: the node must stay blocked, drained and
        off; whatever of that no longer holds is done again."""
        target = self._memory(name).target
        if target is None:
            return
        reason = f"coolant leak: detector {r.name} still reports Critical"
        try:
            power = await self._bmc.power_state(target)
        except KilnError as e:
            log.warning("node %s: %s, and its power cannot be read: %s", name, reason, e)
            return
        node = await self._nodes.record(name)
        on = power != PowerState.OFF.value
        if not on and not self._needs_handover(node):
            return
        if on:
            log.error("node %s: %s, yet it is not off: powering it off again", name, reason)
        if not node.power_block or not node.drained or node.drain_target != NodeState.POWERED_OFF:
            await self._store.tx(lambda tx: self._block(tx, name, r, "Critical", reason, None))
        await self._power_off(name, reason, None, known_on=on)
        await self._check_rack(rack)

    @staticmethod
    def _needs_handover(node: NodeRecord) -> bool:
        """Whether what follows a leak's power-off is unfinished for ``node``."""
        settled = node.state == NodeState.POWERED_OFF or (
            node.state == NodeState.DRAINING and node.drain_target == NodeState.POWERED_OFF
        )
        return bool(node.allocation_id) or not settled or not node.power_block

    async def _power_off(
        self, name: str, reason: str, read_at: float | None, *, known_on: bool
    ) -> None:
        """Force the node off through its BMC (``known_on``; "already off" is
        success), then make powered_off its end and tell its allocation. A
        BMC that fails leaves the node blocked and drained; the next pass
        tries again."""
        if known_on:
            try:
                await self._nodes.power(name, "force_off")
            except KilnError as e:
                log.error("node %s: leak power-off failed (tried again next pass): %s", name, e)
                return
            if read_at is not None:
                log.warning(
                    "node %s: powered off for a coolant leak %.2fs after the reading",
                    name,
                    time.time() - read_at,
                )

        def write(tx: Tx) -> str:
            node = load_node(tx, name)
            if node.state in OUT_OF_SERVICE or (
                node.state == NodeState.DRAINING and not node.allocation_id
            ):
                move(tx, node, NodeState.POWERED_OFF, f"{reason}; powered off")
            return node.allocation_id

        if await self._store.tx(write):
            await self._on_node_failed(name, reason)

    # -- racks -----------------------------------------------------------------

    async def _check_racks(self) -> None:
        """Isolate every rack with enough blocked trays (after a restart too)."""
        await self._catch_up()  # the blocks this pass's leaks made
        counts: dict[str, int] = defaultdict(int)
        for rack in self._blocked.values():
            if rack:
                counts[rack] += 1
        for rack, blocked in sorted(counts.items()):
            if blocked >= RACK_ISOLATION_TRAYS and rack not in self._isolated:
                await self._check_rack(rack)

    async def _check_rack(self, rack: str, *, again: bool = False) -> None:
        """Two or more trays of ``rack`` blocked: drain the rest of the rack
        and request its isolation (recorded once per episode, across
        restarts). ``again`` (a new leak): look even if it was isolated, so a
        node undrained meanwhile is drained again."""
        if not rack:
            return
        async with self._rack_lock:
            if rack in self._isolated and not again:
                return
            outcome = await self._store.tx(lambda tx: isolate(tx, rack))
            if outcome is None:
                return
            self._isolated.add(rack)
        leaking, drained, requested = outcome
        if requested:
            log.error(
                "rack %s: coolant leaks on %d trays (%s): rack drained, isolation requested",
                rack,
                len(leaking),
                ", ".join(leaking),
            )
        if drained:
            log.warning("rack %s: drained for isolation: %s", rack, ", ".join(drained))

    # -- clearing --------------------------------------------------------------

    async def clear(self, name: str, reason: str = "", by: str = "") -> None:
        """Lift the node's power block (``kiln nodes clear-leak``); idempotent:
        a node without one is left as it is and nothing is recorded.

        The node stays where it is (powered off and out of service): an
        operator undrains it to bring it back. The detectors are read first.

        Raises:
            NotFound: unknown node.
            InvalidArgument: a reason with control characters, or too long.
            FailedPrecondition: a detector of the node still reads Critical.
        """
        reason = reason.strip()
        if len(reason) > MAX_REASON:
            raise InvalidArgument(f"a reason is at most {MAX_REASON} characters")
        if not reason.isprintable():
            raise InvalidArgument("the reason has control characters")
        async with self._node_locks[name]:
            node = await self._nodes.record(name)
            if not node.power_block:
                return
            readings, unread = await self._read_for_clear(node)
            still = [r for r in readings if classify(r)[0] is LeakState.CRITICAL]
            if still:
                raise FailedPrecondition(
                    f"node {name!r}: leak detector {still[0].name} still reports Critical; "
                    "repair the leak (or the detector) before clearing it"
                )

            def write(tx: Tx) -> str:
                node = load_node(tx, name)
                cleared, node.power_block = node.power_block, ""
                if not cleared:
                    return node.rack
                tx.nodes.save(node)
                record(
                    tx,
                    EventKind.NODE_LEAK_CLEARED,
                    node=name,
                    allocation=node.allocation_id,
                    reason=reason or "leak cleared by an operator",
                    by=by,
                    rack=node.rack,
                    cleared=cleared,
                    detectors_unread=unread,
                )
                return node.rack

            rack = await self._store.tx(write)
            memory = self._memory(name)
            memory.states = {r.detector: classify(r)[0] for r in readings}
            self._look_again.add(name)
        log.warning("node %s: leak cleared by %s (%s)", name, by or "an operator", reason or "-")
        await self._recount(rack)

    async def _read_for_clear(self, node: NodeRecord) -> tuple[list[LeakReading], str]:
        """The node's readings now, and why none could be read ("" if they were)."""
        target = (await self._nodes.targets([node]))[0]
        try:
            return await self._bmc.leak_detectors(target), ""
        except NotSupported:
            return [], ""
        except KilnError as e:
            return [], str(e)

    async def _recount(self, rack: str) -> None:
        """After a clear: a rack below the threshold may be isolated anew."""
        if not rack:
            return
        blocked = sum(1 for n in await self._nodes.records() if n.rack == rack and n.power_block)
        if blocked < RACK_ISOLATION_TRAYS:
            self._isolated.discard(rack)
