"""Backpressure on the agents' reports, from the controller's measured load.

The report budget (``--max-health-reports-per-second``) is a static guess,
applied as agents register. This is the measured half: a probe on the event
loop notes how late a short timer fires. That lag is everything queued
ahead of it (stream reads, database answers, API calls) and the
interpreter shared with the database thread, so it grows when the
controller's own work outruns it.

The loop's lag misses one overload: gRPC takes in calls and messages on
its own thread, and when the reports fill the interpreter its queue grows
while the loop's timers stay on time (measured: new agents' calls waited
minutes while the timer ran 20-50 ms late). So the reports' own lateness
counts too (``ReportDelays``): each report's ``now - sampled_at`` less the
smallest such gap from the same agent since it registered, so that a
steady clock offset between agent and controller cancels out.

The reports' lateness counts only while the controller is busy (its
process used at least ``busy_cores`` of CPU over the window): reports that
arrive late at an idle controller were held up before it (the senders, the
network), and slowing the agents down would not bring them sooner.
(Measured with the benchmark's load generators, 1,000 agent streams to a
Python process: reports arrived 120-530 ms late at the median while the
controller used 0.2-0.7 cores with its loop on time, and it slowed 2,500
agents to one report every 6 s; every overload of its own it answered in
those runs came at 0.96-1.04 cores.)

When the median lag over a window (the loop's, or the reports' when a
window holds enough of them) is above ``slow_above``, every connected
agent is asked to report less often (the interval times ``stretch``, up to
``longest``). When it is below ``ease_below`` the interval comes back by
``ease`` a step, never below what the budget allows; by more, up to
``ease_fastest``, while the process used less than half ``busy_cores``: as
far as its CPU, which grows with the report rate, would stay under half of
``busy_cores`` (measured at the real pace: a fleet slowed to 45 s by its
bring-up came back 1.25x a step, each held two intervals, with the
controller at 0.2-0.5 of a core: eight minutes to 10 s). After a change the
pace holds for two intervals: an agent takes up a new interval after its
current wait, so the lag answers a change only an interval later, and one
overload must not be answered twice.

An interval that overloaded the controller after an easing step is
remembered (the *ceiling*): easing stops just above it (``margin``) and
goes no faster for ``recheck`` seconds after the slow-down. Then a retry
eases one step further and holds there a recheck in turn, and so on down
to the budget; a retry that overloads again makes the next wait twice as
long (up to ``recheck_longest``), one that holds halves it (down to
``recheck``), and a recheck calm at the budget forgets the ceiling.
Slow-downs in a row (one overload, such as a fleet's bring-up, still being
answered) set no ceiling: once it is over, the agents come back as fast as
the budget allows. Without the ceiling (``recheck`` 0), a controller
offered more than it takes hunted: it slowed every agent, eased back into
the same overload and slowed them again (every 30 s at 40,000 nodes:
58,741 ``Pace`` messages in three minutes).
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

DEFAULT_LONGEST_INTERVAL = 60.0  # s: agents are never asked to report less often
MIN_REPORTS = 20  # reports a window needs before their lateness counts


@dataclass(frozen=True)
class PaceRules:
    """When to slow the agents down and by how much.

    ``longest``: the longest interval asked for; 0 turns the lag-driven
    pace off (the budget alone applies).
    """

    tick: float = 0.1  # s between two probes of the loop
    window: float = 3.0  # s of probes judged together
    slow_above: float = 0.1  # s of median lag: slow the agents down
    ease_below: float = 0.02  # s of median lag: let them speed up again
    stretch: float = 1.5
    ease: float = 1.25
    ease_fastest: float = 2.0  # the most one easing step takes off, the process far from busy
    longest: float = DEFAULT_LONGEST_INTERVAL
    margin: float = 1.1  # easing stops this far above an interval that overloaded
    recheck: float = 30.0  # s before an interval that overloaded is tried again
    recheck_longest: float = 600.0  # s: the most that wait doubles to
    busy_cores: float = 0.8  # CPU of the process over a window for late reports to count
    # After a window in which the process used less than ``resting_below``
    # cores with the agents at the budget's pace, the probe wakes every
    # ``resting_tick`` instead: ten wake-ups a second cost an idle
    # controller about 0.2 % of a core here (180 us each), and a loop that
    # idle is not late. The next window busier than that probes at ``tick``.
    resting_tick: float = 1.0
    resting_below: float = 0.1

    def __post_init__(self) -> None:
        if self.tick <= 0 or self.window < self.tick:
            raise ValueError("the pace needs a tick above 0 and a window of at least one tick")
        if not self.tick <= self.resting_tick <= self.window or self.resting_below < 0:
            raise ValueError(
                "resting_tick must be between tick and window, and resting_below 0 or more"
            )
        if not 0 <= self.ease_below < self.slow_above:
            raise ValueError("ease_below must be below slow_above")
        if self.stretch <= 1 or self.ease <= 1:
            raise ValueError("stretch and ease must be above 1")
        if self.ease_fastest < self.ease:
            raise ValueError("ease_fastest must be at least ease")
        if self.longest < 0:
            raise ValueError("longest must be 0 (off) or more")
        if self.busy_cores < 0:
            raise ValueError("busy_cores must be 0 (late reports always count) or more")
        if self.margin < 1 or not 0 <= self.recheck <= self.recheck_longest:
            raise ValueError("margin must be at least 1, and recheck between 0 and recheck_longest")

    def next_tick(self, busy: float, stretched: bool) -> float:
        """The probe's tick for the next window, after one in which the
        process used ``busy`` cores, the agents ``stretched`` or not."""
        return self.resting_tick if busy < self.resting_below and not stretched else self.tick


class ReportPace:
    """The report interval that the measured lag calls for.

    ``budget()`` is the interval the report budget allows now (the
    configured sample interval, or longer for a fleet beyond the budget);
    the pace only ever asks for more.
    """

    def __init__(self, rules: PaceRules, budget: Callable[[], float]) -> None:
        self.rules = rules
        self._budget = budget
        self.stretched = 0.0  # the lag-driven interval; 0 while none is
        self.lag = 0.0  # the loop's median lag (s) over the last window judged
        self.report_delay = 0.0  # the reports' median delay (s) over it
        self.busy = 0.0  # the process's CPU (cores) over it
        self._hold_until = float("-inf")
        self.ceiling = 0.0  # easing stops ``margin`` above it until the retry (0: none)
        self._recheck = rules.recheck  # s before the ceiling is tried again
        self._retry_at = float("-inf")  # when easing may reach the ceiling
        self._eased = False  # whether the last change was an easing step
        self._overloads = 0  # slow-downs so far
        self._overloads_at_retry = -1  # ... at the last retry

    @property
    def late(self) -> float:
        """The larger of the last window's two medians, the reports' only
        while the controller was busy: what the pace follows."""
        counted = self.report_delay if self.busy >= self.rules.busy_cores else 0.0
        return max(self.lag, counted)

    def interval(self) -> float:
        """What agents are asked for now."""
        return max(self._budget(), self.stretched)

    def judge(
        self,
        lags: Sequence[float],
        now: float,
        delays: Sequence[float] = (),
        busy: float = 1.0,
    ) -> float | None:
        """Judge one window at ``now`` (seconds, any clock that ``now``
        keeps): the loop's lags and the reports' delays (seconds; the delays
        count from ``MIN_REPORTS`` of them, and while ``busy``, the
        process's CPU in cores over the window, is at least
        ``busy_cores``). Returns the interval to ask every agent for, or
        None to leave the pace as it is."""
        if not lags:
            return None
        self.lag = statistics.median(lags)
        self.report_delay = statistics.median(delays) if len(delays) >= MIN_REPORTS else 0.0
        self.busy = busy
        rules = self.rules
        if not rules.longest or now < self._hold_until:
            return None
        before = self.interval()
        calm = self.late < rules.ease_below
        if self.late > rules.slow_above:
            after = min(rules.longest, before * rules.stretch)
            if after <= before:
                return None  # at the longest already
            self._overloaded(before, now)
            self.stretched = after
        elif calm and self.stretched:
            after, retry = before / self._ease_step(), False
            if self.ceiling and after < self.ceiling * rules.margin:
                if now < self._retry_at:
                    after = self.ceiling * rules.margin  # not the overload again, yet
                else:
                    retry = True
            budget = self._budget()
            if after <= budget:
                self.stretched, after = 0.0, budget
            else:
                self.stretched = after
            if after >= before:
                return None  # held: by the budget, or above the ceiling until its retry
            if retry:
                self._retried(after, now)
            self._eased = True
        else:
            if calm and self.ceiling and now >= self._retry_at:
                self._retried(0.0, now)  # at the budget a recheck long: the ceiling goes
            return None
        self._hold_until = now + max(rules.window, 2 * max(before, after))
        return after

    def _ease_step(self) -> float:
        """How much one easing step takes off: ``ease``, or up to
        ``ease_fastest`` while the process's CPU leaves room (its CPU taken
        to grow with the report rate, kept under half ``busy_cores``)."""
        rules = self.rules
        half = rules.busy_cores / 2
        if self.busy >= half:
            return rules.ease
        room = half / self.busy if self.busy > 0 else rules.ease_fastest
        return max(rules.ease, min(rules.ease_fastest, room))

    def _retried(self, interval: float, now: float) -> None:
        """A retry eased the agents to ``interval`` (one step below the
        ceiling's margin): it is held there a recheck in turn (0: the
        budget held, and the ceiling is gone). The wait halves when the
        last retry held."""
        if self._overloads == self._overloads_at_retry:
            self._recheck = max(self.rules.recheck, self._recheck / 2)
        self._overloads_at_retry = self._overloads
        self.ceiling = interval / self.rules.margin
        self._retry_at = now + self._recheck

    def _overloaded(self, interval: float, now: float) -> None:
        """Agents at ``interval`` overloaded the controller: after an easing
        step, keep them above it for a while, longer each time a retry
        overloads again; in a row, the same overload is still being
        answered."""
        eased, self._eased = self._eased, False
        self._overloads += 1
        if not eased:
            if self.ceiling and interval > self.ceiling:
                self.ceiling = interval
                self._retry_at = now + self._recheck
            return
        if self.ceiling and interval <= self.ceiling * self.rules.margin * (1 + 1e-9):
            self._recheck = min(self.rules.recheck_longest, 2 * self._recheck)  # a retry failed
        self.ceiling = max(self.ceiling, interval)
        self._retry_at = now + self._recheck


class ReportDelays:
    """How much later than its agent's best each report arrives (seconds).

    A window keeps a uniform sample of at most ``keep`` delays (reservoir
    sampling), so a window costs the same memory at any report rate.
    """

    def __init__(self, keep: int = 2000, rng: random.Random | None = None) -> None:
        self.keep = keep
        self._rng = rng or random.Random()
        self._best: dict[str, float] = {}
        self._window: list[float] = []
        self._seen = 0

    def note(self, node: str, sampled_at: float, now: float) -> None:
        """A report from ``node`` sampled at ``sampled_at`` arrived at ``now``
        (both Unix seconds, the agent's clock and the controller's)."""
        if sampled_at <= 0:
            return  # no sampling time: nothing to judge
        gap = now - sampled_at
        best = self._best.get(node)
        if best is None or gap < best:
            self._best[node] = best = gap
        self._seen += 1
        if len(self._window) < self.keep:
            self._window.append(gap - best)
        else:
            slot = self._rng.randrange(self._seen)
            if slot < self.keep:
                self._window[slot] = gap - best

    def forget(self, node: str) -> None:
        """The node's agent went away: its next session starts a new best."""
        self._best.pop(node, None)

    def take(self) -> list[float]:
        """This window's delays; the next window starts empty."""
        window, self._window, self._seen = self._window, [], 0
        return window


class LoopLagProbe:
    """Probes the running loop's lag and hands each window, with the
    reports' delays, to ``pace``; ``on_change(interval)`` when the pace asks
    for a new interval.

    ``helpers``: the CPU seconds so far of each process that takes the
    agents' reports in before this one (the relay workers), by process id.
    The CPU a window judges is the busiest process's: a relay worker that
    cannot keep up holds the reports before the controller, whose own
    process then looks idle (measured at the real pace: reports 10-78 s
    late with the controller's process at 0.4-0.5 cores and its relay
    worker's taking most of what the machine had left, and the pace eased
    on into it)."""

    def __init__(
        self,
        pace: ReportPace,
        delays: ReportDelays,
        on_change: Callable[[float], None],
        helpers: Callable[[], Mapping[int, float]] = dict,
    ) -> None:
        self.pace = pace
        self._delays = delays
        self._on_change = on_change
        self.helpers = helpers

    def _helpers_cpu(self) -> Mapping[int, float]:
        try:
            return self.helpers()
        except Exception:
            log.exception("report pace: reading the relay workers' CPU failed")
            return {}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        rules = self.pace.rules
        lags: list[float] = []
        judge_at = loop.time() + rules.window
        cpu_at, wall_at = time.process_time(), loop.time()
        helpers_at = self._helpers_cpu()
        tick = rules.tick
        while True:
            before = loop.time()
            await asyncio.sleep(tick)
            now = loop.time()
            lags.append(max(0.0, now - before - tick))
            if now < judge_at:
                continue
            cpu, helpers = time.process_time(), self._helpers_cpu()
            wall = max(1e-9, now - wall_at)
            busy = (cpu - cpu_at) / wall
            for pid, spent in helpers.items():
                if pid in helpers_at:
                    busy = max(busy, (spent - helpers_at[pid]) / wall)
            cpu_at, wall_at, helpers_at = cpu, now, helpers
            interval = self.pace.judge(lags, now, self._delays.take(), busy)
            lags = []
            judge_at = now + rules.window
            tick = rules.next_tick(busy, bool(self.pace.stretched))
            if interval is not None:
                try:
                    self._on_change(interval)
                except Exception:
                    log.exception("report pace: telling the agents failed")
