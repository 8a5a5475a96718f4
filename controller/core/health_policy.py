"""Runs the health policies against live reports and carries out their actions.

Agent reports become ``HealthSample``s for the pure policy engine. When a
node's agent falls silent while the node is powered on, the node's BMC
thermal sensors (Redfish) are sampled instead, so the thermal rules keep
working. Every action — executed, dry-run or held back by a cap — is recorded
as a ``policy.action`` event; executable ones drain, quarantine, power off or
power-cycle (reboot) the node through its BMC, reset its GPUs through its
agent once it is idle (``controller/core/gpu_resets.py``), and tell the job
that holds it.

Those events are also what the caps remember: before the first sample is
evaluated, the engine is given back the actions recorded within the caps'
window, so a restarted controller, or a standby that took over, goes on
counting what the rules already took down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import partial

from controller.core import scan
from controller.core.agents import AgentHub
from controller.core.errors import KilnError
from controller.core.eventlog import record
from controller.core.gpu_resets import GpuResets
from controller.core.health import GpuHealth, HealthReport
from controller.core.kept_names import KeptNames
from controller.core.kinds import EventKind
from controller.core.meter import Meter, NullMeter
from controller.core.model import BmcTarget, EventInfo
from controller.core.nodes import Nodes
from controller.core.ports import BmcGateway, Store, Tx
from controller.core.records import NodeRecord
from controller.core.states import OUT_OF_SERVICE, NodeState, PowerState
from controller.core.tasks import BackgroundTasks
from controller.core.transitions import load_node, move
from controller.core.unreadable import say_unreadable
from controller.policies import (
    Action,
    ActionKind,
    GpuReading,
    HealthSample,
    PastAction,
    PolicyEngine,
)

log = logging.getLogger(__name__)

# Silent nodes' BMCs read at once; the reads run on the BMC worker pool, whose
# own limit keeps the event loop on time (controller/bmc/loop_share.py).
DEFAULT_BMC_SAMPLE_CONCURRENCY = 64

# A node under test runs its GPUs hardest: the thermal rules must watch it too.
WATCHED = (
    NodeState.READY,
    NodeState.ALLOCATED,
    NodeState.DRAINING,
    NodeState.PREPARING,
    NodeState.TESTING,
)
# Actions that keep a node out of service after a GPU reset of it is done.
TAKES_OUT = frozenset(
    {
        ActionKind.DRAIN,
        ActionKind.QUARANTINE,
        ActionKind.POWER_OFF_GRACEFUL,
        ActionKind.POWER_OFF_NOW,
    }
)


FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED


def gpu_reading(g: GpuHealth) -> GpuReading:
    """What the policies read of one GPU (the rest of its report they ignore)."""
    fabric = not g.fabric_healthy if g.fabric_state == FABRIC_COMPLETED else None
    # Field by field, not through a dict: once per GPU of every report.
    return GpuReading(
        index=g.index,
        temp_c=g.temp_c,
        slowdown_c=g.slowdown_c,
        shutdown_c=g.shutdown_c,
        remap_failure=g.remap_failure,
        remap_pending=g.remap_pending,
        xids=g.xids,
        lost=g.lost,
        recovery_action=g.recovery_action,
        dbe_volatile=g.ecc_dbe_volatile,
        nvlink_down=len(g.nvlink_down),
        fabric_degraded=fabric,
    )


def past_actions(tx: Tx, since_at: float) -> list[PastAction]:
    """The policy actions recorded since ``since_at`` that the caps counted:
    every one not held back by a cap, executed (even if it then failed) or
    dry-run. The rack is the node's own."""
    racks: dict[str, str] = {}
    past: list[PastAction] = []
    for event in tx.events.recent(EventKind.POLICY_ACTION, since_at):
        kind = _action_kind(event)
        if kind is None or event.data.get("suppressed"):
            continue
        if event.node not in racks:
            node = tx.nodes.get(event.node)
            racks[event.node] = node.rack if node is not None else ""
        past.append(
            PastAction(
                rule=event.rule,
                node=event.node,
                rack=racks[event.node],
                kind=kind,
                at=event.at,
                dry_run=bool(event.data.get("dry_run")),
            )
        )
    return past


def _action_kind(event: EventInfo) -> ActionKind | None:
    try:
        return ActionKind(event.data.get("action", ""))
    except ValueError:
        return None


def sample_from_report(node: str, rack: str, at: float, health: HealthReport) -> HealthSample:
    """An agent's health report as a sample for the policy engine."""
    return HealthSample(
        node=node,
        rack=rack,
        at=at,
        source="agent",
        gpus=tuple(gpu_reading(g) for g in health.gpus),
    )


def _outcome(action: Action) -> str:
    """How an action that did not fail ended, for the metrics."""
    if action.executable:
        return "executed"
    return "dry_run" if action.dry_run else "capped"


class PolicyRunner:
    """Feeds the engine and executes what it decides, one action at a time.

    ``tick_interval`` (how often delayed actions, waiting GPU resets and
    silent nodes are looked at), ``silent_after`` (seconds without an agent
    report before a powered-on node is sampled through its BMC),
    ``bmc_sample_interval``, ``bmc_sample_concurrency`` and ``cycle_quiet_s`` (a node the policies
    power-cycled is not cycled again for that long: XID 79 and the recovery
    action node_reboot both ask for the same reboot) are plain attributes and
    may be changed while it runs; so are ``resets``' own.
    """

    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        agents: AgentHub,
        bmc: BmcGateway,
        engine: PolicyEngine,
        on_node_failed: Callable[[str, str], Awaitable[None]],
        *,
        tick_interval: float = 1.0,
        silent_after: float = 15.0,
        bmc_sample_interval: float = 10.0,
        clock: Callable[[], float] = time.time,
        meter: Meter | None = None,
        report_interval: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """``report_interval``: how often the agents are asked to report now
        (the controller's pace): a paced agent's reports are not gaps."""
        self._store = store
        self._report_interval = report_interval
        self._meter: Meter = meter or NullMeter()
        self._nodes = nodes
        self._agents = agents
        # Watched, powered-on nodes without an agent: the silent ones among
        # them are sampled through their BMCs.
        self._unheard = KeptNames(
            agents,
            lambda row, connected: (
                not connected and row.state in WATCHED and row.power == PowerState.ON
            ),
        )
        self._bmc = bmc
        self.engine = engine
        self._on_node_failed = on_node_failed
        self.tick_interval = tick_interval
        self._last_silent_scan = float("-inf")
        self._started_at = float("-inf")  # when ``run`` started
        self._sampling: asyncio.Task[None] | None = None  # the silent nodes' BMC reads
        self._unreadable: set[str] = set()  # nodes whose last BMC thermal read failed
        self.silent_after = silent_after
        self.bmc_sample_interval = bmc_sample_interval
        self.bmc_sample_concurrency = DEFAULT_BMC_SAMPLE_CONCURRENCY
        self._clock = clock
        self._last_bmc_sample: dict[str, float] = {}
        self._node_locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._workers = BackgroundTasks()
        self._restored = False
        self._restoring = asyncio.Lock()
        self.cycle_quiet_s = 300.0
        self._cycled: dict[str, tuple[float, str]] = {}  # node -> (when, rule)
        # A node back from a GPU reset starts its episodes afresh, as one an
        # operator undrains does: what still holds fires again.
        self.resets = GpuResets(
            store,
            nodes,
            agents,
            self._node_locks,
            self._workers,
            self._note,
            lambda node: self.engine.forget(node),
        )

    async def restore(self) -> None:
        """Give the engine's caps the actions recorded within their window
        (``policy.action`` events), once; later calls return at once.

        Called at start, and awaited before the first sample is evaluated in
        any case, so a report that arrives before the start finishes cannot
        slip past a cap. Raises what the store raises (and restores on the
        next call).
        """
        if self._restored:
            return
        async with self._restoring:
            if self._restored:
                return
            rules = self.engine.rules
            if rules.blast_radius is None:
                log.warning("the rule set has no blast_radius: only per-rule caps bound take-downs")
            since = self._clock() - rules.cap_window_s
            history = await self._store.read(partial(past_actions, since_at=since))
            counted = self.engine.restore(history)
            self._restored = True
            log.info(
                "policies: %d action(s) of the last %gs counted against the caps",
                counted,
                rules.cap_window_s,
            )

    async def observe(self, node: str, rack: str, health: HealthReport) -> None:
        """Evaluate one agent report of ``node`` and carry out what it triggers."""
        await self.restore()
        self.resets.observe(node, health)
        sample = sample_from_report(node, rack, self._clock(), health)
        self._dispatch(self.engine.observe(sample, interval_s=self._report_interval()))

    async def run(self) -> None:
        self._started_at = self._clock()
        while True:
            try:
                await self.restore()
                self._dispatch(self.engine.tick(self._clock()))
                await self.resets.advance()
                await self._sample_silent_nodes()
            except Exception:
                log.exception("policy pass failed")
            await asyncio.sleep(self.tick_interval)

    async def _sample_silent_nodes(self) -> None:
        """BMC thermal samples for powered-on nodes whose agents went silent.

        The fleet is read a few times per ``silent_after``, not every tick:
        at fleet size a read of every node each second is most of a core.
        A controller just started gives agents ``silent_after`` to come back
        before it counts them silent (after a restart every agent is
        reconnecting, and the stored last reports are as old as the
        downtime). The due nodes' BMCs are read in the background,
        ``bmc_sample_concurrency`` at once; a scan starts only once the last
        one has finished."""
        now = self._clock()
        if now - self._last_silent_scan < self.silent_after / 3:
            return
        if self._sampling is not None and not self._sampling.done():
            return
        self._last_silent_scan = now
        # Only the watched, powered-on nodes without an agent connected, kept
        # by change (``KeptNames``: at 25,000 nodes with every agent
        # connected, a look at every name was most of the idle controller's
        # policy time, every 5 seconds).
        view = await self._nodes.loaded()
        unheard = [
            node for name in sorted(await self._unheard.names(view)) if (node := view.get(name))
        ]
        due = await scan.select(  # a slice at a time: after an outage, the whole fleet
            unheard,
            lambda row: (
                now - max(self._nodes.last_seen(row), self._started_at) >= self.silent_after
                and now - self._last_bmc_sample.get(row.name, 0.0) >= self.bmc_sample_interval
            ),
        )
        if not due:
            return
        for row in due:
            self._last_bmc_sample[row.name] = now
        targets = await self._nodes.targets(due)  # one store read for the scan
        self._sampling = self._workers.spawn(
            self._sample_bmcs(list(zip(due, targets, strict=True)), now)
        )

    async def _sample_bmcs(self, due: list[tuple[NodeRecord, BmcTarget]], now: float) -> None:
        gate = asyncio.Semaphore(max(1, self.bmc_sample_concurrency))
        newly: list[tuple[str, str]] = []

        async def sample(row: NodeRecord, target: BmcTarget) -> None:
            try:
                async with gate:
                    temps = await self._bmc.thermal_c(target)
            except KilnError as e:
                if row.name not in self._unreadable:  # said once, not every scan
                    newly.append((row.name, str(e)))
                self._unreadable.add(row.name)
                return
            self._unreadable.discard(row.name)
            sample = HealthSample(
                node=row.name, rack=row.rack, at=now, source="bmc", bmc_temps_c=tuple(temps)
            )
            self._dispatch(self.engine.observe(sample))

        await asyncio.gather(*(sample(row, target) for row, target in due))
        say_unreadable(log, "BMC thermal (agent silent)", newly, "read again while it is silent")

    def forget(self, node: str) -> None:
        """Forget ``node``'s health history (back from repair, or removed)."""
        self.engine.forget(node)
        self.resets.forget(node)
        self._last_bmc_sample.pop(node, None)
        self._unreadable.discard(node)
        self._cycled.pop(node, None)

    def _dispatch(self, actions: list[Action]) -> None:
        """Carry actions out in the background, in order per node, so a slow BMC
        never holds up an agent's report stream or another node's actions."""
        by_node: dict[str, list[Action]] = defaultdict(list)
        for action in actions:
            by_node[action.node].append(action)
        for node, batch in by_node.items():
            self._workers.spawn(self._carry_out(node, batch))

    async def settle(self) -> None:
        """Wait for the actions in flight (tests use this)."""
        await self._workers.settle()

    async def stop(self) -> None:
        await self._workers.stop()

    async def _carry_out(self, node: str, actions: list[Action]) -> None:
        for action in actions:
            async with self._node_locks[node]:
                try:
                    await self._one(action)
                    self._meter.policy_action(action.rule, action.kind.value, _outcome(action))
                except KilnError as e:
                    self._meter.policy_action(action.rule, action.kind.value, "failed")
                    log.warning(
                        "node %s: policy %s action %s failed: %s",
                        action.node,
                        action.rule,
                        action.kind.value,
                        e,
                    )
                    failure = f"failed: {e}"
                    await self._store.tx(partial(self._note, action=action, outcome=failure))

    def _note(self, tx: Tx, action: Action, outcome: str) -> str:
        node = tx.nodes.get(action.node)
        allocation = node.allocation_id if node is not None else ""
        record(
            tx,
            EventKind.POLICY_ACTION,
            node=action.node,
            allocation=allocation,
            rule=action.rule,
            reason=action.reason,
            action=action.kind.value,
            dry_run=action.dry_run,
            suppressed=action.suppressed,
            outcome=outcome,
            gpus=list(action.gpus),
        )
        return allocation

    async def _one(self, action: Action) -> None:
        if not action.executable:
            why = "dry run" if action.dry_run else f"held back ({action.suppressed})"
            await self._store.tx(lambda tx: self._note(tx, action, why))
            return
        kind = action.kind
        log.warning(
            "node %s: policy %s → %s (%s)", action.node, action.rule, kind.value, action.reason
        )
        if kind in TAKES_OUT:
            self.resets.kept_out(action.node, action.rule)  # once reset, it stays out
        if kind == ActionKind.NOTIFY_JOB:
            await self._store.tx(lambda tx: self._notify_job(tx, action))
        elif kind == ActionKind.DRAIN:
            await self._store.tx(lambda tx: self._drain(tx, action, NodeState.MAINTENANCE))
        elif kind == ActionKind.QUARANTINE:
            await self._store.tx(lambda tx: self._drain(tx, action, NodeState.QUARANTINED))
            await self._on_node_failed(action.node, action.reason)
        elif kind == ActionKind.RESET_GPU:
            await self.resets.start(action)
        elif kind in (ActionKind.POWER_OFF_GRACEFUL, ActionKind.POWER_OFF_NOW):
            # Out of service first, powered_off only once the BMC has done it:
            # a power-off the BMC refuses leaves the node drained, never a
            # node that claims to be off while it runs.
            await self._store.tx(lambda tx: self._drain(tx, action, None, "powering off"))
            power = "off" if kind == ActionKind.POWER_OFF_GRACEFUL else "force_off"
            await self._nodes.power(action.node, power)
            await self._store.tx(lambda tx: self._powered_off(tx, action))
            await self._on_node_failed(action.node, action.reason)
        elif kind == ActionKind.POWER_CYCLE:
            await self._power_cycle(action)

    async def _power_cycle(self, action: Action) -> None:
        """Reboot the node through its BMC, unless the policies did within
        ``cycle_quiet_s`` (a second rule asking for the same reboot)."""
        now = self._clock()
        last = self._cycled.get(action.node)
        if last is not None and now - last[0] < self.cycle_quiet_s:
            skipped = f"skipped: power-cycled {now - last[0]:.0f}s ago by rule {last[1]}"
            await self._store.tx(lambda tx: self._note(tx, action, skipped))
            return
        await self._store.tx(lambda tx: self._note(tx, action, "power cycle"))
        await self._nodes.power(action.node, "cycle")
        for node, (at, _) in list(self._cycled.items()):
            if now - at >= self.cycle_quiet_s:
                del self._cycled[node]
        self._cycled[action.node] = (now, action.rule)

    def _notify_job(self, tx: Tx, action: Action) -> None:
        allocation = self._note(tx, action, "job notified")
        if allocation:
            record(
                tx,
                EventKind.ALLOCATION_NOTICE,
                node=action.node,
                allocation=allocation,
                rule=action.rule,
                reason=action.reason,
                action=action.kind.value,
            )

    def _drain(self, tx: Tx, action: Action, target: NodeState | None, outcome: str = "") -> None:
        """Record ``action`` and take the node out of service toward ``target``.

        The node drains (the lifecycle finishes the move once no allocation
        holds it); one already out of service moves to ``target`` directly.
        ``target=None`` keeps the out-of-service state the node is already
        headed for (maintenance when none).
        """
        self._note(tx, action, outcome or f"node to {target}")
        node = load_node(tx, action.node)
        node.drained = True
        if target is not None:
            node.drain_target = target
        elif node.drain_target not in OUT_OF_SERVICE:
            node.drain_target = NodeState.MAINTENANCE
        tx.nodes.save(node)
        why = f"{action.rule}: {action.reason}"
        if node.state != NodeState.DRAINING and node.state not in OUT_OF_SERVICE:
            move(tx, node, NodeState.DRAINING, why, rule=action.rule)
        elif target is not None and node.state in OUT_OF_SERVICE:
            move(tx, node, target, why, rule=action.rule)

    def _powered_off(self, tx: Tx, action: Action) -> None:
        """After the BMC powered the node off: make powered_off its end state."""
        node = load_node(tx, action.node)
        node.drain_target = NodeState.POWERED_OFF
        tx.nodes.save(node)
        if node.state in OUT_OF_SERVICE:
            why = f"{action.rule}: {action.reason}; powered off"
            move(tx, node, NodeState.POWERED_OFF, why, rule=action.rule)
