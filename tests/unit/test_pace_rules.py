"""The report pace: how the measured event-loop lag slows every agent's
reports down and lets them speed up again (``controller/core/report_pace.py``)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import random
import statistics
import threading
from collections.abc import Sequence

import pytest

from controller.core.report_pace import (
    MIN_REPORTS,
    LoopLagProbe,
    PaceRules,
    ReportDelays,
    ReportPace,
)

RULES = PaceRules(window=3.0, slow_above=0.1, ease_below=0.02, stretch=1.5, ease=1.25, longest=20)
BUSY = [0.05, 0.2, 0.3]  # median 0.2 s late
CALM = [0.001, 0.002, 0.5]  # median 2 ms late: one long callback is not load
MIDDLE = [0.05, 0.05, 0.05]


def pace(budget: float = 5.0, rules: PaceRules = RULES) -> tuple[ReportPace, list[float]]:
    allowed = [budget]
    return ReportPace(rules, budget=lambda: allowed[0]), allowed


@pytest.mark.timeout(10)
def test_a_lagging_loop_stretches_the_interval_then_holds_for_two_intervals() -> None:
    p, _ = pace()
    assert p.interval() == 5.0
    assert p.judge(BUSY, now=100.0) == 7.5
    assert p.lag == 0.2 and p.interval() == 7.5
    # Agents take the new interval up after their current wait: the next
    # change waits two of the longer intervals.
    assert p.judge(BUSY, now=114.9) is None
    assert p.judge(BUSY, now=115.0) == 11.25


@pytest.mark.timeout(10)
def test_the_interval_never_passes_the_longest() -> None:
    p, _ = pace()
    now, asked = 0.0, []
    for _ in range(10):
        now += 100.0
        if (interval := p.judge(BUSY, now)) is not None:
            asked.append(interval)
    assert asked == [7.5, 11.25, 16.875, 20]
    assert p.interval() == 20


@pytest.mark.timeout(10)
def test_a_calm_loop_eases_back_to_the_budget_and_no_further() -> None:
    p, _ = pace()
    p.judge(BUSY, now=0.0)
    p.judge(BUSY, now=100.0)  # 11.25 s
    assert p.judge(MIDDLE, now=200.0) is None  # between the thresholds: held
    assert p.judge(CALM, now=300.0) == 9.0
    assert p.judge(CALM, now=400.0) == 7.2
    assert p.judge(CALM, now=500.0) == 5.76
    assert p.judge(CALM, now=600.0) == 5.0  # the budget, not 4.6
    assert p.stretched == 0.0
    assert p.judge(CALM, now=700.0) is None


@pytest.mark.timeout(10)
def test_easing_takes_bigger_steps_while_the_process_is_far_from_busy() -> None:
    rules = PaceRules(
        window=3.0, slow_above=0.1, ease_below=0.02, longest=60, busy_cores=0.8, recheck=0
    )
    p, _ = pace(budget=5.0, rules=rules)
    now = 0.0
    for _ in range(4):  # slowed to 5 x 1.5^4 = 25.3 s
        now += 1000.0
        p.judge(BUSY, now)
    assert p.interval() == pytest.approx(25.3125)
    # At 0.1 cores, 0.4 (half busy_cores) leaves room for 4x: the step is
    # ease_fastest (2x).
    now += 1000.0
    assert p.judge(CALM, now, busy=0.1) == pytest.approx(25.3125 / 2)
    # At 0.3 cores, room for 0.4 / 0.3 = 1.33x.
    now += 1000.0
    assert p.judge(CALM, now, busy=0.3) == pytest.approx(25.3125 / 2 / (0.4 / 0.3))
    # From half busy_cores up, ``ease`` as before; the budget is still the floor.
    now += 1000.0
    before = p.interval()
    assert p.judge(CALM, now, busy=0.5) == pytest.approx(before / 1.25)
    now += 1000.0
    assert p.judge(CALM, now, busy=0.0) == 5.0
    assert not p.stretched


@pytest.mark.timeout(10)
def test_the_budget_holds_the_floor_as_it_moves() -> None:
    p, allowed = pace(budget=5.0)
    p.judge(BUSY, now=0.0)  # 7.5 s
    allowed[0] = 10.0  # more agents registered than the report budget allows at 7.5 s
    assert p.interval() == 10.0
    assert p.judge(CALM, now=100.0) is None  # the budget alone holds it at 10 s
    assert p.stretched == 0.0
    assert p.judge(BUSY, now=200.0) == 15.0  # a stretch starts from what agents are told


@pytest.mark.timeout(10)
def test_longest_zero_turns_the_pace_off_but_the_lag_is_still_measured() -> None:
    p, _ = pace(rules=PaceRules(longest=0))
    assert p.judge(BUSY, now=0.0) is None
    assert p.lag == 0.2 and p.interval() == 5.0
    assert p.judge([], now=10.0) is None and p.lag == 0.2


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "bad",
    [
        {"tick": 0},
        {"window": 0.05},
        {"ease_below": 0.2},
        {"stretch": 1.0},
        {"ease": 0.5},
        {"longest": -1},
        {"margin": 0.9},
        {"recheck": -1},
        {"busy_cores": -0.1},
        {"ease": 1.5, "ease_fastest": 1.4},
        {"recheck": 700, "recheck_longest": 600},
        {"resting_tick": 0.05},
        {"resting_tick": 5.0},
        {"resting_below": -0.1},
    ],
)
def test_rules_that_cannot_work_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PaceRules(**bad)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0.0), ("0.00", 0.0), ("-0", 0.0), ("45", 45.0)]
)
def test_max_report_interval_takes_seconds_or_zero_for_off(text: str, seconds: float) -> None:
    from controller.options import seconds_or_off

    assert seconds_or_off(text) == seconds


@pytest.mark.timeout(10)
def test_late_reports_slow_the_agents_even_when_the_loop_keeps_time() -> None:
    p, _ = pace()
    late = [0.4] * MIN_REPORTS
    assert p.judge(CALM, now=0.0, delays=late) == 7.5
    assert p.lag == 0.002 and p.report_delay == 0.4 and p.late == 0.4
    # Too few reports to judge by: the loop alone decides.
    assert p.judge(CALM, now=100.0, delays=late[:-1]) == 6.0
    assert p.report_delay == 0.0


@pytest.mark.timeout(10)
def test_a_report_is_late_against_its_own_agents_quickest_so_clock_offsets_cancel() -> None:
    delays = ReportDelays()
    # Agent a's clock is 30 s behind the controller's, b's 2 s ahead.
    delays.note("a", sampled_at=1000.0, now=1030.05)
    delays.note("b", sampled_at=1002.0, now=1000.01)
    delays.note("a", sampled_at=1001.0, now=1031.25)  # 0.2 s later than a's best
    delays.note("b", sampled_at=1003.0, now=1001.01)
    delays.note("x", sampled_at=0.0, now=1002.0)  # no sampling time: not counted
    assert delays.take() == pytest.approx([0.0, 0.0, 0.2, 0.0])
    assert delays.take() == []
    delays.note("a", sampled_at=1002.0, now=1032.05)  # back to a's best
    delays.forget("b")  # b reconnects: its best starts again
    delays.note("b", sampled_at=1004.0, now=1003.0)
    assert delays.take() == pytest.approx([0.0, 0.0])


@pytest.mark.timeout(10)
def test_a_window_keeps_a_bounded_sample_of_the_delays() -> None:
    delays = ReportDelays(keep=100, rng=random.Random(7))
    for i in range(10_000):
        # Each node first at its quickest, then 0.0-0.9 s later in turn.
        delays.note(f"n{i % 50}", sampled_at=1000.0, now=1000.0 + (i // 50 % 10) / 10)
    window = delays.take()
    assert len(window) == 100
    assert 0.3 <= statistics.median(window) <= 0.6  # uniform over 0.0-0.9


@pytest.mark.timeout(10)
def test_easing_stops_above_an_interval_that_overloaded_until_its_retry() -> None:
    rules = PaceRules(stretch=1.5, ease=1.25, margin=1.1, recheck=30.0, longest=60)
    p, _ = pace(budget=1.0, rules=rules)
    assert p.judge(BUSY, now=0.0) == 1.5  # 1 s overloads
    assert p.judge(BUSY, now=10.0) == 2.25  # and 1.5 s: one overload being answered
    assert p.ceiling == 0.0  # slow-downs in a row set no ceiling
    assert p.judge(CALM, now=20.0) == 1.8
    assert p.judge(BUSY, now=30.0) == 2.7  # eased into an overload: 1.8 s is too fast
    assert p.ceiling == 1.8
    assert p.judge(CALM, now=40.0) == pytest.approx(2.16)
    assert p.judge(CALM, now=50.0) == pytest.approx(1.98)  # not 1.728: just above the ceiling
    assert p.judge(CALM, now=55.0) is None  # held there until 30 s after the slow-down
    assert p.interval() == pytest.approx(1.98)
    assert p.judge(CALM, now=60.0) == pytest.approx(1.584)  # the retry: one step below
    assert p.judge(CALM, now=70.0) is None  # held there a recheck in turn
    assert p.judge(CALM, now=90.0) == pytest.approx(1.2672)  # it held: the next step
    assert p.judge(CALM, now=100.0) is None
    assert p.judge(CALM, now=120.0) == pytest.approx(1.01376)
    assert p.judge(CALM, now=150.0) == 1.0  # the budget
    assert p.ceiling > 0
    assert p.judge(CALM, now=180.0) is None  # a recheck calm at the budget: the ceiling goes
    assert p.ceiling == 0.0


def hunt(recheck: float, seconds: float = 1200.0) -> tuple[list[float], list[float]]:
    """A controller that takes agents at 1.2 s and no faster, judged every
    5 s: (every interval asked for, when each was asked back to the 1 s
    budget, into the overload)."""
    rules = PaceRules(stretch=1.5, ease=1.25, margin=1.1, recheck=recheck, recheck_longest=300.0)
    p, _ = pace(budget=1.0, rules=rules)
    now, asked, tries = 0.0, [], []
    while now < seconds:
        now += 5.0
        interval = p.judge(BUSY if p.interval() < 1.2 else CALM, now)
        if interval is not None:
            asked.append(interval)
            if interval == 1.0:
                tries.append(now)
    return asked, tries


@pytest.mark.timeout(10)
def test_a_retry_that_overloads_again_waits_twice_as_long_next_time() -> None:
    asked, tries = hunt(recheck=30.0)
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    # Each try of the too-fast interval comes later than the last, up to
    # recheck_longest after the slow-down it caused.
    assert gaps == sorted(gaps) and gaps[0] < gaps[-1]
    assert 300.0 <= max(gaps) <= 300.0 + 5 * 5.0
    assert min(asked) >= 1.0
    # recheck 0 is the pace without a ceiling: it hunts, slowing every
    # agent down and speeding it up again every 15 s.
    hunting, _ = hunt(recheck=0.0)
    assert len(hunting) > 5 * len(asked)


@pytest.mark.timeout(10)
def test_a_load_that_grows_past_the_ceiling_raises_it_without_a_longer_wait() -> None:
    rules = PaceRules(stretch=1.5, ease=1.25, margin=1.1, recheck=30.0, longest=60)
    p, _ = pace(budget=1.0, rules=rules)
    p.judge(BUSY, now=0.0)  # 1.5 s
    p.judge(CALM, now=5.0)  # 1.2 s
    assert p.judge(BUSY, now=10.0) == pytest.approx(1.8)  # 1.2 s overloads
    assert p.judge(BUSY, now=20.0) == pytest.approx(2.7)  # so does 1.8 s: the load grew
    assert p.ceiling == pytest.approx(1.8)
    assert p.judge(CALM, now=30.0) == pytest.approx(2.16)
    assert p.judge(CALM, now=40.0) == pytest.approx(1.98)  # just above 1.8
    assert p.judge(CALM, now=45.0) is None
    assert p.judge(CALM, now=50.0) == pytest.approx(1.98 / 1.25)  # tried 30 s after


@pytest.mark.timeout(10)
def test_late_reports_at_an_idle_controller_slow_nobody_down() -> None:
    """Held up before the controller (the senders, the network): slowing the
    agents would not bring them sooner."""
    p, _ = pace()
    late = [0.4] * MIN_REPORTS
    assert p.judge(CALM, now=0.0, delays=late, busy=0.7) is None
    assert p.report_delay == 0.4 and p.busy == 0.7 and p.late == 0.002
    assert p.judge(CALM, now=100.0, delays=late, busy=0.8) == 7.5  # busy: they count
    # A loop that lags counts however idle the process looks.
    assert p.judge(BUSY, now=200.0, busy=0.0) == 11.25
    off = ReportPace(PaceRules(busy_cores=0.0), budget=lambda: 5.0)
    assert off.judge(CALM, now=0.0, delays=late, busy=0.0) == 7.5


@pytest.mark.timeout(10)
def test_the_probe_rests_after_an_idle_window_at_the_budgets_pace_only() -> None:
    rules = PaceRules(resting_tick=1.0, resting_below=0.1)
    assert rules.next_tick(busy=0.02, stretched=False) == 1.0
    assert rules.next_tick(busy=0.5, stretched=False) == rules.tick
    assert rules.next_tick(busy=0.02, stretched=True) == rules.tick  # a slowed fleet is watched


class CountingPace(ReportPace):
    """A real pace that keeps how many probes each window it judged held."""

    def __init__(self, rules: PaceRules) -> None:
        super().__init__(rules, budget=lambda: 5.0)
        self.probes: list[int] = []

    def judge(
        self, lags: Sequence[float], now: float, delays: Sequence[float] = (), busy: float = 1.0
    ) -> float | None:
        self.probes.append(len(lags))
        return super().judge(lags, now, delays, busy)


@pytest.mark.timeout(20)
def test_an_idle_loop_is_probed_at_the_resting_tick_and_a_busy_process_at_the_tick() -> None:
    rules = PaceRules(tick=0.02, window=0.4, resting_tick=0.2, resting_below=0.3)
    pace = CountingPace(rules)
    burning = threading.Event()

    def burn() -> None:  # the process busy (hashlib lets go of the interpreter), the loop free
        data = os.urandom(1 << 20)
        while burning.is_set():
            hashlib.sha256(data).digest()

    async def run() -> None:
        probe = asyncio.create_task(LoopLagProbe(pace, ReportDelays(), lambda _s: None).run())
        try:
            await asyncio.sleep(1.3)  # idle: the first window at the tick, then resting
            idle = len(pace.probes)
            burning.set()
            burner = threading.Thread(target=burn, daemon=True)
            burner.start()
            await asyncio.sleep(1.3)
            burning.clear()
            burner.join(5)
            busy_windows = pace.probes[idle:]
            assert pace.probes[0] >= 15  # 0.4 s at 0.02
            assert max(pace.probes[1:idle]) <= 3  # 0.4 s at 0.2
            # Once a window saw the process busy, the next ones probe at the tick again.
            assert max(busy_windows) >= 15, pace.probes
        finally:
            probe.cancel()

    asyncio.run(run())


class BusyPace(ReportPace):
    """A real pace that keeps the CPU each window it judged was given."""

    def __init__(self, rules: PaceRules) -> None:
        super().__init__(rules, budget=lambda: 5.0)
        self.seen: list[float] = []
        self.eight = asyncio.Event()  # set once eight windows were judged

    def judge(
        self, lags: Sequence[float], now: float, delays: Sequence[float] = (), busy: float = 1.0
    ) -> float | None:
        self.seen.append(busy)
        if len(self.seen) >= 8:
            self.eight.set()
        return super().judge(lags, now, delays, busy)


@pytest.mark.timeout(20)
def test_the_busiest_process_is_what_the_pace_judges_the_relay_workers_among_them() -> None:
    rules = PaceRules(tick=0.02, window=0.2, resting_tick=0.02)
    pace = BusyPace(rules)
    calls = itertools.count()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()

        def helpers() -> dict[int, float]:
            n = next(calls)
            if n == 3:
                raise OSError("not readable this time")  # logged; the own process counts
            # One worker using 0.9 of a core; a second appears later on
            # (not counted before a window of its own).
            spent = {101: (loop.time() - started) * 0.9}
            if n >= 5:
                spent[202] = 1000.0 + (loop.time() - started) * 0.1
            return spent

        probe = LoopLagProbe(pace, ReportDelays(), lambda _s: None, helpers)
        task = asyncio.create_task(probe.run())
        try:
            await pace.eight.wait()
        finally:
            task.cancel()

    asyncio.run(run())
    # The loop itself is idle; the worker's 0.9 of a core is what is judged,
    # but for the window after the failed read (no figures to compare with).
    judged = [b for i, b in enumerate(pace.seen) if i not in (2, 3)]
    assert all(0.7 < b < 1.1 for b in judged), pace.seen
    assert pace.seen[2] < 0.5 or pace.seen[3] < 0.5, pace.seen
