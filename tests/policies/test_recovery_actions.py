"""NVML's recovery action as a policy metric, and the reset_gpu and reboot actions.

The loader takes recovery actions by name only (``in: [gpu_reset, ...]``,
``== node_reboot``, ``!= none``) and says what it knows when a name is wrong;
the engine treats the field as a level (one episode while it is set) and
names the GPUs that fired, which are the ones ``reset_gpu`` resets.
"""

from __future__ import annotations

import textwrap

import pytest
from policy_builders import agent, engine_for, feed, gpu, kinds

from controller.policies import (
    TAKE_DOWN_KINDS,
    ActionKind,
    Metric,
    Op,
    PastAction,
    PolicyEngine,
    RecoveryAction,
    RuleSetError,
    load_rules,
)

pytestmark = pytest.mark.timeout(30)

RA = RecoveryAction
ALL_NAMES = "none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, recover_imex_domain"


def rules(when: str, actions: str = "[reset_gpu]", extra: str = "") -> str:
    body = f"""
    version: v1
    {extra}
    rules:
      - name: r
        when: {when}
        actions: {actions}
    """
    return textwrap.dedent(body)


# -- loading -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "op", "value"),
    [
        pytest.param(
            "{metric: recovery_action, in: [gpu_reset, drain_and_reset]}",
            Op.IN,
            frozenset({1, 4}),
            id="in-names",
        ),
        pytest.param(
            "{metric: recovery_action, op: '==', value: node_reboot}", Op.EQ, 2.0, id="equals-name"
        ),
        pytest.param("{metric: recovery_action, op: '!=', value: none}", Op.NE, 0.0, id="not-none"),
        pytest.param(
            "{metric: recovery_action, in: [system_reboot]}",
            Op.IN,
            frozenset({7}),
            id="a-newer-action-by-name",
        ),
    ],
)
def test_recovery_action_conditions_take_names(
    when: str, op: Op, value: float | frozenset[int]
) -> None:
    (rule,) = load_rules(rules(when)).rules
    assert rule.when.metric is Metric.RECOVERY_ACTION
    assert (rule.when.op, rule.when.value) == (op, value)


BAD = [
    pytest.param(
        "{metric: recovery_action, in: [gpu_rest]}",
        "[reset_gpu]",
        "rule 'r' field 'when'.in",
        f"unknown recovery action 'gpu_rest' (known: {ALL_NAMES}",
        id="misspelt-name",
    ),
    pytest.param(
        "{metric: recovery_action, in: [1]}",
        "[reset_gpu]",
        "rule 'r' field 'when'.in",
        "unknown recovery action 1 (known: none, gpu_reset",
        id="number-instead-of-name",
    ),
    pytest.param(
        "{metric: recovery_action, op: '==', value: GPU_RESET}",
        "[reset_gpu]",
        "rule 'r' field 'when'.value",
        "unknown recovery action 'GPU_RESET'",
        id="upper-case-name",
    ),
    pytest.param(
        "{metric: recovery_action, op: '>=', value: gpu_reset}",
        "[reset_gpu]",
        "rule 'r' field 'when'.op",
        "takes '==' or '!=' with a recovery action, or 'in: [...]', not '>='",
        id="ordering-op",
    ),
    pytest.param(
        "{metric: recovery_action, in: []}",
        "[reset_gpu]",
        "rule 'r' field 'when'.in",
        "non-empty list of recovery actions (none, gpu_reset",
        id="empty-list",
    ),
    pytest.param(
        "{metric: recovery_action, op: '=='}",
        "[reset_gpu]",
        "rule 'r' field 'when'.value",
        "is required",
        id="missing-value",
    ),
    pytest.param(
        "{metric: gpu_temp_c, op: '>', value: 90}",
        "[drain, reset_gpu]",
        "rule 'r' field 'actions'",
        "reset_gpu needs a GPU to reset",
        id="reset-gpu-on-a-thermal-rule",
    ),
    pytest.param(
        "{metric: xid, in: [79]}",
        "[reboot, power_cycle]",
        "rule 'r' field 'actions'",
        "same action twice",
        id="reboot-is-power-cycle",
    ),
    pytest.param(
        "{metric: xid, in: [79]}",
        "[reset_gpu, reset_gpu]",
        "rule 'r' field 'actions'",
        "same action twice",
        id="reset-gpu-twice",
    ),
    pytest.param(
        "{metric: xid, in: [62]}",
        "[{reset_gpu: now}]",
        "rule 'r' field 'actions'[0]",
        "unknown action ['reset_gpu']",
        id="reset-gpu-takes-no-arguments",
    ),
]


@pytest.mark.parametrize(("when", "actions", "where", "problem"), BAD)
def test_recovery_action_mistakes_are_named(
    when: str, actions: str, where: str, problem: str
) -> None:
    with pytest.raises(RuleSetError) as info:
        load_rules(rules(when, actions))
    assert info.value.fields["where"] == where
    assert problem in info.value.fields["problem"]


def test_reboot_is_the_bmc_power_cycle_and_reset_gpu_its_own_kind() -> None:
    (rule,) = load_rules(rules("{metric: xid, in: [62, 79]}", "[reset_gpu, reboot]")).rules
    assert [a.kind for a in rule.actions] == [ActionKind.RESET_GPU, ActionKind.POWER_CYCLE]
    assert ActionKind.RESET_GPU in TAKE_DOWN_KINDS


def test_a_blast_radius_may_count_or_leave_out_gpu_resets() -> None:
    counted = load_rules(
        rules("{metric: xid, in: [62]}", extra="blast_radius: {window: 1m, counts: [reset_gpu]}")
    )
    assert counted.blast_radius is not None
    assert counted.blast_radius.kinds == {ActionKind.RESET_GPU}
    default = load_rules(rules("{metric: xid, in: [62]}", extra="blast_radius: {window: 1m}"))
    assert default.blast_radius is not None and ActionKind.RESET_GPU in default.blast_radius.kinds
    with pytest.raises(RuleSetError) as info:
        load_rules(
            rules("{metric: xid, in: [62]}", extra="caps: {reset_gpu: {per_rack: 1, window: 1m}}")
        )
    assert "unknown field(s) reset_gpu" in info.value.fields["problem"]


# -- matching ------------------------------------------------------------------

RESET = rules("{metric: recovery_action, in: [gpu_reset, drain_and_reset]}")


def test_fires_once_per_episode_names_the_gpus_and_rearms_when_none() -> None:
    engine = engine_for(RESET)
    first = engine.observe(
        agent(
            "n1",
            0,
            gpu(0),
            gpu(2, recovery_action=RA.GPU_RESET),
            gpu(5, recovery_action=RA.DRAIN_AND_RESET),
        )
    )
    assert kinds(first) == ["reset_gpu"]
    assert first[0].gpus == (2, 5)
    reason = first[0].reason
    assert "gpu2 recovery_action=gpu_reset" in reason
    assert "(recovery_action in [drain_and_reset, gpu_reset])" in reason
    # A level: still set on the next report is the same episode, not a new action.
    assert engine.observe(agent("n1", 10, gpu(0), gpu(2, recovery_action=RA.GPU_RESET))) == []
    # Every GPU reads none: the episode ends; set again, the rule fires again.
    assert engine.observe(agent("n1", 20, gpu(0), gpu(2))) == []
    again = engine.observe(agent("n1", 30, gpu(0, recovery_action=RA.GPU_RESET), gpu(2)))
    assert kinds(again) == ["reset_gpu"] and again[0].gpus == (0,)


def test_actions_other_than_those_matched_do_not_fire() -> None:
    engine = engine_for(RESET)
    samples = [
        agent("n1", 0, gpu(0, recovery_action=RA.NODE_REBOOT)),
        agent("n1", 10, gpu(0, recovery_action=RA.DRAIN_P2P)),
        agent("n1", 20, gpu(0, recovery_action=RA.NONE)),
    ]
    assert feed(engine, samples) == []


def test_not_none_matches_every_action_kiln_knows() -> None:
    engine = engine_for(rules("{metric: recovery_action, op: '!=', value: none}", "[drain]"))
    fired = [
        kinds(engine.observe(agent(f"n{action}", 0, gpu(0, recovery_action=action))))
        for action in RA
    ]
    assert fired == [[]] + [["drain"]] * (len(RA) - 1)


@pytest.mark.parametrize(
    "reading",
    [
        pytest.param(gpu(0, recovery_action=None), id="not-read"),
        pytest.param(gpu(0, recovery_action=42), id="a-value-kiln-does-not-know"),
        pytest.param(gpu(0, None, recovery_action=RA.GPU_RESET, lost=True), id="gpu-lost"),
    ],
)
def test_unknown_readings_never_fire_and_never_end_an_episode(reading: object) -> None:
    engine = engine_for(rules("{metric: recovery_action, op: '!=', value: none}", "[drain]"))
    assert engine.observe(agent("n1", 0, reading)) == []  # type: ignore[arg-type]
    assert kinds(engine.observe(agent("n1", 10, gpu(0, recovery_action=RA.GPU_RESET)))) == ["drain"]
    # The field unreadable again: not a GPU that recovered, the episode goes on.
    assert engine.observe(agent("n1", 20, reading)) == []  # type: ignore[arg-type]
    assert engine.observe(agent("n1", 30, gpu(0, recovery_action=RA.GPU_RESET))) == []


def test_an_xid_rule_resets_exactly_the_gpus_that_saw_the_xid() -> None:
    engine = engine_for(rules("{metric: xid, in: [62, 95]}", "[notify_job, reset_gpu]"))
    actions = engine.observe(
        agent("n1", 0, gpu(0), gpu(1, xids=(95,)), gpu(3, xids=(62, 13)), gpu(4, xids=(13,)))
    )
    assert kinds(actions) == ["notify_job", "reset_gpu"]
    assert {a.gpus for a in actions} == {(1, 3)}


# -- caps ----------------------------------------------------------------------

CAPPED = rules(
    "{metric: recovery_action, in: [gpu_reset]}",
    "[notify_job, reset_gpu]",
    extra="blast_radius: {per_rack: 1, window: 10m}",
)


def test_gpu_resets_count_against_the_blast_radius() -> None:
    engine = engine_for(CAPPED)
    one = engine.observe(agent("n1", 0, gpu(0, recovery_action=RA.GPU_RESET)))
    two = engine.observe(agent("n2", 1, gpu(0, recovery_action=RA.GPU_RESET)))
    assert [(a.kind, a.suppressed) for a in one] == [
        (ActionKind.NOTIFY_JOB, None),
        (ActionKind.RESET_GPU, None),
    ]
    assert two[0].executable  # the job still hears of it
    assert two[1].kind is ActionKind.RESET_GPU and not two[1].executable
    assert two[1].suppressed is not None
    assert "blast_radius per_rack=1" in two[1].suppressed


def test_a_restored_gpu_reset_goes_on_counting() -> None:
    past = [PastAction("r", "n1", "r1", ActionKind.RESET_GPU, at=0.0)]
    engine = PolicyEngine(load_rules(CAPPED), history=past)
    actions = engine.observe(agent("n2", 60, gpu(0, recovery_action=RA.GPU_RESET)))
    assert actions[1].kind is ActionKind.RESET_GPU and actions[1].suppressed


def test_a_blast_radius_without_reset_gpu_leaves_resets_uncounted() -> None:
    engine = engine_for(
        rules(
            "{metric: recovery_action, in: [gpu_reset]}",
            extra="blast_radius: {per_rack: 1, window: 10m, counts: [drain, quarantine]}",
        )
    )
    for i in range(3):
        (action,) = engine.observe(agent(f"n{i}", i, gpu(0, recovery_action=RA.GPU_RESET)))
        assert action.executable, action.suppressed
