"""The policy engine: samples in, actions out.

Phases of :meth:`PolicyEngine.observe`, per rule:

1. Extract the rule's metric for every series (GPU or BMC sensor) of the
   sample, with guard rails (:mod:`controller.policies.readings`).
2. Advance each series' streak: a series whose value is known and satisfies
   the condition extends its streak; any other value, or a gap between samples
   longer than ``max_sample_gap``, resets it.
3. If the rule's episode on this node is active, end it (re-arm) once a sample
   shows every series known and clear; emit nothing.
4. Otherwise, if some series' streak is ripe (``for:`` duration and
   ``for_samples:`` count both reached), the episode starts: emit the rule's
   actions once, through the caps, and schedule delayed ones for :meth:`tick`.

The engine is pure: no I/O, no clock; it keeps only per-instance state. What
it must not forget across a restart — the nodes the caps have counted — it is
given back through :meth:`PolicyEngine.restore` (or ``history=``) from what
the controller recorded.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.policies.caps import CapLedger, PastAction
from controller.policies.readings import SeriesValue, Value, metric_values, series_labels
from controller.policies.rules import (
    ActionKind,
    ActionSpec,
    Metric,
    RecoveryAction,
    Rule,
    RuleSet,
    Thresholds,
)
from controller.policies.samples import HealthSample

log = logging.getLogger(__name__)

GAP_LOG_EVERY_S = 60.0  # of sample time: lines about gaps between samples, at most
# A sample within this many report intervals (as the node's agent was asked
# to report) of the last is no gap, however long ``max_sample_gap``: the
# controller slows its agents down when it is behind (up to a minute a
# report, ``core/report_pace.py``), and at the default 30 s every streak
# would restart with every report. Two: an agent takes up a new interval
# after its current wait (the pace changes by 1.5x at most a step).
GAP_INTERVALS = 2.0


@dataclass(frozen=True, slots=True)
class Action:
    """Something the controller should do to ``node`` because ``rule`` fired.

    ``dry_run``: report only, never execute. ``suppressed``: a cap refused it
    (``"cap: ..."``); report it, never execute it. ``gpus``: the indices of
    the GPUs whose series fired the rule, ascending (empty for a BMC sample):
    the GPUs a ``reset_gpu`` resets.
    """

    rule: str
    node: str
    kind: ActionKind
    reason: str
    at: float
    dry_run: bool = False
    suppressed: str | None = None
    gpus: tuple[int, ...] = ()

    @property
    def executable(self) -> bool:
        return not self.dry_run and self.suppressed is None


@dataclass(slots=True)
class _Streak:
    since: float
    count: int


@dataclass(slots=True, eq=False)  # identity: pending lists remove this very one
class _FollowUp:
    due: float
    rule: Rule
    node: str
    rack: str
    kind: ActionKind
    reason: str
    gpus: tuple[int, ...] = ()
    cancelled: bool = False


@dataclass(slots=True)
class _RuleNodeState:
    streaks: dict[str, _Streak] = field(default_factory=dict)
    active: bool = False
    pending: list[_FollowUp] = field(default_factory=list)


class PolicyEngine:
    """Evaluates a :class:`RuleSet` over a stream of :class:`HealthSample`.

    Not thread-safe; use one engine per controller event loop. Samples of a
    node older than the newest one already seen for that node are ignored.
    ``history``: actions admitted before this engine existed; see
    :meth:`restore`.
    """

    def __init__(self, rules: RuleSet, history: Iterable[PastAction] = ()) -> None:
        self._rules = rules
        # Rules on one metric (and the same fallback thresholds) read the same
        # values: each (metric, thresholds) is read once per sample, and each
        # rule is paired with the index of the one it reads.
        reads: dict[tuple[Metric, Thresholds], int] = {}
        self._plan = tuple(
            (rule, reads.setdefault((rule.when.metric, rule.thresholds), len(reads)))
            for rule in rules.rules
        )
        self._reads = tuple(reads)
        # Per node, per rule: the streaks and episode of each rule that holds
        # or is on for the node. A rule's entry goes once nothing holds and
        # no episode is on, and a node's once it has none: a node with no
        # entry (most of a healthy fleet) has its samples tested rule by
        # rule and nothing more (``observe``).
        self._state: dict[str, dict[str, _RuleNodeState]] = {}
        self._last_at: dict[str, float] = {}
        self._gaps = 0  # nodes' gaps since the last line about them (``_note_gap``)
        self._gap_logged_at = float("-inf")
        self._caps = CapLedger(rules)
        self._queue: list[tuple[float, int, _FollowUp]] = []
        self._order = itertools.count()
        self.restore(history)

    @property
    def rules(self) -> RuleSet:
        return self._rules

    def observe(self, sample: HealthSample, *, interval_s: float = 0.0) -> list[Action]:
        """Feed one sample; return the actions it triggers now (maybe none).

        ``interval_s``: how often the node's agent is asked to report (0:
        not known). Samples further apart than ``max_sample_gap`` restart
        the node's streaks, unless they are within ``GAP_INTERVALS`` of it.
        """
        last = self._last_at.get(sample.node)
        if last is not None and sample.at < last:
            log.debug("node %s: ignoring sample at %s older than %s", sample.node, sample.at, last)
            return []
        gap = False
        allowed = max(self._rules.max_sample_gap_s, GAP_INTERVALS * interval_s)
        if last is not None and sample.at - last > allowed:
            gap = True
            self._note_gap(sample.node, sample.at - last, sample.at)
        self._last_at[sample.node] = sample.at
        read = [metric_values(metric, sample, fallback) for metric, fallback in self._reads]
        states = self._state.get(sample.node)
        if states is None:
            # The common case: no rule holds or is on for the node; unless
            # one holds now, nothing goes on and nothing fires.
            for rule, i in self._plan:
                if rule.when.holds_for_any(read[i]):
                    break
            else:
                return []
            states = self._state[sample.node] = {}
        actions: list[Action] = []
        for rule, i in self._plan:
            actions.extend(self._evaluate(rule, sample, gap, read[i], states))
        if not states:
            del self._state[sample.node]
        return actions

    def _note_gap(self, node: str, seconds: float, at: float) -> None:
        """Log a gap at most once a ``GAP_LOG_EVERY_S`` of sample time, with
        how many nodes' streaks restarted since the last line: when a whole
        fleet's reports stop and resume (a controller paused, a network
        partition healed) that is one line, not one per node."""
        self._gaps += 1
        if at - self._gap_logged_at < GAP_LOG_EVERY_S:
            return
        log.info(
            "node %s: %.1fs without a sample; streaks restart (%d nodes' streaks "
            "restarted after a gap since the last such line)",
            node,
            seconds,
            self._gaps,
        )
        self._gap_logged_at, self._gaps = at, 0

    def tick(self, now: float) -> list[Action]:
        """Emit delayed actions (graceful power-off after its grace) due by ``now``."""
        actions: list[Action] = []
        while self._queue and self._queue[0][0] <= now:
            _, _, follow = heapq.heappop(self._queue)
            state = self._state_of(follow.rule.name, follow.node)
            if state is not None and follow in state.pending:
                state.pending.remove(follow)
            if follow.cancelled:
                continue
            actions.append(
                self._emit(
                    follow.rule,
                    follow.node,
                    follow.rack,
                    follow.kind,
                    follow.reason,
                    now,
                    follow.gpus,
                )
            )
        return actions

    def restore(self, history: Iterable[PastAction]) -> int:
        """Count actions admitted by an earlier engine (a controller that
        restarted, or the active one a standby took over from) against the
        caps, so the per-rule caps and the blast radius go on counting where
        it stopped. Pass the actions of the last :attr:`RuleSet.cap_window_s`
        seconds that were not suppressed, dry-run ones flagged. Streaks,
        episodes and delayed actions are not restored: they start afresh.
        Returns how many actions counted toward some cap.
        """
        return self._caps.restore(history)

    def forget(self, node: str) -> None:
        """Drop everything known about ``node`` (removed, or back from repair)."""
        self._last_at.pop(node, None)
        for state in self._state.pop(node, {}).values():
            for follow in state.pending:
                follow.cancelled = True

    def pending(self, node: str) -> list[tuple[str, ActionKind, float]]:
        """Delayed actions scheduled for ``node``: (rule, kind, due)."""
        out: list[tuple[str, ActionKind, float]] = []
        for rule_name, state in self._state.get(node, {}).items():
            out.extend((rule_name, f.kind, f.due) for f in state.pending if not f.cancelled)
        return sorted(out, key=lambda p: p[2])

    def _state_of(self, rule: str, node: str) -> _RuleNodeState | None:
        states = self._state.get(node)
        return None if states is None else states.get(rule)

    def _evaluate(
        self,
        rule: Rule,
        sample: HealthSample,
        gap: bool,
        read: list[Value | None],
        states: dict[str, _RuleNodeState],
    ) -> list[Action]:
        holds = rule.when.holds
        state = states.get(rule.name)
        if not rule.when.holds_for_any(read) and (state is None or not state.active):
            # Nothing holds and no episode is on: no streak goes on, nothing
            # fires, and the rule's entry goes (no episode: no follow-ups).
            if state is not None:
                del states[rule.name]
            return []
        if state is None:
            state = states[rule.name] = _RuleNodeState()
        values = [
            SeriesValue(series, v, gpu)
            for (series, gpu), v in zip(series_labels(sample), read, strict=True)
        ]
        holding = [v for v in values if v.value is not None and holds(v.value)]
        previous = {} if gap else state.streaks
        streaks: dict[str, _Streak] = {}
        for v in holding:
            prev = previous.get(v.series)
            streaks[v.series] = (
                _Streak(prev.since, prev.count + 1) if prev else _Streak(sample.at, 1)
            )
        state.streaks = streaks
        if state.active:
            if not holding and values and all(v.known for v in values):
                log.info("node %s: rule %s cleared; re-armed", sample.node, rule.name)
                state.active = False
                for follow in state.pending:
                    follow.cancelled = True
                state.pending.clear()
            return []
        ripe = [v for v in holding if self._ripe(rule, streaks[v.series], sample.at)]
        if not ripe:
            return []
        state.active = True
        return self._fire(rule, sample, ripe, streaks, state)

    @staticmethod
    def _ripe(rule: Rule, streak: _Streak, now: float) -> bool:
        if rule.for_samples is not None and streak.count < rule.for_samples:
            return False
        return rule.for_s is None or now - streak.since >= rule.for_s

    def _fire(
        self,
        rule: Rule,
        sample: HealthSample,
        ripe: list[SeriesValue],
        streaks: dict[str, _Streak],
        state: _RuleNodeState,
    ) -> list[Action]:
        reason = _reason(rule, sample, ripe[0], streaks[ripe[0].series])
        seen_xids: set[int] = set()
        if rule.when.metric is Metric.XID:
            for v in ripe:
                assert isinstance(v.value, tuple)
                seen_xids.update(v.value)
        gpus = tuple(sorted({v.gpu for v in ripe if v.gpu is not None}))
        log.warning("node %s: rule %s fired: %s", sample.node, rule.name, reason)
        actions: list[Action] = []
        for spec in rule.actions:
            if spec.on_xids is not None and not spec.on_xids & seen_xids:
                continue
            if spec.after_s > 0:
                self._schedule(rule, sample, spec, reason, state, gpus)
                continue
            actions.append(
                self._emit(rule, sample.node, sample.rack, spec.kind, reason, sample.at, gpus)
            )
        return actions

    def _schedule(
        self,
        rule: Rule,
        sample: HealthSample,
        spec: ActionSpec,
        reason: str,
        state: _RuleNodeState,
        gpus: tuple[int, ...],
    ) -> None:
        due = sample.at + spec.after_s
        follow = _FollowUp(
            due=due,
            rule=rule,
            node=sample.node,
            rack=sample.rack,
            kind=spec.kind,
            reason=f"{reason}; still active after {spec.after_s:g}s grace",
            gpus=gpus,
        )
        state.pending.append(follow)
        heapq.heappush(self._queue, (due, next(self._order), follow))

    def _emit(
        self,
        rule: Rule,
        node: str,
        rack: str,
        kind: ActionKind,
        reason: str,
        at: float,
        gpus: tuple[int, ...] = (),
    ) -> Action:
        dry_run = self._rules.dry_run or rule.dry_run
        suppressed = self._caps.admit(rule, kind, node, rack, at, dry_run=dry_run)
        if suppressed:
            log.warning("node %s: %s by rule %s suppressed: %s", node, kind, rule.name, suppressed)
        if kind is ActionKind.POWER_OFF_NOW and suppressed is None:
            self._cancel_graceful(node)
        return Action(rule.name, node, kind, reason, at, dry_run, suppressed, gpus)

    def _cancel_graceful(self, node: str) -> None:
        # An immediate power-off supersedes any graceful one still waiting.
        for state in self._state.get(node, {}).values():
            for follow in state.pending:
                if follow.kind is ActionKind.POWER_OFF_GRACEFUL:
                    follow.cancelled = True


def _reason(rule: Rule, sample: HealthSample, value: SeriesValue, streak: _Streak) -> str:
    if isinstance(value.value, tuple):
        wanted = rule.when.value if isinstance(rule.when.value, frozenset) else frozenset()
        matched = sorted(x for x in value.value if x in wanted)
        observed = f"xid {matched}"
    elif rule.when.metric is Metric.RECOVERY_ACTION:
        assert isinstance(value.value, float)
        observed = f"{rule.when.metric}={RecoveryAction(int(value.value)).label}"
    elif isinstance(value.value, bool):
        observed = f"{rule.when.metric}={str(value.value).lower()}"
    else:
        observed = f"{rule.when.metric}={value.value:g}"
    held = ""
    if rule.sustained:
        held = f" for {sample.at - streak.since:.0f}s over {streak.count} samples"
    return f"{value.series} {observed} ({rule.when.describe()}){held} from {sample.source}"
