"""Runs the health policies against live reports and carries out their actions.

Agent reports become ``HealthSample``s for the pure policy engine. When a
node's agent falls silent while the node is powered on, the node's BMC
thermal sensors (Redfish) are sampled instead, so the thermal rules keep
working. Every action — executed, dry-run or held back by a cap — is recorded
as a ``policy.action`` event; executable ones drain, quarantine, power off or
power-cycle the node through its BMC and tell the job that holds it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from sqlmodel import Session

from controller.core.agents import AgentHub
from controller.core.errors import KilnError
from controller.core.eventlog import record
from controller.core.nodes import Nodes
from controller.core.ports import BmcGateway
from controller.core.states import OUT_OF_SERVICE, NodeState
from controller.core.tasks import BackgroundTasks
from controller.core.transitions import load_node, move
from controller.policies import Action, ActionKind, GpuReading, HealthSample, PolicyEngine
from controller.store.database import Database
from controller.store.models import NodeRow

log = logging.getLogger(__name__)

WATCHED = (NodeState.READY, NodeState.ALLOCATED, NodeState.DRAINING, NodeState.PREPARING)


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if math.isnan(number) else number


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    number = _num(value)
    return int(number) if number is not None and number.is_integer() else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _gpu_reading(g: Any) -> GpuReading | None:
    if not isinstance(g, dict):
        return None
    index = _int(g.get("index", 0))
    if index is None or index < 0:
        return None
    xids = g.get("xids")
    codes = [_int(x) for x in xids] if isinstance(xids, list | tuple) else []
    return GpuReading(
        index=index,
        temp_c=_num(g.get("temp_c")),
        slowdown_c=_num(g.get("slowdown_c")),
        shutdown_c=_num(g.get("shutdown_c")),
        dbe_volatile=_int(g.get("ecc_dbe_volatile")),
        remap_failure=_flag(g.get("remap_failure")),
        remap_pending=_flag(g.get("remap_pending")),
        xids=tuple(x for x in codes if x is not None),
        lost=g.get("lost") is True,
    )


def sample_from_report(node: str, rack: str, at: float, health: dict[str, Any]) -> HealthSample:
    """An agent's health report (plain dict of the NodeHealth message) as a sample.

    Never raises on a malformed report: a GPU entry that is not an object or
    has no usable index is left out, and any value of the wrong type, NaN or
    unparseable becomes ``None`` (unknown), which no rule acts on.
    """
    entries = health.get("gpus") if isinstance(health, dict) else None
    gpus = [_gpu_reading(g) for g in entries] if isinstance(entries, list | tuple) else []
    return HealthSample(
        node=node,
        rack=rack,
        at=at,
        source="agent",
        gpus=tuple(g for g in gpus if g is not None),
    )


class PolicyRunner:
    """Feeds the engine and executes what it decides, one action at a time.

    ``tick_interval`` (how often delayed actions and silent nodes are looked
    at), ``silent_after`` (seconds without an agent report before a powered-on
    node is sampled through its BMC) and ``bmc_sample_interval`` are plain
    attributes and may be changed while it runs.
    """

    def __init__(
        self,
        db: Database,
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
    ) -> None:
        self._db = db
        self._nodes = nodes
        self._agents = agents
        self._bmc = bmc
        self.engine = engine
        self._on_node_failed = on_node_failed
        self.tick_interval = tick_interval
        self.silent_after = silent_after
        self.bmc_sample_interval = bmc_sample_interval
        self._clock = clock
        self._last_bmc_sample: dict[str, float] = {}
        self._node_locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._workers = BackgroundTasks()

    async def observe(self, node: str, rack: str, health: dict[str, Any]) -> None:
        """Evaluate one agent report of ``node`` and carry out what it triggers.

        A malformed report counts as unknown readings; it never raises.
        """
        sample = sample_from_report(node, rack, self._clock(), health)
        self._dispatch(self.engine.observe(sample))

    async def run(self) -> None:
        while True:
            try:
                self._dispatch(self.engine.tick(self._clock()))
                await self._sample_silent_nodes()
            except Exception:
                log.exception("policy pass failed")
            await asyncio.sleep(self.tick_interval)

    async def _sample_silent_nodes(self) -> None:
        now = self._clock()
        for row in await self._nodes.rows():
            if (
                row.state not in WATCHED
                or row.power != "on"
                or self._agents.is_connected(row.name)
                or now - row.agent_last_seen < self.silent_after
                or now - self._last_bmc_sample.get(row.name, 0.0) < self.bmc_sample_interval
            ):
                continue
            self._last_bmc_sample[row.name] = now
            try:
                temps = await self._bmc.thermal_c(self._nodes.target(row))
            except KilnError as e:
                log.info("node %s: agent silent and BMC thermal unreadable: %s", row.name, e)
                continue
            sample = HealthSample(
                node=row.name, rack=row.rack, at=now, source="bmc", bmc_temps_c=tuple(temps)
            )
            self._dispatch(self.engine.observe(sample))

    def forget(self, node: str) -> None:
        """Forget ``node``'s health history (back from repair, or removed)."""
        self.engine.forget(node)
        self._last_bmc_sample.pop(node, None)

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
                except KilnError as e:
                    log.warning(
                        "node %s: policy %s action %s failed: %s",
                        action.node,
                        action.rule,
                        action.kind.value,
                        e,
                    )
                    failure = f"failed: {e}"
                    await self._db.tx(partial(self._note, action=action, outcome=failure))

    def _note(self, session: Session, action: Action, outcome: str) -> str:
        row = session.get(NodeRow, action.node)
        allocation = row.allocation_id if row is not None else ""
        record(
            session,
            "policy.action",
            node=action.node,
            allocation=allocation,
            rule=action.rule,
            reason=action.reason,
            action=action.kind.value,
            dry_run=action.dry_run,
            suppressed=action.suppressed,
            outcome=outcome,
        )
        return allocation

    async def _one(self, action: Action) -> None:
        if not action.executable:
            why = "dry run" if action.dry_run else f"held back ({action.suppressed})"
            await self._db.tx(lambda s: self._note(s, action, why))
            return
        kind = action.kind
        log.warning(
            "node %s: policy %s → %s (%s)", action.node, action.rule, kind.value, action.reason
        )
        if kind == ActionKind.NOTIFY_JOB:
            await self._db.tx(lambda s: self._notify_job(s, action))
        elif kind == ActionKind.DRAIN:
            await self._db.tx(lambda s: self._drain(s, action, NodeState.MAINTENANCE))
        elif kind == ActionKind.QUARANTINE:
            await self._db.tx(lambda s: self._drain(s, action, NodeState.QUARANTINED))
            await self._on_node_failed(action.node, action.reason)
        elif kind in (ActionKind.POWER_OFF_GRACEFUL, ActionKind.POWER_OFF_NOW):
            # Out of service first, powered_off only once the BMC has done it:
            # a power-off the BMC refuses leaves the node drained, never a
            # node that claims to be off while it runs.
            await self._db.tx(lambda s: self._drain(s, action, None, "powering off"))
            power = "off" if kind == ActionKind.POWER_OFF_GRACEFUL else "force_off"
            await self._nodes.power(action.node, power)
            await self._db.tx(lambda s: self._powered_off(s, action))
            await self._on_node_failed(action.node, action.reason)
        elif kind == ActionKind.POWER_CYCLE:
            await self._db.tx(lambda s: self._note(s, action, "power cycle"))
            await self._nodes.power(action.node, "cycle")

    def _notify_job(self, session: Session, action: Action) -> None:
        allocation = self._note(session, action, "job notified")
        if allocation:
            record(
                session,
                "allocation.notice",
                node=action.node,
                allocation=allocation,
                rule=action.rule,
                reason=action.reason,
                action=action.kind.value,
            )

    def _drain(
        self, session: Session, action: Action, target: NodeState | None, outcome: str = ""
    ) -> None:
        """Record ``action`` and take the node out of service toward ``target``.

        The node drains (the lifecycle finishes the move once no allocation
        holds it); one already out of service moves to ``target`` directly.
        ``target=None`` keeps the out-of-service state the node is already
        headed for (maintenance when none).
        """
        self._note(session, action, outcome or f"node to {target}")
        row = load_node(session, action.node)
        row.drained = True
        if target is not None:
            row.operation = target.value
        elif row.operation not in OUT_OF_SERVICE:
            row.operation = NodeState.MAINTENANCE.value
        session.add(row)
        why = f"{action.rule}: {action.reason}"
        if row.state != NodeState.DRAINING and row.state not in OUT_OF_SERVICE:
            move(session, row, NodeState.DRAINING, why, rule=action.rule)
        elif target is not None and row.state in OUT_OF_SERVICE:
            move(session, row, target, why, rule=action.rule)

    def _powered_off(self, session: Session, action: Action) -> None:
        """After the BMC powered the node off: make powered_off its end state."""
        row = load_node(session, action.node)
        row.operation = NodeState.POWERED_OFF.value
        session.add(row)
        if row.state in OUT_OF_SERVICE:
            why = f"{action.rule}: {action.reason}; powered off"
            move(session, row, NodeState.POWERED_OFF, why, rule=action.rule)
