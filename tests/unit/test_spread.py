"""Spreading a pass of BMC calls (``controller/core/spread.py``): the first
few at once, the rest evenly over the span; and ``run_bulk`` (the power
sync's reads) beginning its calls at their turns."""

from __future__ import annotations

import time

import pytest

from controller.bmc.fleet import run_bulk
from controller.core.spread import DEFAULT_BURST, Spread


def test_the_burst_begins_at_once_and_the_rest_evenly_over_the_span() -> None:
    spread = Spread(12, span=1.0, burst=2, began=100.0)
    assert [spread.due(i) for i in range(2)] == [100.0, 100.0]
    after = [spread.due(i) - 100.0 for i in range(2, 12)]
    assert after == pytest.approx([k / 10 for k in range(1, 11)])
    assert spread.due(11) == pytest.approx(101.0)  # the last at the span's end


@pytest.mark.parametrize(
    ("size", "span", "burst"),
    [(10, 5.0, 32), (32, 5.0, 32), (1000, 0.0, 32), (5, 2.0, 5)],
)
def test_a_pass_within_its_burst_or_without_a_span_begins_everything_at_once(
    size: int, span: float, burst: int
) -> None:
    spread = Spread(size, span=span, burst=burst, began=7.0)
    assert {spread.due(i) for i in range(size)} == {7.0}


def test_a_negative_span_or_burst_is_refused() -> None:
    with pytest.raises(ValueError, match="span and a burst of 0 or more"):
        Spread(10, span=-1.0)
    with pytest.raises(ValueError, match="span and a burst of 0 or more"):
        Spread(10, span=1.0, burst=-1)


async def test_a_late_call_waits_for_nothing() -> None:
    now = [50.0]
    spread = Spread(100, span=10.0, burst=0, clock=lambda: now[0])
    now[0] = 70.0  # the whole span is over: every call is late
    began = time.monotonic()
    for i in range(100):
        await spread.turn(i)
    assert time.monotonic() - began < 1.0  # 100 turns of up to 10 s, none waited


@pytest.mark.timeout(30)
async def test_bulk_calls_past_the_burst_begin_at_their_turns() -> None:
    size = DEFAULT_BURST + 10
    started: dict[str, float] = {}

    async def op(bmc: object) -> None:
        started[str(bmc)] = time.monotonic()

    began = time.monotonic()
    targets = [(f"n{i:02d}", f"n{i:02d}") for i in range(size)]
    result = await run_bulk(targets, op, concurrency=size, spread=0.5)  # type: ignore[arg-type]
    assert len(result.outcomes) == size and all(o.ok for o in result.outcomes.values())
    at = [started[f"n{i:02d}"] - began for i in range(size)]
    for k in range(1, 11):  # the k-th after the burst: not before k/10 of the span
        assert at[DEFAULT_BURST + k - 1] >= 0.5 * k / 10 - 0.005, at
    assert max(at[:DEFAULT_BURST]) < at[-1]
