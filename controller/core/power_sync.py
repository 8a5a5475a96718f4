"""Power-state sync: notice nodes whose power changed behind Kiln's back.

Every ``interval`` seconds, from the start of one pass to the start of the
next, all enrolled BMCs are read with bounded concurrency (a broken BMC's
breaker makes it fail fast, so it never slows the rest), past the first 32
begun evenly over half the interval, not all at once (``core/spread.py``):
a pass over a large fleet does not hold the event loop, and the agents'
reports with it, in one burst. BMCs slower than that spread asks for are
read as fast as the concurrency allows. At most ``rate`` reads begin a
second (200 by default): a fleet too large to read in the interval at that
rate is read over a longer pass, and a warning says so once, rather than
the passes taking the controller's CPU from its agents and its API; such
passes are a quarter of an interval apart. Both protect the controller's
own event loop: with BMC readers, whose CPU the reads then are, a pass
begins at once with no cap by default (``pass_pacing``).

A node whose power is not what Kiln last set, or not what its state
implies (a node in service should be on), gets one ``node.drift`` event
per change; if a job holds it, the job is told. The BMC's health is
folded into the node's status either way.

A node whose agent is connected vouches for its own power: its operating
system runs, so it is on (a node that loses power loses its agent's stream
within the controller's keepalive, ``api/keepalive.py``). Such a node, on
as Kiln expects and with a BMC that answered last time, has its BMC read
only every ``vouched_every`` passes (5 by default: every 5 minutes at the
default interval; a BMC that dies under a running node shows within that
time, not the next pass), each at a fixed pass of the cycle (by its name), so
every pass reads its share: the BMC's health stays known without 25,000
reads a minute of a fleet that is up. Every other node is read every pass
(those are kept by change, ``KeptNames``, not found each pass by a look
at every record).
``vouched_every`` 1 reads every BMC every pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable

from controller.core import scan
from controller.core.agents import AgentHub
from controller.core.eventlog import record, tell_job
from controller.core.kept_names import KeptNames
from controller.core.kinds import EventKind
from controller.core.meter import Meter, NullMeter
from controller.core.node_view import NodeView
from controller.core.nodes import Nodes
from controller.core.ports import BmcGateway, Store, Tx
from controller.core.records import BMC_ANSWERED, NodeRecord
from controller.core.states import NodeState, PowerState

log = logging.getLogger(__name__)

IN_SERVICE = (NodeState.READY, NodeState.ALLOCATED, NodeState.PREPARING)
DEFAULT_POWER_SYNC_SPREAD = 0.5  # of the interval: a pass's reads, past the first few
QUIET_SHARE = 0.25  # of the interval: the least time between one pass's end and the next
# BMC reads a second at most (0: no cap). Each read is 1.3-3.8 ms of the one
# interpreter's CPU (measured, bench/bmc_pass_spread.py, bench/bmc_power_sync.py):
# 25,000 BMCs every 60 s were more than the controller's core, and paced its
# agents to one report in 17 s. At 200 a second 10,000 BMCs take 50 s a pass.
DEFAULT_POWER_SYNC_RATE = 200.0
# A node its agent vouches for is read every this many passes.
DEFAULT_POWER_SYNC_VOUCHED_EVERY = 5


def pass_pacing(
    *, readers: bool, spread: float | None = None, rate: float | None = None
) -> tuple[float, float]:
    """The (spread, rate) a pass runs with: those given, else the defaults
    for where its reads run. In the controller's own interpreter a pass is
    spread over half the interval at 200 reads a second at most, so that its
    agents and its API keep the loop. In BMC reader processes
    (``--bmc-readers``) it shields none of them, and begun at once it costs
    half the CPU (``bench/bmc_pass_spread.py``: 0.44 ms a read against 0.91,
    5,800 reads a minute, the shape of an idle 25,000-node fleet's passes;
    the reader's own loop late by 87 ms at most for the 2 s of the pass):
    there the default is every read at once, as many at a time as the
    concurrency allows, with no cap on the rate."""
    if spread is None:
        spread = 0.0 if readers else DEFAULT_POWER_SYNC_SPREAD
    if rate is None:
        rate = 0.0 if readers else DEFAULT_POWER_SYNC_RATE
    return spread, rate


def pause_before_next(began: float, now: float, interval: float) -> float:
    """Seconds to wait before the next pass: it begins ``interval`` after the
    last one began (a pass spread over half the interval still comes round
    every interval), and never sooner than a quarter of an interval after
    the last one ended (a fleet too large for the interval at the rate cap
    is read over longer passes, with quiet time between them)."""
    return max(began + interval - now, interval * QUIET_SHARE)


def expected_power(node: NodeRecord) -> PowerState | None:
    """What Kiln believes the node's power should be (None: no opinion)."""
    if node.expected_power is not None:
        return node.expected_power
    if node.state in IN_SERVICE:
        return PowerState.ON
    return None


def vouched_for(node: NodeRecord, connected: bool) -> bool:
    """Whether the node's connected agent vouches for its power: on as Kiln
    expects, its BMC answering last time."""
    return (
        connected
        and node.power == PowerState.ON
        and node.bmc_health == BMC_ANSWERED
        and expected_power(node) in (None, PowerState.ON)
    )


def note_power(tx: Tx, node: NodeRecord, power: PowerState, health: str) -> bool:
    """Fold one reading into ``node`` and save it; True when the node is not as
    Kiln expects. Tells once per change (a ``node.drift``, and the job that
    holds the node), not on every pass."""
    node.bmc_health = health
    want = expected_power(node)
    drifted = want is not None and power != want
    if drifted and power != node.power:
        reason = f"BMC reports power {power}; Kiln expected {want}"
        record(
            tx,
            EventKind.NODE_DRIFT,
            node=node.name,
            allocation=node.allocation_id,
            reason=reason,
            expected=want.value if want else None,
            actual=power.value,
        )
        tell_job(tx, node, f"{node.name}: {reason}")
    node.power = power
    tx.nodes.save(node)
    return drifted


class PowerSync:
    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        bmc: BmcGateway,
        *,
        interval: float = 60.0,
        concurrency: int = 256,
        rate: float = DEFAULT_POWER_SYNC_RATE,
        spread: float = DEFAULT_POWER_SYNC_SPREAD,
        on_change: Callable[[], Awaitable[None]] | None = None,
        on_node_changed: Callable[[str], None] | None = None,
        meter: Meter | None = None,
        agents: AgentHub | None = None,
        vouched_every: int = DEFAULT_POWER_SYNC_VOUCHED_EVERY,
    ) -> None:
        """``on_change``: after a pass that wrote a node; ``on_node_changed``:
        for each node written (the lifecycle looks at it again: a node waiting
        for its agent that lost power is powered on at once);
        ``agents``: whose connections vouch for their nodes (None: no node is
        vouched for, every BMC is read every pass)."""
        self._store = store
        self._on_node_changed = on_node_changed
        self._meter: Meter = meter or NullMeter()
        self._on_change = on_change
        self.rows_written = 0  # by the last pass
        self._nodes = nodes
        self._bmc = bmc
        self.interval = interval
        self.concurrency = concurrency
        # The reads past the first few begin evenly over this share of the
        # interval (``core/spread.py``): 25,000 BMCs read at once would hold
        # the event loop, and every agent report with it, for seconds.
        # 0 begins them all at once, as many at a time as ``concurrency``.
        if not 0 <= spread <= 1:
            raise ValueError("the power sync spread is a share of the interval, from 0 to 1")
        self.spread = spread
        if rate < 0:
            raise ValueError("the power sync rate must be 0 (no cap) or more")
        self.rate = rate
        self._said_slow = False  # the fleet outgrew the interval at this rate: said once
        self.last_pass_seconds = 0.0
        if vouched_every < 1:
            raise ValueError("a vouched-for node's BMC is read every 1 or more passes")
        # The nodes read every pass, kept by change (``KeptNames``): no look
        # at every record each pass to find the few whose agent vouches not.
        self._unvouched = (
            KeptNames(agents, lambda node, connected: not vouched_for(node, connected))
            if agents is not None
            else None
        )
        self.vouched_every = vouched_every
        self._passes = 0
        self.skipped = 0  # BMCs the last pass left unread: their agents vouched for them

    async def run(self) -> None:
        began = time.monotonic()
        while True:
            await asyncio.sleep(pause_before_next(began, time.monotonic(), self.interval))
            began = time.monotonic()
            try:
                await self.run_once()
            except Exception:
                log.exception("power sync pass failed")

    async def run_once(self) -> list[str]:
        """Poll every BMC once; returns the nodes whose power is not as expected."""
        started = time.monotonic()
        view = await self._nodes.loaded()
        self._passes += 1
        nodes = await self._to_read(view)
        self.skipped = len(view) - len(nodes)
        targets = await self._nodes.targets(nodes)
        polled = await self._bmc.poll_power(
            targets, self.concurrency, spread=self._span(len(targets))
        )
        # Most readings change nothing: the view (what the store last
        # committed) sorts them out on the loop, a slice at a time, so the
        # database thread looks only at the nodes that changed (each again in
        # its transaction), not at every node of the fleet in one piece.
        changed, steady_drift = await self._changed(polled)
        drifted, written = (
            await self._store.tx(lambda tx: self._apply(tx, changed)) if changed else ([], [])
        )
        drifted = sorted(set(drifted).union(steady_drift))
        self.last_pass_seconds = time.monotonic() - started
        self.rows_written = len(written)
        self._meter.power_sync_pass(self.last_pass_seconds, len(written))
        log.info(
            "power sync: %d BMCs in %.1fs, %d changed, %d not as expected; %d not read "
            "(their agents vouch for them: read every %d passes)",
            len(nodes),
            self.last_pass_seconds,
            len(written),
            len(drifted),
            self.skipped,
            self.vouched_every,
        )
        if self._on_node_changed is not None:
            for name in written:
                self._on_node_changed(name)
        if written and self._on_change is not None:
            await self._on_change()  # e.g. a node held back by its BMC is free again
        return drifted

    async def _to_read(self, view: NodeView) -> list[NodeRecord]:
        """The nodes whose BMC this pass reads, by name: all but those their
        agents vouch for, each of which is read on its own pass of every
        ``vouched_every`` (by its name's CRC, so the passes share them)."""
        every = self.vouched_every
        if self._unvouched is None or every == 1:
            return view.all()
        turn = self._passes % every
        names = set(await self._unvouched.names(view))
        names.update(n for n in view.names() if zlib.crc32(n.encode()) % every == turn)
        return [node for name in sorted(names) if (node := view.get(name)) is not None]

    def _span(self, count: int) -> float:
        """Seconds a pass of ``count`` reads is spread over: ``spread`` of the
        interval, or longer if ``rate`` caps the reads a second (said once)."""
        span = self.spread * self.interval
        capped = count / self.rate if self.rate > 0 else 0.0
        if capped > self.interval and not self._said_slow:
            log.warning(
                "power sync: %d BMCs at %g a second (--power-sync-rate) take %.0fs a pass, "
                "longer than the %gs interval: each BMC is read about every %.0fs",
                count,
                self.rate,
                capped,
                self.interval,
                capped + pause_before_next(0.0, capped, self.interval),
            )
        self._said_slow = capped > self.interval
        return max(span, capped)

    async def _changed(
        self, polled: dict[str, tuple[str | None, str]]
    ) -> tuple[dict[str, tuple[str | None, str]], list[str]]:
        """The readings that differ from the node as the view has it, and the
        nodes whose reading is as stored but not as expected (drifted still)."""
        view = await self._nodes.loaded()
        steady_drift: list[str] = []

        def differs(item: tuple[str, tuple[str | None, str]]) -> bool:
            name, (power, health) = item
            node = view.get(name)
            if node is None:
                return False  # removed meanwhile
            reading = node.power if power is None else PowerState(power)
            if reading != node.power or health != node.bmc_health:
                return True
            want = expected_power(node)
            if want is not None and reading != want:
                steady_drift.append(name)
            return False

        return dict(await scan.select(list(polled.items()), differs)), steady_drift

    @staticmethod
    def _apply(tx: Tx, polled: dict[str, tuple[str | None, str]]) -> tuple[list[str], list[str]]:
        """Fold the readings in; only nodes whose power or BMC health changed
        are written. Returns (the nodes not as expected, the nodes written)."""
        drifted: list[str] = []
        written: list[str] = []
        for name, (power, health) in polled.items():
            node = tx.nodes.get(name)
            if node is None:
                continue
            reading = node.power if power is None else PowerState(power)
            if reading == node.power and health == node.bmc_health:
                want = expected_power(node)
                if want is not None and reading != want:
                    drifted.append(name)  # still drifted: told when it changed
                continue
            written.append(name)
            if power is None:  # unreadable: only the BMC's health changes
                node.bmc_health = health
                tx.nodes.save(node)
            elif note_power(tx, node, reading, health):
                drifted.append(name)
        return sorted(drifted), written
