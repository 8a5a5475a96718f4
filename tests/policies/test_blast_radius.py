"""The blast radius: what all rules together may take down, per rack and
fleet-wide, and how a new engine goes on counting from recorded actions."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from policy_builders import engine_for, hot

from controller.policies import (
    TAKE_DOWN_KINDS,
    Action,
    ActionKind,
    BlastRadius,
    PastAction,
    PolicyEngine,
    RuleSet,
    RuleSetError,
    load_default_rules,
    load_rules,
)
from controller.policies.rules import Cap

SHUTDOWN_HEAT = 95.0  # over the 92 °C shutdown: gpu-shutdown-heat (and gpu-hot)
SLOWDOWN_HEAT = 88.0  # 1 °C below the 89 °C slowdown: gpu-hot only


@dataclass(frozen=True)
class Heat:
    """One tray heated from ``start`` on, sampled every 10 s for 90 s."""

    node: str
    rack: str
    temp: float
    start: float = 0.0


POWER_OFFS = (ActionKind.POWER_OFF_NOW, ActionKind.POWER_OFF_GRACEFUL)


def run(engine: PolicyEngine, heats: list[Heat], *, until: float = 500.0) -> list[Action]:
    """Feed every tray's samples in time order, ticking as a controller does,
    then tick once more at ``until`` for the delayed (graceful) power-offs.
    A tray powered off sends no more samples."""
    samples = sorted(
        (hot(h.node, h.start + t, h.temp, rack=h.rack) for h in heats for t in range(0, 100, 10)),
        key=lambda s: s.at,
    )
    actions: list[Action] = []
    for sample in samples:
        actions += engine.tick(sample.at)
        if not any(a.node == sample.node and a.kind in POWER_OFFS for a in actions if a.executable):
            actions += engine.observe(sample)
    return actions + engine.tick(until)


def taken_down(actions: list[Action]) -> set[str]:
    return {a.node for a in actions if a.kind in TAKE_DOWN_KINDS and a.executable}


def held_back(actions: list[Action]) -> set[str]:
    refused = {a.node for a in actions if a.kind in TAKE_DOWN_KINDS and a.suppressed}
    return refused - taken_down(actions)


def without_blast_radius(rules: RuleSet) -> RuleSet:
    return dataclasses.replace(rules, blast_radius=None)


def past(actions: list[Action], racks: dict[str, str]) -> list[PastAction]:
    """What the controller records and reads back: every action not held back."""
    return [
        PastAction(a.rule, a.node, racks[a.node], a.kind, a.at, a.dry_run)
        for a in actions
        if a.suppressed is None
    ]


# Trays of rack r1 heated to shutdown level (gpu-shutdown-heat: power off
# now) or to slowdown level (gpu-hot: drain, power off gracefully later).
T1_SHUT, T2_SHUT = Heat("t1", "r1", SHUTDOWN_HEAT), Heat("t2", "r1", SHUTDOWN_HEAT)
T1_HOT, T2_HOT = Heat("t1", "r1", SLOWDOWN_HEAT), Heat("t2", "r1", SLOWDOWN_HEAT)
T3_HOT = Heat("t3", "r1", SLOWDOWN_HEAT, start=30)

TRAYS = [
    pytest.param(
        [T1_SHUT, T2_SHUT, T3_HOT], True, {"t1", "t2"}, {"t3"}, id="two-shutdown-heat-one-hot"
    ),
    pytest.param(
        [T1_HOT, T2_HOT, Heat("t3", "r1", SHUTDOWN_HEAT, start=100)],
        True,
        {"t1", "t2"},
        {"t3"},
        id="two-hot-then-one-shutdown-heat",
    ),
    pytest.param(
        [T1_SHUT, Heat("t2", "r1", SLOWDOWN_HEAT, start=5), T3_HOT],
        True,
        {"t1", "t2"},
        {"t3"},
        id="one-shutdown-heat-then-two-hot",
    ),
    pytest.param(
        [T1_SHUT, Heat("t2", "r2", SHUTDOWN_HEAT), Heat("t3", "r3", SLOWDOWN_HEAT, start=30)],
        True,
        {"t1", "t2", "t3"},
        set(),
        id="one-tray-in-each-of-three-racks",
    ),
    pytest.param(
        [T1_SHUT, T2_SHUT, T3_HOT],
        False,
        {"t1", "t2", "t3"},
        set(),
        id="per-rule-caps-alone-let-the-third-go",
    ),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("heats", "blast_radius", "down", "held"), TRAYS)
def test_three_trays_of_a_rack_under_two_rules(
    heats: list[Heat], blast_radius: bool, down: set[str], held: set[str]
) -> None:
    rules = load_default_rules()  # blast_radius per_rack: 2
    engine = PolicyEngine(rules if blast_radius else without_blast_radius(rules))
    actions = run(engine, heats)
    fired = {a.rule for a in actions if a.kind in TAKE_DOWN_KINDS}
    assert {"gpu-hot", "gpu-shutdown-heat"} <= fired, "both rules must take part"
    assert taken_down(actions) == down
    assert held_back(actions) == held
    for node in held:
        refused = [a.suppressed for a in actions if a.node == node and a.kind in TAKE_DOWN_KINDS]
        assert refused and all(r and r.startswith("cap: ") for r in refused)
        # Its first take-down is refused by the shared budget (a later one may
        # also be over the rule's own cap, which is then named first).
        assert refused[0] == (
            "cap: all rules together already took down 2 node(s) in rack r1 "
            "within 600s (blast_radius per_rack=2)"
        )


@pytest.mark.timeout(30)
def test_the_fleet_budget_counts_every_rack() -> None:
    engine = engine_for(
        """
version: v1
blast_radius: {fleet: 3, window: 10m}
rules:
  - name: hot
    when: {metric: gpu_temp_c, op: ">=", value: 90}
    for_samples: 2
    actions: [drain]
"""
    )
    actions = run(engine, [Heat(f"t{i}", f"r{i}", SHUTDOWN_HEAT, start=i) for i in range(5)])
    assert taken_down(actions) == {"t0", "t1", "t2"}
    assert held_back(actions) == {"t3", "t4"}
    assert all("blast_radius fleet=3" in (a.suppressed or "") for a in actions if a.node == "t4")


@pytest.mark.timeout(30)
def test_a_node_already_counted_is_not_counted_twice() -> None:
    # gpu-hot drains t2, then gpu-shutdown-heat powers t1 off: two nodes. t2's
    # graceful power-off 300 s after its drain is a node already counted.
    actions = run(
        PolicyEngine(load_default_rules()),
        [Heat("t1", "r1", SHUTDOWN_HEAT, start=60), Heat("t2", "r1", SLOWDOWN_HEAT)],
    )
    removing = [a for a in actions if a.kind in TAKE_DOWN_KINDS]
    assert {a.kind for a in removing} >= {ActionKind.DRAIN, ActionKind.POWER_OFF_NOW}
    assert all(a.executable for a in removing)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["constructor", "restore"])
def test_a_restored_engine_keeps_counting(how: str) -> None:
    rules = load_default_rules()
    racks = {"t1": "r1", "t2": "r1", "t3": "r1"}
    before = run(
        PolicyEngine(rules), [Heat("t1", "r1", SHUTDOWN_HEAT), Heat("t2", "r1", SHUTDOWN_HEAT)]
    )
    assert taken_down(before) == {"t1", "t2"}
    history = past(before, racks)
    # The controller restarts: a new engine, given back what was recorded.
    if how == "constructor":
        engine = PolicyEngine(rules, history=history)
    else:
        engine = PolicyEngine(rules)
        assert engine.restore(history) == len([a for a in history if a.kind in TAKE_DOWN_KINDS])
    after = run(engine, [Heat("t3", "r1", SLOWDOWN_HEAT, start=200)], until=600)
    assert taken_down(after) == set()
    assert held_back(after) == {"t3"}
    # Without the history the same tray would have gone down (the old fault).
    fresh = run(PolicyEngine(rules), [Heat("t3", "r1", SLOWDOWN_HEAT, start=200)], until=600)
    assert taken_down(fresh) == {"t3"}


@pytest.mark.timeout(30)
def test_restored_take_downs_expire_with_the_window() -> None:
    rules = load_default_rules()  # window 600 s
    history = [
        PastAction("gpu-shutdown-heat", n, "r1", ActionKind.POWER_OFF_NOW, at=0.0)
        for n in ("t1", "t2")
    ]
    inside = run(PolicyEngine(rules, history), [Heat("t3", "r1", SLOWDOWN_HEAT, start=100)])
    assert held_back(inside) == {"t3"}
    later = run(
        PolicyEngine(rules, history), [Heat("t3", "r1", SLOWDOWN_HEAT, start=700)], until=1200
    )
    assert taken_down(later) == {"t3"}


@pytest.mark.timeout(30)
def test_per_rule_caps_are_restored_too() -> None:
    rules = without_blast_radius(load_default_rules())  # gpu-shutdown-heat: per_rack 2
    history = [
        PastAction("gpu-shutdown-heat", n, "r1", ActionKind.POWER_OFF_NOW, at=0.0)
        for n in ("t1", "t2")
    ]
    actions = run(PolicyEngine(rules, history), [Heat("t3", "r1", SHUTDOWN_HEAT, start=50)])
    offs = [a for a in actions if a.kind is ActionKind.POWER_OFF_NOW]
    assert offs and all(a.suppressed for a in offs)
    assert "rule gpu-shutdown-heat already took down 2" in (offs[0].suppressed or "")


DRY_AND_LIVE = """
version: v1
blast_radius: {per_rack: 2, window: 10m}
rules:
  - name: live
    when: {metric: gpu_temp_c, op: ">=", value: 94}
    for_samples: 2
    actions: [drain]
  - name: trial
    dry_run: true
    when: {metric: gpu_temp_c, op: ">=", value: 87}
    for_samples: 2
    actions: [drain]
"""


@pytest.mark.timeout(30)
def test_a_dry_run_rule_never_uses_up_the_live_budget() -> None:
    engine = engine_for(DRY_AND_LIVE)
    # The trial rule (dry run) "takes" t1 and t2; the live rule may still take two.
    actions = run(
        engine,
        [T1_HOT, T2_HOT, *(Heat(n, "r1", SHUTDOWN_HEAT, start=50) for n in ("t3", "t4", "t5"))],
    )

    live = [a for a in actions if a.rule == "live"]
    assert [(a.node, a.executable) for a in live] == [("t3", True), ("t4", True), ("t5", False)]
    # The trial rule reports what it would do were it live: t3 and t4 are
    # already down, so of its own it would add nothing more to rack r1.
    trial = {a.node: a.suppressed is None for a in actions if a.rule == "trial"}
    assert trial == {"t1": True, "t2": True, "t3": True, "t4": True, "t5": False}


@pytest.mark.timeout(30)
def test_blast_radius_loads_as_data() -> None:
    rules = load_rules(
        """
version: v1
blast_radius: {per_rack: 1, fleet: 4, window: 15m, counts: [quarantine, power_off]}
rules:
  - name: hot
    when: {metric: gpu_temp_c, op: ">=", value: 90}
    for_samples: 2
    actions: [drain, {power_off: now}]
"""
    )
    assert rules.blast_radius == BlastRadius(
        Cap(per_rack=1, fleet=4, window_s=900.0),
        frozenset({ActionKind.QUARANTINE, ActionKind.POWER_OFF_NOW, ActionKind.POWER_OFF_GRACEFUL}),
    )
    assert rules.cap_window_s == 900.0
    assert load_default_rules().blast_radius == BlastRadius(Cap(2, 10, 600.0), TAKE_DOWN_KINDS)
    no_budget = load_rules(
        "version: v1\nrules:\n  - name: d\n"
        "    when: {metric: gpu_temp_c, op: '>', value: 90}\n    actions: [drain]\n"
    )
    assert no_budget.blast_radius is None


HOT_RULE = (
    "rules:\n  - name: hot\n    when: {metric: gpu_temp_c, op: '>', value: 90}\n"
    "    actions: [drain]\n"
)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("blast_radius", "where", "problem"),
    [
        pytest.param("{per_rack: 2}", "blast_radius.window", "is required", id="no-window"),
        pytest.param("{per_rack: -1, window: 1m}", "blast_radius.per_rack", ">= 0", id="negative"),
        pytest.param(
            "{per_rak: 2, window: 1m}", "blast_radius", "unknown field(s) per_rak", id="typo"
        ),
        pytest.param(
            "{window: 1m, counts: [notify_job]}",
            "blast_radius.counts",
            "'notify_job' is not one of drain, quarantine, power_off, power_cycle",
            id="counts-notify",
        ),
        pytest.param(
            "{window: 1m, counts: []}", "blast_radius.counts", "non-empty", id="counts-empty"
        ),
        pytest.param(
            "{window: 1m, counts: [drain, drain]}",
            "blast_radius.counts",
            "lists drain twice",
            id="counts-twice",
        ),
        pytest.param("[2, 10]", "blast_radius", "must be a mapping", id="not-a-mapping"),
    ],
)
def test_invalid_blast_radius_is_rejected(blast_radius: str, where: str, problem: str) -> None:
    with pytest.raises(RuleSetError) as info:
        load_rules(f"version: v1\nblast_radius: {blast_radius}\n{HOT_RULE}")
    assert info.value.fields["where"] == where
    assert problem in info.value.fields["problem"]


@pytest.mark.timeout(30)
def test_a_rule_cannot_declare_its_own_blast_radius() -> None:
    with pytest.raises(RuleSetError, match="unknown field\\(s\\) blast_radius"):
        load_rules("version: v1\n" + HOT_RULE + "    blast_radius: {window: 1m}\n")
