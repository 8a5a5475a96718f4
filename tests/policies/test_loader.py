"""Rule set validation: every mistake is rejected with the rule and field named."""

from __future__ import annotations

import textwrap

import pytest

from controller.core.errors import InvalidArgument
from controller.policies import ActionKind, Metric, Op, RuleSetError, load_default_rules, load_rules

pytestmark = pytest.mark.timeout(30)

VALID = """
version: v1
dry_run: false
max_sample_gap: 45s
thresholds: {slowdown_c: 87, shutdown_c: 92}
caps:
  power_off: {per_rack: 1, fleet: 4, window: 10m}
rules:
  - name: gpu-hot
    when: {metric: gpu_temp_margin_to_slowdown_c, op: "<=", value: 5}
    for: 60s
    actions: [drain, notify_job, {power_off: graceful, after: 300s}]
  - name: fatal-xid
    when: {metric: xid, in: [48, 79]}
    actions: [quarantine, {power_cycle_on_xid: [79]}]
    caps: {power_cycle: {per_rack: 1, window: 1h}}
"""


def test_valid_rule_set_parses_to_typed_rules() -> None:
    rs = load_rules(VALID)
    assert rs.max_sample_gap_s == 45.0
    hot, xid = rs.rules
    assert (hot.when.metric, hot.when.op, hot.when.value) == (
        Metric.GPU_TEMP_MARGIN_TO_SLOWDOWN_C,
        Op.LE,
        5.0,
    )
    assert hot.for_s == 60.0
    assert [a.kind for a in hot.actions] == [
        ActionKind.DRAIN,
        ActionKind.NOTIFY_JOB,
        ActionKind.POWER_OFF_GRACEFUL,
    ]
    assert hot.actions[2].after_s == 300.0
    assert hot.thresholds.slowdown_c == 87.0
    assert (hot.caps.power_off.per_rack, hot.caps.power_off.fleet) == (1, 4)
    assert hot.caps.power_off.window_s == 600.0
    assert xid.when.value == frozenset({48, 79})
    assert xid.actions[1].on_xids == frozenset({79})
    assert xid.caps.power_cycle.per_rack == 1 and xid.caps.power_cycle.fleet is None
    assert xid.caps.power_off == hot.caps.power_off


def test_default_rules_load() -> None:
    names = [r.name for r in load_default_rules().rules]
    assert {"gpu-hot", "gpu-shutdown-heat", "uncorrectable-ecc", "fatal-xid"} <= set(names)


def rule(body: str) -> str:
    return "version: v1\nrules:\n" + textwrap.indent(textwrap.dedent(body).strip(), "  ") + "\n"


HOT = "- name: hot\n  when: {metric: gpu_temp_c, op: '>', value: 90}\n"

BAD = [
    pytest.param(
        "version: v2\nrules: []\n", "version", "unsupported version 'v2'", id="unknown-version"
    ),
    pytest.param("rules: []\n", "version", "unsupported version None", id="missing-version"),
    pytest.param("version: v1\nrules: []\n", "rules", "non-empty", id="no-rules"),
    pytest.param(
        "version: v1\nrulez: []\n", "document", "unknown field(s) rulez", id="unknown-top-key"
    ),
    pytest.param("version: v1\nrules: [", "document", "not valid YAML", id="not-yaml"),
    pytest.param("- a\n- b\n", "document", "must be a mapping", id="not-a-mapping"),
    pytest.param(
        rule(HOT + "  actions: [drain]\n  fro: 60s"),
        "rule 'hot'",
        "unknown field(s) fro",
        id="unknown-rule-key",
    ),
    pytest.param(
        rule("- name: hot\n  when: {metric: gpu_tmp, op: '>', value: 1}\n  actions: [drain]"),
        "rule 'hot' field 'when'.metric",
        "unknown metric 'gpu_tmp'",
        id="unknown-metric",
    ),
    pytest.param(
        rule("- name: hot\n  when: {metric: gpu_temp_c, op: '=~', value: 1}\n  actions: [drain]"),
        "rule 'hot' field 'when'.op",
        "unknown op '=~'",
        id="unknown-op",
    ),
    pytest.param(
        rule("- name: hot\n  when: {metric: gpu_temp_c, op: '>', value: hot}\n  actions: [drain]"),
        "rule 'hot' field 'when'.value",
        "needs a finite number",
        id="non-numeric-value",
    ),
    pytest.param(
        rule("- name: hot\n  when: {metric: gpu_temp_c, op: '>'}\n  actions: [drain]"),
        "rule 'hot' field 'when'.value",
        "is required",
        id="missing-value",
    ),
    pytest.param(
        rule("- name: r\n  when: {metric: remap_failure, op: '>', value: 1}\n  actions: [drain]"),
        "rule 'r' field 'when'",
        "is a boolean",
        id="bool-metric-with-number",
    ),
    pytest.param(
        rule("- name: x\n  when: {metric: xid, op: '==', value: 79}\n  actions: [drain]"),
        "rule 'x' field 'when'.op",
        "takes 'in",
        id="xid-without-in",
    ),
    pytest.param(
        rule("- name: x\n  when: {metric: xid, in: []}\n  actions: [drain]"),
        "rule 'x' field 'when'.in",
        "non-empty list",
        id="xid-empty-list",
    ),
    pytest.param(
        rule("- name: x\n  when: {metric: gpu_temp_c, in: [1]}\n  actions: [drain]"),
        "rule 'x' field 'when'.op",
        "only applies to metric xid",
        id="in-on-non-xid",
    ),
    pytest.param(
        rule(HOT + "  actions: [reboot_now]"),
        "rule 'hot' field 'actions'[0]",
        "unknown action 'reboot_now'",
        id="unknown-action",
    ),
    pytest.param(
        rule(HOT + "  actions: []"), "rule 'hot' field 'actions'", "non-empty list", id="no-actions"
    ),
    pytest.param(
        rule(HOT + "  actions: [drain, drain]"),
        "rule 'hot' field 'actions'",
        "same action twice",
        id="duplicate-action",
    ),
    pytest.param(
        rule(HOT + "  actions: [{power_off: now}]"),
        "rule 'hot' field 'actions'",
        "needs 'for' or 'for_samples'",
        id="power-off-without-for",
    ),
    pytest.param(
        rule(HOT + "  for: 1m\n  actions: [{power_off: soon}]"),
        "rule 'hot' field 'actions'[0].power_off",
        "'now' or 'graceful'",
        id="bad-power-off-mode",
    ),
    pytest.param(
        rule(HOT + "  for: 1m\n  actions: [{power_off: now, after: 5s}]"),
        "rule 'hot' field 'actions'[0].after",
        "only applies to power_off: graceful",
        id="after-on-power-off-now",
    ),
    pytest.param(
        rule(HOT + "  for: sixty\n  actions: [drain]"),
        "rule 'hot' field 'for'",
        "is not a duration",
        id="bad-duration",
    ),
    pytest.param(
        rule(HOT + "  for: 0s\n  actions: [drain]"),
        "rule 'hot' field 'for'",
        "longer than 0s",
        id="zero-duration",
    ),
    pytest.param(
        rule(HOT + "  for_samples: 1\n  actions: [drain]"),
        "rule 'hot' field 'for_samples'",
        "integer >= 2",
        id="for-samples-one",
    ),
    pytest.param(
        rule(HOT + "  actions: [{power_cycle_on_xid: [79]}]"),
        "rule 'hot' field 'actions'[0]",
        "only applies to a rule on metric xid",
        id="power-cycle-on-non-xid-rule",
    ),
    pytest.param(
        rule("- name: x\n  when: {metric: xid, in: [48]}\n  actions: [{power_cycle_on_xid: [79]}]"),
        "rule 'x' field 'actions'[0].power_cycle_on_xid",
        "XIDs [79] are not in",
        id="power-cycle-xid-not-in-rule",
    ),
    pytest.param(
        rule(HOT + "  actions: [drain]\n" + HOT + "  actions: [drain]"),
        "rules[1] 'hot'",
        "duplicate rule name",
        id="duplicate-rule-name",
    ),
    pytest.param(
        rule(
            "- name: Hot Rule\n  when: {metric: gpu_temp_c, op: '>', value: 1}\n  actions: [drain]"
        ),
        "rules[0].name",
        "not a valid name",
        id="bad-rule-name",
    ),
    pytest.param(
        "version: v1\ncaps: {power_off: {per_rack: 2}}\n" + rule(HOT + "  actions: [drain]")[12:],
        "caps.power_off.window",
        "is required",
        id="cap-without-window",
    ),
    pytest.param(
        "version: v1\ncaps: {power_off: {per_rack: -1, window: 1m}}\n"
        + rule(HOT + "  actions: [drain]")[12:],
        "caps.power_off.per_rack",
        "integer >= 0",
        id="negative-cap",
    ),
    pytest.param(
        "version: v1\ncaps: {power_of: {window: 1m}}\n" + rule(HOT + "  actions: [drain]")[12:],
        "caps",
        "unknown field(s) power_of",
        id="unknown-cap-kind",
    ),
    pytest.param(
        "version: v1\nthresholds: {slowdown_c: 900}\n" + rule(HOT + "  actions: [drain]")[12:],
        "thresholds.slowdown_c",
        "(0, 150]",
        id="impossible-threshold",
    ),
    pytest.param(
        "version: v1\ndry_run: yes please\n" + rule(HOT + "  actions: [drain]")[12:],
        "dry_run",
        "true or false",
        id="dry-run-not-bool",
    ),
]


@pytest.mark.parametrize(("text", "where", "problem"), BAD)
def test_invalid_rule_sets_are_rejected(text: str, where: str, problem: str) -> None:
    with pytest.raises(RuleSetError) as info:
        load_rules(text)
    assert isinstance(info.value, InvalidArgument)
    assert info.value.fields["where"] == where
    assert problem in info.value.fields["problem"]
    assert where in str(info.value) and problem in str(info.value)
