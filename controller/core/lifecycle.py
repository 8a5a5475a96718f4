"""The reconciler that walks nodes through their lifecycle.

Each pass takes, for each node due one, the one next step its state calls for:

    enrolled   → inspecting   (always)
    inspecting → preparing    once the BMC answered, the node is powered on and
                              its agent has registered its GPUs
    preparing  → ready        once the agent applied the node's GPU profile (or
                              reset the GPUs to defaults); a failure that cannot
                              pass (NotSupported, PreparationFailed) quarantines
                              at once, any other is retried with exponential
                              backoff per node and quarantines after
                              ``RetryPolicy.max_attempts`` attempts
    inspecting → testing      instead, when the check suite gates intake (a node
                              that never passed a run) or repair (one that
                              did): ``CheckRunner`` runs the level and moves
                              it to preparing, or quarantines it
    testing    → (its run)    a node found testing with no run in flight (the
                              controller restarted) runs its level again
    releasing  → ready        once the agent reset the GPUs; preparing when the
                              GPUs' state is unknown (no agent); a reset the
                              agent could not finish quarantines, with its reasons
    draining   → maintenance  (or the out-of-service state the drain asked for)
                              once no allocation holds the node
    provisioning → inspecting once the catalogue image is inserted, the node
                              booted from it and its agent registered again;
                              quarantined when no agent came in time
                              (``core/provisioning.py``)

Every step is idempotent and every state is persisted before its work starts,
so a controller killed at any point resumes where it was on the next pass.

A pass looks only at the nodes that may be due a step: those saved or
removed since the last pass (the node view's feed), those whose backoff ended
(a heap of deadlines), and those whose step finished or that were poked. So
idle ready, allocated and out-of-service nodes cost nothing however many
there are, and neither do nodes waiting out a backoff: 22,500 nodes waiting
for their agents cost a pass only the few whose wait ends. A node whose step
fails (its BMC does not answer, say) or makes no progress (waiting for its
agent) waits before its next step, longer after each (``StepBackoff``:
doubling, capped, jittered); a change that may unblock it (its agent
registers, an operator acts) clears the wait (``poke``). Capacity that
appears without a step of the lifecycle's own (a BMC answering again) is
reported by power sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controller.core.agents import AgentHub
from controller.core.allocations import mark_ready_if_prepared
from controller.core.backoff import StepBackoff
from controller.core.checks import CheckRunner, testing_reason
from controller.core.errors import InvalidArgument, KilnError, NotFound, NotSupported, Unavailable
from controller.core.model import AgentCommand
from controller.core.node_view import NodeFeed, NodeView
from controller.core.nodes import Nodes
from controller.core.ports import BmcGateway, Store, Tx
from controller.core.preparation import PreparationFailed, Preparer, gate_problems
from controller.core.profiles import HealthGate, ProfileCatalog
from controller.core.provisioning import Provisioner
from controller.core.records import NodeRecord
from controller.core.states import MEMBERS, NodeState, PowerState
from controller.core.tasks import BackgroundTasks
from controller.core.transitions import load_node, move
from controller.core.unreadable import say_nodes

log = logging.getLogger(__name__)

IDLE_MAX_DELAY_S = 600.0  # longest wait between looks at a node waiting for its agent
# ... once its BMC says it is on: only a fallback, as its agent's registration
# pokes it and power sync's reading of it off does too.
AGENT_WAIT_MAX_DELAY_S = 3600.0

S = NodeState

# Drains that end a node's service: its job gets a replacement at once.
FAILED = frozenset({NodeState.QUARANTINED, NodeState.POWERED_OFF})

# Preparation failures that no retry can mend: the node is quarantined at once.
# Anything else (an unreachable BMC, an agent that did not answer) is retried.
PERMANENT = (NotSupported, PreparationFailed, InvalidArgument, NotFound)


@dataclass(frozen=True)
class RetryPolicy:
    """How a node's failing preparation is retried: the n-th failed attempt
    waits ``first_delay_s * 2**(n-1)`` seconds (at most ``max_delay_s``) before
    the next; after ``max_attempts`` failed attempts the node is quarantined."""

    first_delay_s: float = 1.0
    max_delay_s: float = 120.0
    max_attempts: int = 10  # about 6 minutes of retries with the defaults

    def delay(self, failures: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** max(0, failures - 1))


# A countdown inside an error ("next probe in 29.8s") would make the node's
# state_reason, and so its row, change on every failed step.
_COUNTDOWN = re.compile(r"; next probe in [0-9.]+s")


def _steady(reason: str) -> str:
    return _COUNTDOWN.sub("", reason)


# The states a pass reads: each calls for a step.
STEPPING = (
    S.ENROLLED,
    S.INSPECTING,
    S.PREPARING,
    S.RELEASING,
    S.DRAINING,
    S.TESTING,
    S.PROVISIONING,
)
_STEPPING = frozenset(STEPPING)


@dataclass
class _Backoff:
    """One node's failed (or idle) steps in a row, in memory only; forgotten
    when the node's state changes."""

    state: NodeState
    failures: int = 0
    retry_at: float = 0.0  # on the lifecycle's clock


class Lifecycle:
    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        agents: AgentHub,
        bmc: BmcGateway,
        profiles: ProfileCatalog,
        on_capacity: Callable[[], Awaitable[None]],
        on_node_failed: Callable[[str, str], Awaitable[None]],
        *,
        interval: float = 1.0,
        command_timeout: float = 120.0,
        max_parallel: int = 64,
        preparer: Preparer | None = None,
        retry: RetryPolicy | None = None,
        step_backoff: StepBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        checks: CheckRunner | None = None,
        provisioner: Provisioner | None = None,
    ) -> None:
        """``checks``: the health-check runner; None runs no checks (a node
        goes from inspection straight to preparation). ``provisioner``: steps
        provisioning nodes; None sends one found provisioning to inspection."""
        self._store = store
        self._provisioner = provisioner
        self._checks = checks
        self._nodes = nodes
        self._agents = agents
        self._bmc = bmc
        self._profiles = profiles
        self._on_capacity = on_capacity
        self._on_node_failed = on_node_failed
        self._interval = interval
        self._command_timeout = command_timeout
        self._gate = asyncio.Semaphore(max_parallel)
        self._preparer = preparer or Preparer(bmc)
        self._busy: set[str] = set()
        # Per node, while its preparation fails; gone once it leaves preparing.
        # Public so that tests and the wiring may tune them.
        self.retry = retry or RetryPolicy()
        self.step_backoff = step_backoff or StepBackoff()
        # A node that waits for its agent is poked when the agent registers;
        # until then it is looked at again (its power read through its BMC)
        # at most every 10 minutes, not every minute: 22,500 such nodes cost
        # a core at the failure backoff's cap.
        self.idle_backoff = StepBackoff(max_delay_s=IDLE_MAX_DELAY_S)
        self.agent_wait = StepBackoff(max_delay_s=AGENT_WAIT_MAX_DELAY_S)
        self.clock = clock
        self._rng = rng or random.Random()
        self._backoff: dict[str, _Backoff] = {}
        self._failed_steps: list[tuple[str, str]] = []  # node, why: said on the next pass
        self._poked: set[str] = set()  # poked while a step of theirs ran
        # What the next pass looks at, beside the view's feed of saved nodes:
        # steps that finished or nodes poked, and the ends of backoffs.
        self._feed: NodeFeed | None = None
        self._look_again: set[str] = set()
        self._timers: list[tuple[float, str]] = []  # (retry_at, node), a heap
        self.looked = 0  # nodes looked at by all passes (tests, benchmarks)
        self._steps = BackgroundTasks()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def poke(self, node: str) -> None:
        """Something changed for ``node`` (its agent registered, an operator
        acted): forget its wait and look at it on the next pass, now. A
        step in flight that then fails or waits does not back it off: it
        saw the node from before the change."""
        if node in self._busy:
            self._poked.add(node)
        self._look_again.add(node)
        backoff = self._backoff.get(node)
        if backoff is not None and backoff.state != S.PREPARING:
            del self._backoff[node]  # preparation attempts still count
        elif backoff is not None:
            backoff.retry_at = 0.0
        self.wake()

    def forget(self, node: str) -> None:
        """Drop a removed node's backoff."""
        self._backoff.pop(node, None)
        self._look_again.discard(node)

    def waiting(self, node: str) -> float:
        """Seconds until the node's next step may run (0: not backing off)."""
        backoff = self._backoff.get(node)
        return max(0.0, backoff.retry_at - self.clock()) if backoff is not None else 0.0

    async def run(self) -> None:
        """Reconcile until cancelled."""
        while True:
            try:
                await self.reconcile_once()
            except Exception:  # a pass must never kill the loop
                log.exception("lifecycle pass failed")
            self._wake.clear()
            try:
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def reconcile_once(self) -> None:
        """Start one step for every node due one: in a state that calls for a
        step, not busy and not waiting out a backoff. Looks only at the nodes
        that may have become due since the last pass (the module docstring)."""
        self._say_failed_steps()
        view = await self._nodes.loaded()
        if self._feed is None:
            self._feed = view.watch()
        everything, names = self._feed.take()
        if everything:  # the first pass, or the view was loaded anew
            names = {n.name for n in view.in_states(STEPPING)} | set(self._backoff)
        names |= self._look_again
        self._look_again = set()
        now = self.clock()
        timers = self._timers
        while timers and timers[0][0] <= now:
            names.add(heapq.heappop(timers)[1])
        self.looked += len(names)
        for name in sorted(names):
            node = self._due(view, name, now)
            if node is not None:
                self._busy.add(name)
                self._steps.spawn(self._step_guarded(node))

    def _due(self, view: NodeView, name: str, now: float) -> NodeRecord | None:
        """The node, when a step of it may start now. A node not due now is
        looked at again when that may change: its step ends (busy), its
        backoff ends (a timer), or it is saved (the feed)."""
        node = view.get(name)
        backoff = self._backoff.get(name)
        if node is None or node.state not in _STEPPING:
            if backoff is not None:
                del self._backoff[name]
            return None
        if backoff is not None and backoff.state != node.state:  # moved on: a fresh start
            del self._backoff[name]
        elif backoff is not None and now < backoff.retry_at:
            return None
        return None if name in self._busy else node

    def _say_failed_steps(self) -> None:
        """One warning line for the steps that failed since the last."""
        found, self._failed_steps = self._failed_steps, []
        say_nodes(
            log,
            logging.WARNING,
            found,
            one="node %s: %s",
            many="lifecycle steps of %d nodes failed (each stepped again after a growing "
            "delay); node %s: %s; also %s",
        )

    async def _capacity_guarded(self) -> None:
        try:
            await self._on_capacity()
        except Exception:
            log.exception("scheduling pass after a capacity change failed")

    async def settle(self) -> None:
        """Wait for the steps in flight (tests and the demo use this), and
        say the ones that failed."""
        await self._steps.settle()
        self._say_failed_steps()

    async def stop(self) -> None:
        await self._steps.stop()
        self._say_failed_steps()

    async def _step_guarded(self, row: NodeRecord) -> None:
        try:
            async with self._gate:
                became_free = await self._step(row)
            if became_free:
                await self._on_capacity()
        except KilnError as e:
            failures, delay = self._back_off(await self._current(row), idle=False)
            said = f"{e} (step {failures} failed; next in {delay:.0f}s)"
            # The 1st, 2nd, 4th, 8th… failure in a row is a warning, the
            # rest debug, and the warnings of a pass share one line: a rack
            # (or a fleet) of dead BMCs must not flood the log every minute.
            if failures & (failures - 1) == 0:
                self._failed_steps.append((row.name, said))
            else:
                log.debug("node %s: %s", row.name, said)
            await self._note(row.name, _steady(str(e)))
        except Exception:
            log.exception("node %s: lifecycle step failed", row.name)
            with contextlib.suppress(Exception):
                self._back_off(await self._current(row), idle=False)
        finally:
            self._busy.discard(row.name)
            self._look_again.add(row.name)  # due again unless it backed off or moved
            if row.name in self._poked:
                self._poked.discard(row.name)
                self.wake()  # the pass its poke woke skipped it, busy

    async def _current(self, row: NodeRecord) -> NodeRecord:
        """The node as stored now (a step may have moved it before it failed)."""
        try:
            return await self._row(row.name)
        except NotFound:
            return row

    def _back_off(self, row: NodeRecord, *, idle: bool, longest: bool = False) -> tuple[int, float]:
        """Count a step that failed (or, ``idle``, made no progress) and set
        when the node may step again; returns (steps in a row, the delay).
        ``longest``: wait ``agent_wait``'s cap at once (what the node waits
        for will poke it). Preparation counts its own attempts
        (``_preparation_failed``)."""
        backoff = self._backoff.get(row.name)
        if backoff is None or backoff.state != row.state:
            backoff = self._backoff[row.name] = _Backoff(row.state)
        backoff.failures += 1
        if longest:
            delay = self.agent_wait.longest(self._rng)
        else:
            policy = self.idle_backoff if idle else self.step_backoff
            delay = policy.delay(backoff.failures, self._rng)
        if row.name in self._poked:
            delay = 0.0  # poked while this step ran: look again on the next pass
        self._wait(row.name, backoff, delay)
        return backoff.failures, delay

    def _wait(self, name: str, backoff: _Backoff, delay: float) -> None:
        backoff.retry_at = self.clock() + delay
        heapq.heappush(self._timers, (backoff.retry_at, name))

    async def _step(self, row: NodeRecord) -> bool:
        """Take one step; True when the node just became ready."""
        state = row.state
        if row.kind in MEMBERS and state in (S.ENROLLED, S.INSPECTING):
            return await self._member(row)
        if state == S.ENROLLED:
            # Only from enrolled: since this step began, a provisioning
            # request may have taken the node (a rack bring-up with an
            # image), and inspecting it now would hijack that.
            if not await self._move(
                row.name, S.INSPECTING, "inspection started", only_from=S.ENROLLED
            ):
                return False
            return await self._step(await self._row(row.name))
        if state == S.INSPECTING:
            return await self._inspect(row)
        if state == S.PREPARING:
            return await self._prepare(row)
        if state == S.RELEASING:
            return await self._release(row)
        if state == S.PROVISIONING:
            return await self._provision(row)
        if state == S.TESTING:
            if self._checks is None:  # a suite was configured before a restart
                if not await self._move(
                    row.name, S.PREPARING, "no check suite configured", only_from=S.TESTING
                ):
                    return False  # the row was stale: the node has moved on
                return await self._prepare(await self._row(row.name))
            if not self._checks.running(row.name) and not self._agents.is_connected(row.name):
                self._back_off(row, idle=True)  # its registration pokes the node
                return False
            self._checks.resume(row)  # a run in flight stays; the run's end pokes it
            self._back_off(row, idle=True)
            return False
        if state == S.DRAINING and row.allocation_id and row.drain_target in FAILED:
            # A failed node still held by its job (a restart came between the
            # failure and its replacement): replace it now. Idempotent.
            await self._on_node_failed(row.name, row.state_reason or "node failed")
            return False
        if state == S.DRAINING and not row.allocation_id:
            await self._gpu_command(row.name, AgentCommand("reset_gpus"), best_effort=True)
            await self._finish_drain(row.name)
        return False

    async def _finish_drain(self, name: str) -> None:
        """Move a drained node to its out-of-service state, as stored now: while
        the GPUs were reset a policy may have ended the drain itself (a thermal
        power-off moves it to powered_off), which a stale target would undo."""

        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            if node.state != S.DRAINING or node.allocation_id:
                return
            move(tx, node, node.drain_target or S.MAINTENANCE, node.state_reason or "drained")

        await self._store.tx(write)

    async def _provision(self, row: NodeRecord) -> bool:
        """One provisioning step; inspects the node at once when its agent is back."""
        if self._provisioner is None:
            if not await self._move(
                row.name, S.INSPECTING, "no provisioner configured", only_from=S.PROVISIONING
            ):
                return False  # the row was stale: the node has moved on
            return await self._step(await self._row(row.name))
        moved = await self._provisioner.step(row)
        if moved is None:  # waiting: for a slot, or for the agent (its registration pokes)
            self._back_off(row, idle=True)
            return False
        if moved:
            return await self._step(await self._row(row.name))
        return False

    async def _member(self, row: NodeRecord) -> bool:
        """A switch tray or power shelf: no agent, no GPUs. Powered on (unless
        Kiln last powered it off), then ready: never schedulable, since only
        compute nodes are ever placed (docs/bring-up.md)."""
        target = await self._nodes.target(row)
        power = PowerState(await self._bmc.power_state(target))
        if power == PowerState.OFF and row.expected_power != PowerState.OFF:
            power = (await self._nodes.power(row.name, "on")).power
        elif power != row.power:
            await self._nodes.power(row.name, "status")
        if power != PowerState.ON:
            await self._note(row.name, f"rack member: waiting for power on (BMC says {power})")
            self._back_off(row, idle=True)
            return False
        what = row.kind.value.replace("_", " ")
        if row.state == S.INSPECTING:  # undrained: nothing to inspect
            await self._move(row.name, S.ENROLLED, f"a {what} has nothing to inspect")
        await self._move(row.name, S.READY, f"rack member ({what}): powered on, never allocated")
        return False

    async def _inspect(self, row: NodeRecord) -> bool:
        target = await self._nodes.target(row)
        power = PowerState(await self._bmc.power_state(target))
        if power == PowerState.OFF and row.expected_power != PowerState.OFF:
            await self._nodes.power(row.name, "on")
        elif power != row.power:
            await self._nodes.power(row.name, "status")
        if not self._agents.is_connected(row.name) or row.gpu_count == 0:
            await self._note_once(row, "powered on; waiting for the node's agent to register")
            # Its registration pokes the node, and power sync's reading saves
            # it (so the view's feed brings it back) if the power goes off:
            # once the BMC says on, looking again is only a fallback.
            self._back_off(row, idle=True, longest=power == PowerState.ON)
            return False
        if self._checks is not None:
            passed_before = await self._checks.ever_passed(row.name)
            level, trigger = self._checks.gate_level(passed_before=passed_before)
            if level:
                await self._move(row.name, S.TESTING, testing_reason(level, trigger))
                self._checks.start(row, level, trigger)
                return False
        await self._move(row.name, S.PREPARING, f"inspected: {row.gpu_count} GPUs")
        return await self._prepare(await self._row(row.name))

    async def _prepare(self, row: NodeRecord) -> bool:
        """One preparation attempt. Never raises: a failure is counted (see
        ``_preparation_failed``) and the next attempt waits its backoff."""
        if not self._agents.is_connected(row.name):
            await self._note_once(row, "waiting for the node's agent to prepare the GPUs")
            self._back_off(row, idle=True)  # its registration pokes the node
            return False
        profile_name = row.wanted_profile
        try:
            async with self._preparer.preparing.slot(row.rack or row.name):
                became_ready = await self._prepare_to(row, profile_name)
        except Exception as e:  # every failure is an attempt, even a bug's
            await self._preparation_failed(row.name, profile_name, e)
            return False
        self._backoff.pop(row.name, None)
        return became_ready

    async def _preparation_failed(self, name: str, profile_name: str, error: Exception) -> None:
        """Quarantine the node when ``error`` is permanent or its attempts are
        used up; otherwise note the failure and back off. One warning per
        attempt. A node no longer preparing (drained meanwhile) is left alone."""
        backoff = self._backoff.get(name)
        if backoff is None or backoff.state != S.PREPARING:
            backoff = self._backoff[name] = _Backoff(S.PREPARING)
        backoff.failures += 1
        n, most = backoff.failures, self.retry.max_attempts
        what = f"cannot reach profile {profile_name or 'defaults'}: {error}"
        if isinstance(error, PERMANENT) or n >= most:
            del self._backoff[name]
            reason = what if isinstance(error, PERMANENT) else f"{what} (after {n} attempts)"
            held_by = await self._quarantine(name, reason, only_from=S.PREPARING)
            if held_by:
                await self._on_node_failed(name, f"preparation failed: {error}")
            return
        delay = self.retry.delay(n)
        self._wait(name, backoff, delay)
        log.warning(
            "node %s: preparation attempt %d of %d failed, next in %.0fs: %s",
            name,
            n,
            most,
            delay,
            error,
            exc_info=not isinstance(error, KilnError),
        )
        await self._note(
            name, f"preparation attempt {n} of {most} failed, next in {delay:.0f}s: {error}"
        )

    async def _prepare_to(self, row: NodeRecord, profile_name: str) -> bool:
        """Prepare the node to ``profile_name``; True when it just became ready.

        Raises:
            PreparationFailed, NotSupported: the profile cannot be reached.
            BmcError, Unavailable and kin: the BMC or the agent failed.
        """
        profile = self._profiles.get(profile_name) if profile_name else None
        changed: list[str] = []
        if profile is not None and (profile.firmware or profile.bios):
            done = await self._preparer.bmc_steps(
                await self._nodes.target(row), row.rack or row.name, profile
            )
            changed = done.changed
            if done.cycled_at is not None:
                await self._await_new_boot(row.name, done.cycled_at)
        if profile is not None:
            command = AgentCommand("apply_profile", profile.gpu_yaml())
        else:
            command = AgentCommand("reset_gpus")
        started = time.time()
        outcome = await self._agents.call(row.name, command, self._command_timeout)
        if not outcome.ok:
            reason = "; ".join(outcome.failures) or outcome.message or "preparation failed"
            raise PreparationFailed(reason)
        if profile is not None and profile.health_gate is not None:
            await self._health_gate(row.name, profile.health_gate, started)
        if profile is not None and profile.checks and self._checks is not None:
            run = await self._checks.run_inline(row, profile.checks, "hand_off")
            if not run.passed:
                raise PreparationFailed(f"check failed before hand-off: {run.reason}")
        changed += outcome.changed

        def write(tx: Tx) -> bool:
            node = load_node(tx, row.name)
            node.applied_profile = profile_name
            tx.nodes.save(node)
            if node.wanted_profile != profile_name:
                # Released (or booked anew) while the agent worked: these GPUs
                # are not what the node needs now; the next pass prepares again.
                return False
            node.allocation_profile = None
            tx.nodes.save(node)
            reason = f"prepared to {profile_name or 'defaults'}"
            if node.allocation_id:
                move(
                    tx,
                    node,
                    S.ALLOCATED,
                    f"{reason} for {node.allocation_id}",
                    changed=changed,
                )
                mark_ready_if_prepared(tx, node.allocation_id)
                return False
            move(tx, node, S.READY, reason, changed=changed)
            return True

        return await self._store.tx(write)

    async def _await_new_boot(self, name: str, cycled_at: float) -> None:
        """Wait for the agent of the boot the power cycle began: the old
        boot's may still look connected, and what it applied is gone.

        Raises:
            Unavailable: no agent registered within the boot timeout.
        """
        timeout = self._preparer.limits.boot_timeout_s
        await self._note(name, "power-cycled to apply firmware/BIOS; waiting for the node's agent")
        if not await self._agents.attached_since(name, cycled_at, timeout):
            raise Unavailable(
                f"no agent registered within {timeout:.0f}s of the power cycle "
                "that applied firmware/BIOS"
            )

    async def _health_gate(self, name: str, gate: HealthGate, since: float) -> None:
        """Wait for a health sample taken after ``since`` and check it against ``gate``.

        Raises PreparationFailed with every problem found, or when no fresh
        sample arrives within the gate's timeout.
        """
        deadline = time.monotonic() + gate.sample_timeout_s
        while True:
            health = self._nodes.latest_health(await self._row(name))
            if health is not None and health.sampled_at > since:
                problems = gate_problems(gate, health)
                if problems:
                    raise PreparationFailed("health gate: " + "; ".join(problems))
                return
            if time.monotonic() > deadline:
                raise PreparationFailed(
                    f"health gate: no health sample within {gate.sample_timeout_s:g}s"
                )
            await asyncio.sleep(0.2)

    async def _release(self, row: NodeRecord) -> bool:
        try:
            outcome = await self._agents.call(
                row.name, AgentCommand("reset_gpus"), self._command_timeout
            )
        except KilnError:  # no agent, or no answer: preparing finds out
            await self._move(row.name, S.PREPARING, "GPU state unknown after release")
            return False
        if not outcome.ok:  # e.g. a process the job left behind holds a GPU
            reason = "; ".join(outcome.failures) or outcome.message or "reset failed"
            await self._quarantine(row.name, f"cannot reset GPUs after release: {reason}")
            return False

        def write(tx: Tx) -> bool:
            node = load_node(tx, row.name)
            node.applied_profile = ""
            if node.profile:  # back to the node's own baseline before the next job
                target = S.PREPARING
                why = f"GPUs reset after release; preparing to baseline {node.profile}"
            else:
                target, why = S.READY, "GPUs reset to defaults after release"
            # One write: a move saves the node with its profile cleared.
            if not move(tx, node, target, why):
                tx.nodes.save(node)
            return target == S.READY

        return await self._store.tx(write)

    async def _gpu_command(self, node: str, command: AgentCommand, *, best_effort: bool) -> bool:
        if not self._agents.is_connected(node):
            return False
        try:
            outcome = await self._agents.call(node, command, self._command_timeout)
        except KilnError:
            if not best_effort:
                raise
            return False
        return outcome.ok

    async def _quarantine(
        self, name: str, reason: str, *, only_from: NodeState | None = None
    ) -> str | None:
        """Drain the node to quarantine; returns the allocation that still
        holds it ("" for none), or None when it was no longer ``only_from``."""

        def write(tx: Tx) -> str | None:
            node = load_node(tx, name)
            if only_from is not None and node.state != only_from:
                return None
            node.drain_target = S.QUARANTINED
            tx.nodes.save(node)
            move(tx, node, S.DRAINING, reason)
            if not node.allocation_id:
                move(tx, node, S.QUARANTINED, reason)
            return node.allocation_id

        held_by = await self._store.tx(write)
        if held_by is not None:
            log.warning("node %s: quarantined: %s", name, reason)
        return held_by

    async def _row(self, name: str) -> NodeRecord:
        return await self._nodes.record(name)

    async def _move(
        self, name: str, target: NodeState, reason: str, *, only_from: NodeState | None = None
    ) -> bool:
        """Move the node; with ``only_from``, only while it is still in that
        state (a step began from a row that may be stale). True if it moved."""

        def write(tx: Tx) -> bool:
            node = load_node(tx, name)
            if only_from is not None and node.state != only_from:
                return False
            return move(tx, node, target, reason)

        return await self._store.tx(write)

    async def _note_once(self, row: NodeRecord, reason: str) -> None:
        """``_note``, skipped (no transaction) when the node already says so:
        a node waiting is looked at again and again."""
        if row.state_reason != reason:
            await self._note(row.name, reason)

    async def _note(self, name: str, reason: str) -> None:
        """Update why a node waits, without an event for every pass."""

        def write(tx: Tx) -> None:
            node = tx.nodes.get(name)
            if node is not None and node.state_reason != reason:
                node.state_reason = reason
                tx.nodes.save(node)

        await self._store.tx(write)
