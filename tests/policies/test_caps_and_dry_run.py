"""Caps on power-downs per rack and fleet-wide, and dry-run mode."""

from __future__ import annotations

import dataclasses

import pytest
from policy_builders import agent, engine_for, feed, gpu, hot, kinds

from controller.policies import Action, ActionKind, PolicyEngine, load_default_rules

CAPPED = """
version: v1
caps:
  power_off: {per_rack: 2, fleet: 10, window: 600s}
rules:
  - name: hot
    when: {metric: gpu_temp_c, op: ">=", value: 90}
    for_samples: 2
    actions: [drain, {power_off: now}]
"""


def heat_racks(engine: PolicyEngine, racks: int, *, start: float = 0.0) -> list[Action]:
    """Every node of ``racks`` 18-node racks reports two hot samples."""
    actions = []
    for t in (start, start + 5):
        for r in range(racks):
            for n in range(18):
                actions += engine.observe(hot(f"r{r}n{n}", t, 95.0, rack=f"r{r}"))
    return actions


def by_kind(actions: list[Action], kind: ActionKind) -> list[Action]:
    return [a for a in actions if a.kind is kind]


def test_whole_rack_heating_powers_off_at_most_per_rack_cap() -> None:
    actions = heat_racks(engine_for(CAPPED), racks=1)
    offs = by_kind(actions, ActionKind.POWER_OFF_NOW)
    assert len(by_kind(actions, ActionKind.DRAIN)) == 18
    assert all(a.suppressed is None for a in by_kind(actions, ActionKind.DRAIN))
    assert len(offs) == 18
    assert [a.node for a in offs if a.executable] == ["r0n0", "r0n1"]
    suppressed = [a for a in offs if a.suppressed]
    assert len(suppressed) == 16
    assert all(
        a.suppressed.startswith("cap: ") and "per_rack=2" in a.suppressed for a in suppressed
    )


def test_many_racks_heating_respects_fleet_cap() -> None:
    actions = heat_racks(engine_for(CAPPED), racks=8)
    executed = [a for a in by_kind(actions, ActionKind.POWER_OFF_NOW) if a.executable]
    assert len(executed) == 10
    per_rack: dict[str, int] = {}
    for a in executed:
        rack = a.node.split("n")[0]
        per_rack[rack] = per_rack.get(rack, 0) + 1
    assert max(per_rack.values()) <= 2
    fleet_refusals = [a for a in actions if a.suppressed and "fleet=10" in a.suppressed]
    assert fleet_refusals, "some refusals must name the fleet cap"


def test_cap_window_slides() -> None:
    engine = engine_for(CAPPED)
    first = heat_racks(engine, racks=1)
    assert len([a for a in first if a.kind is ActionKind.POWER_OFF_NOW and a.executable]) == 2
    # Inside the window new nodes of the same rack are still refused ...
    late = feed(engine, [hot("r0n99", t, 95.0, rack="r0") for t in (300, 305)])
    assert [a.suppressed is not None for a in late if a.kind is ActionKind.POWER_OFF_NOW] == [True]
    # ... and after it has slid past the first two, admitted again.
    later = feed(engine, [hot("r0n98", t, 95.0, rack="r0") for t in (700, 705)])
    assert [a.executable for a in later if a.kind is ActionKind.POWER_OFF_NOW] == [True]


def test_caps_count_per_rule() -> None:
    two_rules = (
        CAPPED
        + """
  - name: hot-too
    when: {metric: gpu_temp_c, op: ">=", value: 91}
    for_samples: 2
    actions: [{power_off: now}]
"""
    )
    actions = heat_racks(engine_for(two_rules), racks=1)
    executed = [(a.rule, a.node) for a in actions if a.executable and a.kind != "drain"]
    assert sorted(executed) == [
        ("hot", "r0n0"),
        ("hot", "r0n1"),
        ("hot-too", "r0n0"),
        ("hot-too", "r0n1"),
    ]


def test_rule_level_cap_overrides_default() -> None:
    text = CAPPED.replace(
        "actions: [drain, {power_off: now}]",
        "actions: [drain, {power_off: now}]\n    caps: {power_off: {per_rack: 0, window: 1h}}",
    )
    actions = heat_racks(engine_for(text), racks=1)
    assert not [a for a in actions if a.kind is ActionKind.POWER_OFF_NOW and a.executable]


@pytest.mark.parametrize(
    ("blast_radius", "quarantined"),
    [
        # The default rules' blast radius counts quarantines too: two per rack.
        pytest.param(True, [True, True, False, False, False], id="default-rules"),
        # Per-rule caps alone never cap a quarantine.
        pytest.param(False, [True] * 5, id="per-rule-caps-only"),
    ],
)
def test_power_cycle_is_capped_too(blast_radius: bool, quarantined: list[bool]) -> None:
    rules = load_default_rules()
    if not blast_radius:
        rules = dataclasses.replace(rules, blast_radius=None)
    engine = PolicyEngine(rules)
    actions = []
    for n in range(5):
        actions += engine.observe(agent(f"n{n}", 0, gpu(0, xids=(79,))))
    cycles = [a for a in actions if a.kind is ActionKind.POWER_CYCLE]
    assert [a.executable for a in cycles] == [True, True, False, False, False]
    quarantines = [a for a in actions if a.kind is ActionKind.QUARANTINE]
    assert [a.executable for a in quarantines] == quarantined


@pytest.mark.parametrize(
    ("global_dry", "rule_dry", "expected"),
    [
        pytest.param(False, False, False, id="live"),
        pytest.param(True, False, True, id="global-dry-run"),
        pytest.param(False, True, True, id="rule-dry-run"),
    ],
)
def test_dry_run(global_dry: bool, rule_dry: bool, expected: bool) -> None:
    text = CAPPED.replace("version: v1", f"version: v1\ndry_run: {str(global_dry).lower()}")
    text = text.replace("for_samples: 2", f"for_samples: 2\n    dry_run: {str(rule_dry).lower()}")
    actions = feed(engine_for(text), [hot("n1", t, 95.0) for t in (0, 5)])
    assert kinds(actions) == ["drain", "power_off_now"]
    assert [a.dry_run for a in actions] == [expected, expected]
    assert all(a.executable is not expected for a in actions)


def test_dry_run_still_reports_cap_suppression() -> None:
    text = CAPPED.replace("version: v1", "version: v1\ndry_run: true")
    actions = heat_racks(engine_for(text), racks=1)
    offs = by_kind(actions, ActionKind.POWER_OFF_NOW)
    assert all(a.dry_run for a in offs)
    assert sum(a.suppressed is None for a in offs) == 2
