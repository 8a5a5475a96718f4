"""Active health checks: runs levels of the check suite on nodes, through their agents.

A run takes a node out of service while it lasts (state ``testing``, so no
allocation can land on it), sends each check of the level to the node's
agent (``run_check``), judges what came back against the suite's baseline
(``controller.checks.judge``) and records the run as one ``node.check``
event: when, how long, every check's figures and baseline. That event is
the check history (``history``). The first failed check ends the run and
quarantines the node with the check's own words; a passing run hands the
node back to the lifecycle (``preparing``, then ``ready``).

Where runs start:

- intake and repair (``Lifecycle._inspect``): a node that has never passed a
  run gets the suite's intake level, one back from quarantine or maintenance
  its repair level;
- before hand-off, when the allocation's profile names a level
  (``run_inline``: the node stays ``preparing``, a failure fails the
  preparation);
- periodically (``run``): only idle ready nodes (no allocation, not drained,
  passing the baseline), at most ``per_rack`` of one rack and ``fleet`` in
  all under test at once. A node under test is not pre-empted by an
  allocation that waits: the caps bound what is held back, and a run of the
  quick level ends in seconds;
- by an operator (``RunChecks``), on ready nodes.

Checks scoped ``rack`` (an NVL72's NVLink check) run after a run's node
checks, together on every node of the rack that the same request tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.checks import CheckSpec, Suite, judge
from controller.core import scan
from controller.core.agents import AgentHub
from controller.core.errors import FailedPrecondition, InvalidArgument, KilnError
from controller.core.eventlog import record
from controller.core.json_depth import nests_deeper_than
from controller.core.kinds import EventKind
from controller.core.model import AgentCommand
from controller.core.nodes import Nodes
from controller.core.ports import Store, Tx
from controller.core.records import NodeRecord
from controller.core.states import NodeState
from controller.core.tasks import BackgroundTasks
from controller.core.transitions import load_node, move

log = logging.getLogger(__name__)

S = NodeState
COMMAND_MARGIN_S = 30.0  # beyond a check's own timeout, for the agent to answer
MAX_FIGURES_DEPTH = 16  # an agent's figures nest a few levels; deeper is refused unparsed
HISTORY_DEFAULT = 20
HISTORY_MOST = 500
_TESTING_REASON = re.compile(r"^running checks: (?P<level>\w+) \((?P<trigger>\w+)\)")


@dataclass(frozen=True)
class CheckOutcomeInfo:
    name: str
    kind: str
    passed: bool
    reason: str = ""
    duration_s: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckRunInfo:
    node: str
    level: str
    trigger: str
    suite_version: str
    passed: bool
    started_at: float
    duration_s: float
    checks: tuple[CheckOutcomeInfo, ...] = ()
    reason: str = ""

    def data(self) -> dict[str, Any]:
        """The run as its event's data."""
        return {
            "level": self.level,
            "trigger": self.trigger,
            "suite_version": self.suite_version,
            "passed": self.passed,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "checks": [c.__dict__ for c in self.checks],
        }

    @classmethod
    def from_event(cls, node: str, reason: str, data: dict[str, Any]) -> CheckRunInfo:
        return cls(
            node=node,
            level=str(data.get("level", "")),
            trigger=str(data.get("trigger", "")),
            suite_version=str(data.get("suite_version", "")),
            passed=bool(data.get("passed")),
            started_at=float(data.get("started_at", 0.0)),
            duration_s=float(data.get("duration_s", 0.0)),
            checks=tuple(CheckOutcomeInfo(**c) for c in data.get("checks", ())),
            reason=reason,
        )


def testing_reason(level: str, trigger: str) -> str:
    """A testing node's state reason; a restarted controller reads the level back."""
    return f"running checks: {level} ({trigger})"


class CheckRunner:
    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        agents: AgentHub,
        suite: Suite,
        *,
        on_done: Callable[[str], None] = lambda node: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``on_done(node)``: a run ended and moved the node (the lifecycle pokes it)."""
        self.suite = suite
        self._store = store
        self._nodes = nodes
        self._agents = agents
        self._on_done = on_done
        self._clock = clock
        self._running: dict[str, str] = {}  # node -> its rack, while a run is in flight
        self._last: dict[str, float] = {}  # node -> when its last run ended
        self._since = clock()  # nodes never checked are due a period after this
        self._tasks = BackgroundTasks()
        self._seeded = False

    # -- queries -------------------------------------------------------------

    def running(self, node: str) -> bool:
        return node in self._running

    def in_flight(self) -> int:
        return len(self._running)

    def forget(self, node: str) -> None:
        self._last.pop(node, None)

    async def history(self, node: str, limit: int = 0) -> list[CheckRunInfo]:
        """The node's runs, newest last. Raises NotFound for an unknown node."""
        if limit < 0:
            raise InvalidArgument(f"limit must not be negative, not {limit}")
        await self._nodes.get(node)
        count = min(limit or HISTORY_DEFAULT, HISTORY_MOST)

        def read(tx: Tx) -> list[CheckRunInfo]:
            events = tx.events.latest(EventKind.NODE_CHECK, limit=count, node=node)
            return [CheckRunInfo.from_event(node, e.reason, e.data) for e in events]

        return await self._store.read(read)

    async def ever_passed(self, node: str) -> bool:
        def read(tx: Tx) -> bool:
            found = tx.events.latest(
                EventKind.NODE_CHECK, limit=1, node=node, where=lambda e: bool(e.data.get("passed"))
            )
            return bool(found)

        return await self._store.read(read)

    # -- starting runs ----------------------------------------------------------

    def gate_level(self, *, passed_before: bool) -> tuple[str, str]:
        """(level, trigger) for a node leaving inspection; level "" when none."""
        if passed_before:
            return self.suite.repair, "repair"
        return self.suite.intake, "intake"

    def start(self, node: NodeRecord, level: str, trigger: str) -> None:
        """Run ``level`` on a node already moved to testing, in the background."""
        self._begin([node], level, trigger)

    def resume(self, node: NodeRecord) -> None:
        """A node found testing with no run in flight (the controller restarted)."""
        if node.name in self._running:
            return
        m = _TESTING_REASON.match(node.state_reason)
        level = m["level"] if m and m["level"] in self.suite.levels else self.suite.intake
        trigger = m["trigger"] if m else "resumed"
        self._begin([node], level or next(iter(self.suite.levels)), trigger)

    async def run_now(self, names: Sequence[str], level: str) -> list[str]:
        """An operator's run on ready nodes (all of them or none).

        Raises InvalidArgument (no node, an unknown level), NotFound,
        FailedPrecondition (a node not ready and idle, named with its state).
        """
        level = level or "quick"
        self.suite.level(level)
        names = list(dict.fromkeys(names))
        if not names:
            raise InvalidArgument("name at least one node (or a rack) to check")
        for name in names:
            await self._nodes.get(name)
        reason = testing_reason(level, "operator")

        def write(tx: Tx) -> list[NodeRecord]:
            rows = [load_node(tx, name) for name in names]
            busy = [
                f"{r.name} ({r.state.value}{', ' + r.allocation_id if r.allocation_id else ''})"
                for r in rows
                if r.state != S.READY or r.allocation_id or r.drained or r.name in self._running
            ]
            if busy:
                raise FailedPrecondition(
                    "checks run only on ready nodes no allocation holds; not: " + ", ".join(busy)
                )
            for row in rows:
                move(tx, row, S.TESTING, reason)
            return rows

        rows = await self._store.tx(write)
        self._begin(rows, level, "operator")
        return [r.name for r in rows]

    def _begin(self, rows: list[NodeRecord], level: str, trigger: str) -> None:
        for row in rows:
            self._running[row.name] = row.rack
        self._tasks.spawn(self._batch(rows, level, trigger), name=f"kiln-checks-{rows[0].name}")

    async def run_inline(self, node: NodeRecord, level: str, trigger: str) -> CheckRunInfo:
        """Run ``level`` without moving the node (before hand-off: it stays
        preparing); the run is recorded. Raises InvalidArgument for an unknown level."""
        specs = self.suite.level(level)
        started, t0 = self._clock(), time.monotonic()
        outcomes = await self._checks(node, [s for s in specs if s.scope == "node"])
        if all(o.passed for o in outcomes):
            outcomes += await self._checks(node, [s for s in specs if s.scope == "rack"])
        run = self._finish(node.name, level, trigger, started, t0, outcomes)
        await self._store.tx(lambda tx: self._record(tx, run))
        self._last[node.name] = self._clock()
        return run

    # -- a batch -----------------------------------------------------------------

    async def _batch(self, rows: list[NodeRecord], level: str, trigger: str) -> None:
        started, t0 = self._clock(), time.monotonic()
        try:
            specs = self.suite.level(level)
            node_specs = [s for s in specs if s.scope == "node"]
            rack_specs = [s for s in specs if s.scope == "rack"]
            results = await asyncio.gather(*(self._checks(r, node_specs) for r in rows))
            outcomes = {r.name: list(o) for r, o in zip(rows, results, strict=True)}
            for spec in rack_specs:  # every tray that is still passing, at once
                passing = [r for r in rows if all(o.passed for o in outcomes[r.name])]
                done = await asyncio.gather(*(self._checks(r, [spec]) for r in passing))
                for row, more in zip(passing, done, strict=True):
                    outcomes[row.name] += more
            for row in rows:
                run = self._finish(row.name, level, trigger, started, t0, outcomes[row.name])
                await self._conclude(row.name, run)
        except Exception:
            log.exception("checks on %s failed", ", ".join(r.name for r in rows))
        finally:
            for row in rows:
                self._running.pop(row.name, None)
                self._last[row.name] = self._clock()
                self._on_done(row.name)

    async def _checks(self, row: NodeRecord, specs: Sequence[CheckSpec]) -> list[CheckOutcomeInfo]:
        """Run ``specs`` in order on one node; stop at the first that fails."""
        outcomes: list[CheckOutcomeInfo] = []
        for spec in specs:
            outcome = await self._one(row, spec)
            outcomes.append(outcome)
            if not outcome.passed:
                break
        return outcomes

    async def _one(self, row: NodeRecord, spec: CheckSpec) -> CheckOutcomeInfo:
        command = AgentCommand("run_check", json.dumps(spec.wire()))
        t0 = time.monotonic()
        try:
            answer = await self._agents.call(row.name, command, spec.timeout_s + COMMAND_MARGIN_S)
        except KilnError as e:
            return CheckOutcomeInfo(
                spec.name, spec.kind, False, f"{spec.name}: not run: {e}", time.monotonic() - t0
            )
        figures_json = answer.figures_json
        try:  # the agent's figures are one flat object; anything else counts as none
            deep = nests_deeper_than(figures_json, MAX_FIGURES_DEPTH)
            figures = json.loads(figures_json) if figures_json and not deep else {}
        except ValueError:
            figures = {}
        if not isinstance(figures, dict):
            figures = {}
        verdict = judge(
            spec, row.gpu_model.upper(), ran=answer.ok, failures=answer.failures, figures=figures
        )
        reason = verdict.reason
        if reason and not reason.startswith(spec.name):
            reason = f"{spec.name}: {reason}"
        return CheckOutcomeInfo(
            name=spec.name,
            kind=spec.kind,
            passed=verdict.passed,
            reason=reason,
            duration_s=round(answer.duration_s or time.monotonic() - t0, 3),
            figures=figures,
            baseline=dict(verdict.baseline),
        )

    def _finish(
        self,
        node: str,
        level: str,
        trigger: str,
        started: float,
        t0: float,
        outcomes: list[CheckOutcomeInfo],
    ) -> CheckRunInfo:
        failed = next((o for o in outcomes if not o.passed), None)
        return CheckRunInfo(
            node=node,
            level=level,
            trigger=trigger,
            suite_version=self.suite.version,
            passed=failed is None,
            started_at=started,
            duration_s=round(time.monotonic() - t0, 3),
            checks=tuple(outcomes),
            reason=failed.reason if failed else "",
        )

    @staticmethod
    def _record(tx: Tx, run: CheckRunInfo) -> None:
        record(tx, EventKind.NODE_CHECK, node=run.node, reason=run.reason, **run.data())

    async def _conclude(self, name: str, run: CheckRunInfo) -> None:
        """Record the run; move the node on: preparing when it passed,
        quarantined (with the check's words) when a check failed, inspecting
        again when its agent went away mid-run."""
        interrupted = not run.passed and run.checks and "not run:" in run.checks[-1].reason
        summary = f"{run.level} ({run.trigger})"

        def write(tx: Tx) -> None:
            self._record(tx, run)
            node = tx.nodes.get(name)
            if node is None or node.state != S.TESTING:
                return  # removed or drained meanwhile: nothing more to do
            if run.passed:
                move(tx, node, S.PREPARING, f"checks passed: {summary}")
            elif interrupted:
                move(tx, node, S.INSPECTING, f"checks interrupted: {run.reason}")
            else:
                reason = f"check failed: {run.reason}"
                node.drain_target = S.QUARANTINED
                tx.nodes.save(node)
                move(tx, node, S.DRAINING, reason)
                move(tx, node, S.QUARANTINED, reason)

        await self._store.tx(write)
        if run.passed:
            log.info("node %s: checks passed: %s in %.1fs", name, summary, run.duration_s)
        else:
            log.warning("node %s: checks %s failed: %s", name, summary, run.reason)

    # -- periodic ------------------------------------------------------------------

    async def run(self, tick: float | None = None) -> None:
        """Start periodic runs on idle ready nodes until cancelled."""
        periodic = self.suite.periodic
        if not periodic.level:
            return
        interval = tick or max(1.0, min(60.0, periodic.every_s / 20))
        while True:
            try:
                await self.periodic_once()
            except Exception:  # a pass must never end the loop
                log.exception("periodic check pass failed")
            await asyncio.sleep(interval)

    async def periodic_once(self) -> list[str]:
        """Start the periodic runs that are due and fit the caps; returns their nodes."""
        periodic = self.suite.periodic
        if not periodic.level:
            return []
        if not self._seeded:
            await self._seed(periodic.every_s)
        now = self._clock()
        per_rack: dict[str, int] = {}
        for rack in self._running.values():
            per_rack[rack] = per_rack.get(rack, 0) + 1
        room = periodic.fleet - len(self._running)
        eligible = await scan.select(  # a slice at a time: see ``scan``
            await self._nodes.records_in([S.READY]),
            lambda row: (
                not (row.allocation_id or row.drained or row.name in self._running)
                and self._last.get(row.name, self._since) + periodic.every_s <= now
            ),
        )
        eligible.sort(key=lambda r: self._last.get(r.name, self._since))  # the longest waiting
        due: list[NodeRecord] = []
        for row in eligible:
            if room <= 0:
                break
            rack = row.rack or row.name
            if per_rack.get(rack, 0) >= periodic.per_rack:
                continue
            if not self._nodes.placeable(row) or not self._agents.is_connected(row.name):
                continue
            per_rack[rack] = per_rack.get(rack, 0) + 1
            room -= 1
            due.append(row)
        started = []
        reason = testing_reason(periodic.level, "periodic")
        for row in due:

            def write(tx: Tx, name: str = row.name) -> NodeRecord | None:
                node = load_node(tx, name)
                if node.state != S.READY or node.allocation_id or node.drained:
                    return None  # booked or drained since it was read
                move(tx, node, S.TESTING, reason)
                return node

            moved = await self._store.tx(write)
            if moved is not None:
                self._begin([moved], periodic.level, "periodic")
                started.append(moved.name)
        return started

    async def _seed(self, every_s: float) -> None:
        """When each node last ran checks, from the runs recorded within a period."""
        since = self._clock() - every_s

        def read(tx: Tx) -> dict[str, float]:
            last: dict[str, float] = {}
            for e in tx.events.latest(EventKind.NODE_CHECK, since_at=since, limit=100_000):
                last[e.node] = max(last.get(e.node, 0.0), e.at)
            return last

        for node, at in (await self._store.read(read)).items():
            self._last.setdefault(node, at)
        self._seeded = True

    async def stop(self) -> None:
        await self._tasks.stop()

    async def settle(self) -> None:
        await self._tasks.settle()
