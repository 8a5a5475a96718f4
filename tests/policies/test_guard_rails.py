"""Guard rails: broken sensors, spikes, gaps, episodes and delayed power-off."""

from __future__ import annotations

import logging
import math

import pytest
from policy_builders import agent, bmc, engine_for, feed, gpu, hot, kinds

from controller.policies import PolicyEngine, load_default_rules

HEAT_RULES = """
version: v1
rules:
  - name: hot
    when: {metric: gpu_temp_margin_to_slowdown_c, op: "<=", value: 3}
    for: 30s
    actions: [drain, {power_off: graceful, after: 60s}]
  - name: very-hot
    when: {metric: gpu_temp_c, op: ">=", value: 95}
    for_samples: 3
    actions: [{power_off: now}]
"""


GARBAGE = [
    pytest.param({"temp": None}, id="temp-none"),
    pytest.param({"temp": math.nan}, id="temp-nan"),
    pytest.param({"temp": math.inf}, id="temp-inf"),
    pytest.param({"temp": 1000.0}, id="temp-1000C"),
    pytest.param({"temp": -300.0}, id="temp-minus-300C"),
    pytest.param({"temp": 88.0, "slowdown": None, "shutdown": None}, id="thresholds-absent"),
    pytest.param({"temp": 88.0, "slowdown": math.nan, "shutdown": None}, id="threshold-nan"),
    pytest.param({"temp": 88.0, "slowdown": -5.0, "shutdown": 0.0}, id="threshold-impossible"),
]


@pytest.mark.parametrize("reading", GARBAGE)
def test_garbage_readings_never_act(reading: dict[str, float | None]) -> None:
    engine = engine_for(HEAT_RULES)  # no fallback thresholds in this rule set
    samples = [agent("n1", t, gpu(0, **reading), gpu(1)) for t in range(0, 600, 5)]
    assert feed(engine, samples) + engine.tick(10_000) == []


@pytest.mark.parametrize(
    "temps",
    [
        pytest.param((math.nan,), id="bmc-nan"),
        pytest.param((1000.0,), id="bmc-1000C"),
        pytest.param((-300.0,), id="bmc-minus-300C"),
        pytest.param((), id="bmc-no-sensors"),
    ],
)
def test_garbage_bmc_readings_never_act(temps: tuple[float, ...]) -> None:
    engine = PolicyEngine(load_default_rules())
    assert feed(engine, [bmc("n1", t, *temps) for t in range(0, 600, 5)]) == []


def test_margin_rule_without_any_threshold_ignores_bmc_samples() -> None:
    engine = engine_for(HEAT_RULES)
    # "hot" needs a slowdown threshold; BMC samples have none and the rule set
    # gives no fallback. "very-hot" is absolute and still works.
    assert kinds(feed(engine, [bmc("n1", t, 96.0) for t in (0, 5, 10)])) == ["power_off_now"]


def test_per_gpu_threshold_wins_over_fallback() -> None:
    engine = engine_for(HEAT_RULES.replace("rules:", "thresholds: {slowdown_c: 60}\nrules:", 1))
    samples = [agent("n1", t, gpu(0, 70.0, slowdown=89.0)) for t in range(0, 60, 5)]
    assert feed(engine, samples) == []
    samples = [agent("n2", t, gpu(0, 70.0, slowdown=None)) for t in range(0, 60, 5)]
    assert kinds(feed(engine, samples)) == ["drain"]


@pytest.mark.parametrize(
    "temps",
    [
        pytest.param([50, 99, 50, 50, 50, 50, 50, 50], id="single-spike"),
        pytest.param([50, 99, 50, 99, 50, 99, 50, 99], id="alternating-spikes"),
        pytest.param([99, 99, 50, 99, 99, 50, 99, 99], id="two-then-clear"),
    ],
)
def test_spikes_never_trigger_sustained_rules(temps: list[float]) -> None:
    engine = engine_for(HEAT_RULES)
    assert feed(engine, [hot("n1", i * 5.0, t) for i, t in enumerate(temps)]) == []


def test_spikes_moving_between_gpus_do_not_add_up() -> None:
    engine = engine_for(HEAT_RULES)
    samples = [hot("n1", i * 5.0, 99.0, hot_index=i) for i in range(8)]
    assert feed(engine, samples) == []


def test_for_duration_resets_on_gap() -> None:
    engine = engine_for(HEAT_RULES)  # max_sample_gap defaults to 30s
    assert feed(engine, [hot("n1", t, 88.0) for t in (0, 10, 20)]) == []
    # 40s of silence: the 50s sample starts a fresh streak.
    assert feed(engine, [hot("n1", t, 88.0) for t in (60, 70, 80)]) == []
    assert kinds(engine.observe(hot("n1", 90, 88.0))) == ["drain"]


def test_reports_at_the_pace_the_agents_were_asked_for_are_no_gap() -> None:
    """The controller slowed its agents to one report every 35 s, over the
    30 s ``max_sample_gap``: reports 35-40 s apart keep the streak, and a
    report missed at that pace (75 s) still restarts it."""
    unpaced = engine_for(HEAT_RULES)
    assert [unpaced.observe(hot("n1", t, 88.0), interval_s=10.0) for t in (0, 35, 75)] == [[]] * 3
    paced = engine_for(HEAT_RULES)
    assert paced.observe(hot("n1", 0, 88.0), interval_s=35.0) == []
    assert kinds(paced.observe(hot("n1", 35, 88.0), interval_s=35.0)) == ["drain"]
    missed = engine_for(HEAT_RULES)
    for t in (0, 75):  # one report missed: a gap, the streak starts again at 75
        assert missed.observe(hot("n1", t, 88.0), interval_s=35.0) == []
    assert kinds(missed.observe(hot("n1", 110, 88.0), interval_s=35.0)) == ["drain"]


def test_a_fleet_wide_gap_is_one_log_line_not_one_per_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = engine_for(HEAT_RULES)
    nodes = [f"n{i}" for i in range(500)]
    feed(engine, [hot(n, 0, 60.0) for n in nodes])
    caplog.set_level(logging.INFO, logger="controller.policies.engine")
    feed(engine, [hot(n, 100, 60.0) for n in nodes])  # every node: 100 s without a sample
    gaps = [r.getMessage() for r in caplog.records if "without a sample" in r.getMessage()]
    assert len(gaps) == 1 and gaps[0].startswith("node n0: 100.0s without a sample")
    caplog.clear()
    feed(engine, [hot(n, 200, 60.0) for n in nodes])  # the next minute's gaps: one line again
    gaps = [r.getMessage() for r in caplog.records if "without a sample" in r.getMessage()]
    # It counts the 499 nodes the first line did not name, and itself.
    assert gaps == [
        "node n0: 100.0s without a sample; streaks restart (500 nodes' streaks restarted "
        "after a gap since the last such line)"
    ]


def test_for_duration_resets_on_garbage_sample() -> None:
    engine = engine_for(HEAT_RULES)
    samples = [hot("n1", t, 88.0) for t in (0, 10, 20)]
    samples.append(hot("n1", 25, math.nan))
    samples += [hot("n1", t, 88.0) for t in (30, 40, 50, 55)]
    assert feed(engine, samples) == []
    assert kinds(engine.observe(hot("n1", 60, 88.0))) == ["drain"]


def test_fires_once_per_episode_and_rearms_after_clear() -> None:
    engine = engine_for(HEAT_RULES)
    first = feed(engine, [hot("n1", t, 88.0) for t in range(0, 300, 10)])
    assert kinds(first) == ["drain"]
    assert engine.observe(hot("n1", 300, 60.0)) == []
    second = feed(engine, [hot("n1", t, 88.0) for t in range(310, 400, 10)])
    assert kinds(second) == ["drain"]
    assert second[0].at == 340


def test_unknown_reading_does_not_end_an_episode() -> None:
    engine = engine_for(HEAT_RULES)
    assert kinds(feed(engine, [hot("n1", t, 88.0) for t in range(0, 40, 10)])) == ["drain"]
    # A broken sensor is not a cool GPU: the episode stays, nothing repeats.
    feed(engine, [hot("n1", t, math.nan) for t in (40, 50)])
    assert feed(engine, [hot("n1", t, 88.0) for t in range(60, 200, 10)]) == []


def test_graceful_power_off_follows_after_grace() -> None:
    engine = engine_for(HEAT_RULES)
    assert kinds(feed(engine, [hot("n1", t, 88.0) for t in range(0, 40, 10)])) == ["drain"]
    assert engine.pending("n1") == [("hot", "power_off_graceful", 90.0)]
    assert engine.tick(89.9) == []
    follow = engine.tick(90.0)
    assert kinds(follow) == ["power_off_graceful"]
    assert "60s grace" in follow[0].reason
    assert engine.tick(1000.0) == []


def test_graceful_power_off_cancelled_when_heat_clears() -> None:
    engine = engine_for(HEAT_RULES)
    feed(engine, [hot("n1", t, 88.0) for t in range(0, 40, 10)])
    engine.observe(hot("n1", 40, 60.0))
    assert engine.pending("n1") == []
    assert engine.tick(1000.0) == []


def test_power_off_now_supersedes_pending_graceful() -> None:
    engine = engine_for(HEAT_RULES)
    feed(engine, [hot("n1", t, 88.0) for t in range(0, 40, 10)])
    assert kinds(feed(engine, [hot("n1", t, 96.0) for t in (40, 45, 50)])) == ["power_off_now"]
    assert engine.tick(1000.0) == []


def test_out_of_order_sample_is_ignored() -> None:
    engine = engine_for(HEAT_RULES)
    feed(engine, [hot("n1", t, 88.0) for t in (0, 10, 20)])
    assert engine.observe(hot("n1", 5, 60.0)) == []
    assert kinds(engine.observe(hot("n1", 30, 88.0))) == ["drain"]


def test_forget_drops_state_and_pending() -> None:
    engine = engine_for(HEAT_RULES)
    feed(engine, [hot("n1", t, 88.0) for t in range(0, 40, 10)])
    engine.forget("n1")
    assert engine.pending("n1") == []
    assert engine.tick(1000.0) == []


def test_engines_share_no_state() -> None:
    rules = load_default_rules()
    a, b = PolicyEngine(rules), PolicyEngine(rules)
    feed(a, [hot("n1", t, 88.0) for t in range(0, 60, 10)])
    assert kinds(b.observe(hot("n1", 60, 88.0))) == []
    assert kinds(a.observe(hot("n1", 60, 88.0))) == ["drain", "notify_job"]


def test_a_rule_that_stops_holding_leaves_the_other_rules_streaks_alone() -> None:
    # "hot" (margin <= 3 °C for 30 s) keeps its streak while "very-hot"
    # (>= 95 °C for 3 samples) starts and stops holding in between.
    engine = engine_for(HEAT_RULES)
    samples = [hot("n1", 0, 88.0), hot("n1", 10, 96.0), hot("n1", 20, 88.0)]
    assert feed(engine, samples) == []
    assert kinds(engine.observe(hot("n1", 30, 88.0))) == ["drain"]  # 30 s since t=0


def test_a_node_whose_rules_all_rest_is_held_by_nothing_in_the_engine() -> None:
    # What lets a healthy fleet's samples be tested rule by rule and nothing
    # more: once nothing holds and no episode is on, the node has no entry.
    engine = engine_for(HEAT_RULES)
    feed(engine, [hot("n1", t, 88.0) for t in range(0, 40, 10)])  # an episode on
    feed(engine, [agent("n2", 0)])
    assert set(engine._state) == {"n1"}
    engine.observe(hot("n1", 40, 60.0))  # it clears (re-armed)
    engine.observe(hot("n1", 50, 60.0))
    assert engine._state == {}
    assert kinds(feed(engine, [hot("n1", t, 88.0) for t in range(60, 100, 10)])) == ["drain"]
