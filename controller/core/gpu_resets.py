"""GPU resets the health policies ask for: out of service, reset once idle, back.

A ``reset_gpu`` action (``docs/policies.md``, "Recovery actions") names the
GPUs whose series fired its rule. Per node, in memory, a reset walks three
stages:

1. **Out of service.** A node no job holds goes straight to maintenance. One
   a job holds drains: the job is told (``allocation.notice``, action
   ``reset_gpu``) and keeps the node until it releases it; the lifecycle then
   moves the node to maintenance.
2. **Reset.** Once the node is in maintenance its agent resets the GPUs (the
   ``reset_gpu`` command). A reset the agent reports failed (a process still
   holds the GPU, the GPU is lost) quarantines the node with the agent's
   words; a connected agent that does not answer is asked again on later
   ticks, and after ``max_unanswered`` calls the node is quarantined.
3. **Back to service.** The first report after the reset in which every reset
   GPU's recovery action reads none sends the node back through inspection
   and preparation to ready, if the reset took it out of service; a node that
   was out of service already, or that another rule took out meanwhile, stays
   where it is. A GPU still asking for a recovery action (or lost, or not
   reported) ``verify_reports`` reports after its reset quarantines the node.

The stages are kept in memory. A restarted controller rebuilds what it can
from the GPUs themselves: the recovery action is a level, so the rule fires
again on the first report and the reset resumes from the node's state; a node
this flow took out of service is known by its reason (``RESET_MARK``). A reset
asked for by an XID (an event, which does not fire again) is not resumed: the
node stays out of service for an operator.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from controller.core.agents import AgentHub
from controller.core.errors import KilnError, NotFound
from controller.core.eventlog import tell_job
from controller.core.health import HealthReport
from controller.core.model import AgentCommand
from controller.core.nodes import Nodes
from controller.core.ports import Store, Tx
from controller.core.states import NodeState
from controller.core.tasks import BackgroundTasks
from controller.core.transitions import load_node, move
from controller.policies import Action, RecoveryAction

log = logging.getLogger(__name__)

S = NodeState

#: How a node's reason starts while a policy's GPU reset holds it out of service.
RESET_MARK = "GPU reset: "
#: Out-of-service states a GPU reset leaves alone: a reset cannot mend them.
_ENDED = frozenset({S.QUARANTINED, S.POWERED_OFF})

#: Records a ``policy.action`` event for an action with an outcome (returns
#: the allocation holding the node): ``PolicyRunner._note``.
Note = Callable[[Tx, Action, str], str]


class Stage(enum.Enum):
    WAITING = "waiting for the node to be idle"
    VERIFYING = "waiting for the recovery action to read none"


@dataclass(slots=True, eq=False)
class _Reset:
    """One node's reset in progress."""

    action: Action  # the first reset_gpu action: its rule and reason
    gpus: set[int]
    took_out: bool  # this flow took the node out of service (so brings it back)
    stage: Stage = Stage.WAITING
    busy: bool = False  # a reset or a verdict is running
    unanswered: int = 0  # reset calls a connected agent did not answer
    reports: int = 0  # reports judged since the reset
    kept_out_by: str = ""  # another rule took the node out of service meanwhile


def shown(gpus: set[int] | tuple[int, ...]) -> str:
    """``GPU 2`` or ``GPUs 0, 3``."""
    ordered = sorted(gpus)
    label = "GPU" if len(ordered) == 1 else "GPUs"
    return f"{label} {', '.join(str(i) for i in ordered)}"


class GpuResets:
    """The reset stages of every node a ``reset_gpu`` action named.

    ``start`` runs under the node's lock (the policy runner's); ``advance``
    and ``observe`` take it for the work they start. ``timeout`` (seconds an
    agent has to answer a reset), ``max_unanswered`` and ``verify_reports``
    are plain attributes.
    """

    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        agents: AgentHub,
        locks: Mapping[str, asyncio.Lock],
        workers: BackgroundTasks,
        note: Note,
        back_in_service: Callable[[str], None],
    ) -> None:
        self._store = store
        self._nodes = nodes
        self._agents = agents
        self._locks = locks
        self._workers = workers
        self._note = note
        self._back_in_service = back_in_service
        self._resets: dict[str, _Reset] = {}
        self.timeout = 60.0
        self.max_unanswered = 3
        self.verify_reports = 3

    def forget(self, node: str) -> None:
        """Drop the node's reset (an operator undrained it, or it was removed)."""
        self._resets.pop(node, None)

    def kept_out(self, node: str, rule: str) -> None:
        """Another rule drained, quarantined or powered off the node: once its
        GPUs are reset it stays out of service."""
        plan = self._resets.get(node)
        if plan is not None and rule != plan.action.rule:
            plan.kept_out_by = rule

    # -- stage 1: out of service ----------------------------------------------

    async def start(self, action: Action) -> None:
        """Carry out a ``reset_gpu`` action. Call it holding the node's lock.
        Idempotent per node: a reset under way takes the action's GPUs in.

        Raises what the store raises (NotFound: the node is gone).
        """
        if not action.gpus:
            why = "nothing to reset: the sample named no GPU"
            await self._store.tx(lambda tx: self._note(tx, action, why))
            return
        plan = self._resets.get(action.node)
        if plan is not None:
            await self._join(plan, action)
        else:
            plan = await self._store.tx(partial(self._take_out, action=action))
            if plan is None:
                return
            self._resets[action.node] = plan
        if not plan.busy:
            plan.busy = True
            try:
                await self._reset(action.node, plan)
            finally:
                plan.busy = False

    async def _join(self, plan: _Reset, action: Action) -> None:
        new = set(action.gpus) - plan.gpus
        plan.gpus |= new
        if new and plan.stage is Stage.VERIFYING:
            plan.stage = Stage.WAITING  # reset again, these GPUs with the others
        if new:
            outcome = f"{shown(new)} added to the GPU reset under way ({plan.stage.value})"
        else:
            outcome = f"the GPU reset of {shown(plan.gpus)} is under way ({plan.stage.value})"
        await self._store.tx(lambda tx: self._note(tx, action, outcome))

    def _take_out(self, tx: Tx, action: Action) -> _Reset | None:
        """Take the node out of service for the reset, in one transaction with
        the action's event; None when the node is past what a reset mends."""
        node = load_node(tx, action.node)
        gpus = shown(action.gpus)
        if node.state in _ENDED or (node.state == S.DRAINING and node.drain_target in _ENDED):
            where = node.state if node.state in _ENDED else f"draining to {node.drain_target}"
            self._note(tx, action, f"not reset: the node is {where}")
            return None
        plan = _Reset(action, set(action.gpus), took_out=True)
        if node.state in (S.DRAINING, S.MAINTENANCE):
            plan.took_out = node.state_reason.startswith(RESET_MARK)
            self._note(tx, action, f"{gpus} reset once the node is idle")
            return plan
        self._note(tx, action, f"node out of service: {gpus} reset once it is idle")
        why = f"{RESET_MARK}{action.rule}: {action.reason}"
        node.drained = True
        node.drain_target = S.MAINTENANCE
        tx.nodes.save(node)
        move(tx, node, S.DRAINING, why, rule=action.rule)
        if node.allocation_id:
            needs = "needs" if len(action.gpus) == 1 else "need"
            tell_job(
                tx,
                node,
                f"{gpus} {needs} a reset ({action.reason}): the node drains and is reset "
                "once the allocation releases it",
                rule=action.rule,
                action=action.kind.value,
                gpus=list(action.gpus),
            )
        else:
            move(tx, node, S.MAINTENANCE, why, rule=action.rule)
        return plan

    # -- stage 2: the reset ---------------------------------------------------

    async def advance(self) -> None:
        """Start the reset of every waiting node that has become idle, and
        drop the resets of nodes that went where a reset cannot follow. Reads
        the nodes from memory; call it every policy tick."""
        for name, plan in list(self._resets.items()):
            if plan.busy or plan.stage is not Stage.WAITING:
                continue
            try:
                node = await self._nodes.record(name)
            except NotFound:
                self._resets.pop(name, None)
                continue
            if node.state == S.MAINTENANCE:
                if self._agents.is_connected(name):
                    plan.busy = True
                    self._spawn(name, plan, self._reset(name, plan))
            elif node.state != S.DRAINING or node.drain_target in _ENDED:
                log.info("node %s: GPU reset dropped: the node is %s", name, node.state)
                self._resets.pop(name, None)

    async def _reset(self, name: str, plan: _Reset) -> None:
        """Ask the agent to reset the plan's GPUs, if the node is (still)
        waiting in maintenance. Call it holding the node's lock."""
        node = await self._nodes.record(name)
        if plan.stage is not Stage.WAITING or node.state != S.MAINTENANCE:
            return
        if not self._agents.is_connected(name):
            return  # ``advance`` starts it once the agent is back
        gpus = sorted(plan.gpus)
        command = AgentCommand("reset_gpu", json.dumps(gpus))
        try:
            outcome = await self._agents.call(name, command, self.timeout)
        except KilnError as e:  # no agent, or no answer: ask again on a later tick
            plan.unanswered += 1
            log.warning(
                "node %s: GPU reset of %s not answered (%d of %d): %s",
                name,
                shown(plan.gpus),
                plan.unanswered,
                self.max_unanswered,
                e,
            )
            if plan.unanswered >= self.max_unanswered:
                await self._quarantine(name, plan, f"the agent did not answer: {e}")
            return
        if not outcome.ok:
            failure = "; ".join(outcome.failures) or outcome.message or "the agent said no"
            await self._quarantine(name, plan, failure)
            return
        plan.stage = Stage.VERIFYING
        plan.reports = 0
        log.info("node %s: %s reset; waiting for a clean report", name, shown(plan.gpus))

        def write(tx: Tx) -> None:
            self._note(tx, plan.action, f"{shown(plan.gpus)} reset; {plan.stage.value}")
            node = load_node(tx, name)
            if plan.took_out and node.state == S.MAINTENANCE:
                node.state_reason = f"{RESET_MARK}{shown(plan.gpus)} reset by {plan.action.rule}"
                tx.nodes.save(node)

        await self._store.tx(write)

    async def _quarantine(self, name: str, plan: _Reset, failure: str) -> None:
        """The reset failed: quarantine the node (idle: no job to replace)."""
        self._resets.pop(name, None)
        reason = f"{plan.action.rule}: GPU reset failed: {failure}"

        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            self._note(tx, plan.action, f"reset failed: {failure}; node quarantined")
            if node.state in (S.MAINTENANCE, S.DRAINING):
                node.drained = True
                node.drain_target = S.QUARANTINED
                tx.nodes.save(node)
                move(tx, node, S.QUARANTINED, reason, rule=plan.action.rule)

        await self._store.tx(write)
        log.warning("node %s: quarantined: %s", name, reason)

    # -- stage 3: back to service ---------------------------------------------

    def observe(self, name: str, health: HealthReport) -> None:
        """Judge a report of a node whose GPUs were reset: back to service once
        every reset GPU's recovery action reads none."""
        plan = self._resets.get(name)
        if plan is None or plan.busy or plan.stage is not Stage.VERIFYING or not health.gpus:
            return
        plan.reports += 1
        by_index = {g.index: g for g in health.gpus}
        still: list[str] = []
        for index in sorted(plan.gpus):
            gpu = by_index.get(index)
            if gpu is None:
                still.append(f"GPU {index} is not reported")
            elif gpu.lost:
                still.append(f"GPU {index} is lost")
            elif gpu.recovery_action != RecoveryAction.NONE:
                known = RecoveryAction.known(gpu.recovery_action)
                wanted = known.label if known is not None else str(gpu.recovery_action)
                still.append(f"GPU {index} still asks for {wanted}")
        if not still:
            plan.busy = True
            self._spawn(name, plan, self._finish(name, plan))
        elif plan.reports >= self.verify_reports:
            plan.busy = True
            failure = f"{'; '.join(still)} {plan.reports} reports after its reset"
            self._spawn(name, plan, self._quarantine(name, plan, failure))

    async def _finish(self, name: str, plan: _Reset) -> None:
        """The reset GPUs read none: back to service, if the reset took the
        node out of service and nothing else keeps it out."""
        self._resets.pop(name, None)
        gpus = shown(plan.gpus)

        def write(tx: Tx) -> bool:
            node = load_node(tx, name)
            if node.state != S.MAINTENANCE:
                self._note(tx, plan.action, f"{gpus} reset; the node is {node.state} now")
                return False
            if not plan.took_out or plan.kept_out_by:
                held = f"rule {plan.kept_out_by}" if plan.kept_out_by else "it was out before"
                self._note(tx, plan.action, f"{gpus} reset; the node stays in maintenance ({held})")
                return False
            self._note(tx, plan.action, f"{gpus} reset, recovery action none: back to service")
            node.drained = False
            node.drain_target = None
            tx.nodes.save(node)
            why = f"{plan.action.rule}: {gpus} reset and healthy: back to service"
            move(tx, node, S.INSPECTING, why, rule=plan.action.rule)
            return True

        if await self._store.tx(write):
            log.info("node %s: %s reset; back to service", name, gpus)
            self._back_in_service(name)

    # -- plumbing ---------------------------------------------------------------

    def _spawn(self, name: str, plan: _Reset, work: Coroutine[Any, Any, None]) -> None:
        async def locked() -> None:
            try:
                async with self._locks[name]:
                    if self._resets.get(name) is plan:
                        await work
                    else:
                        work.close()  # forgotten meanwhile (undrained, removed)
            except KilnError as e:
                log.warning("node %s: GPU reset step failed: %s", name, e)
            finally:
                plan.busy = False

        self._workers.spawn(locked(), name=f"kiln-gpu-reset-{name}")
