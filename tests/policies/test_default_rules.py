"""Table tests: each shipped rule, driven by realistic sample sequences."""

from __future__ import annotations

import pytest
from policy_builders import agent, bmc, feed, gpu, hot, kinds

from controller.policies import ActionKind, HealthSample, Metric, PolicyEngine, load_default_rules
from controller.policies import RecoveryAction as RA

pytestmark = pytest.mark.timeout(30)


def every(seconds: float, count: int, make: object, start: float = 0.0) -> list[HealthSample]:
    assert callable(make)
    return [make(start + i * seconds) for i in range(count)]


CASES = [
    pytest.param(
        every(10, 7, lambda t: hot("n1", t, 87.0)),
        ["drain", "notify_job"],
        id="gpu-hot-sustained-60s-drains-and-notifies",
    ),
    pytest.param(
        every(10, 6, lambda t: hot("n1", t, 87.0)),
        [],
        id="gpu-hot-held-50s-not-yet",
    ),
    pytest.param(
        every(10, 12, lambda t: hot("n1", t, 80.0)),
        [],
        id="gpu-warm-below-margin-nothing",
    ),
    pytest.param(
        every(5, 3, lambda t: hot("n1", t, 93.0)),
        # shutdown heat is also within the slowdown margin, but only 10s of it
        ["notify_job", "power_off_now"],
        id="gpu-shutdown-heat-3-samples-powers-off-now",
    ),
    pytest.param(
        every(5, 2, lambda t: hot("n1", t, 93.0)),
        [],
        id="gpu-shutdown-heat-2-samples-not-yet",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0), gpu(1, dbe=2))],
        ["notify_job", "quarantine"],
        id="uncorrectable-ecc-quarantines",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0), gpu(1, remap_failure=True))],
        ["notify_job", "quarantine"],
        id="row-remap-failed-quarantines",
    ),
    pytest.param(
        [agent("n1", t, gpu(0, remap_pending=True)) for t in (0, 10)],
        ["reset_gpu"],
        id="row-remap-pending-resets-the-gpu",
    ),
    pytest.param(
        [agent("n1", t, gpu(0, None, lost=True), gpu(1)) for t in (0, 10)],
        ["notify_job", "quarantine"],
        id="gpu-lost-quarantines",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, xids=(79,)))],
        ["notify_job", "quarantine", "power_cycle"],
        id="xid-79-quarantines-and-power-cycles",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, xids=(48,)))],
        ["notify_job", "quarantine"],
        id="xid-48-quarantines-without-power-cycle",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, xids=(63,)), gpu(1, xids=(92,)), gpu(2, xids=(94,)))],
        [],
        id="xid-63-92-94-do-nothing",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, xids=(62,)))],
        ["notify_job", "reset_gpu"],
        id="xid-62-resets-the-gpu",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0), gpu(1, xids=(95,)), gpu(2, xids=(158,)))],
        ["notify_job", "reset_gpu"],
        id="xid-95-and-158-one-reset-of-both-gpus",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, recovery_action=RA.GPU_RESET))],
        ["notify_job", "reset_gpu"],
        id="recovery-gpu-reset-resets",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0), gpu(1, recovery_action=RA.DRAIN_AND_RESET))],
        ["notify_job", "reset_gpu"],
        id="recovery-drain-and-reset-resets",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, recovery_action=RA.DRAIN_P2P))],
        ["notify_job", "reset_gpu"],
        id="recovery-drain-p2p-drains-then-resets",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, recovery_action=RA.NODE_REBOOT))],
        ["notify_job", "quarantine", "power_cycle"],
        id="recovery-node-reboot-quarantines-and-reboots",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, recovery_action=RA.SYSTEM_REBOOT))],
        ["notify_job", "quarantine", "power_cycle"],
        id="recovery-system-reboot-quarantines-and-reboots",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, recovery_action=RA.BUS_RESET))],
        ["notify_job", "drain"],
        id="recovery-bus-reset-drains-for-an-operator",
    ),
    pytest.param(
        [agent("n1", t, gpu(0), gpu(1)) for t in (0, 10)],
        [],
        id="recovery-none-nothing",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, recovery_action=99))],
        [],
        id="recovery-action-unknown-to-kiln-nothing",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, xids=(154,)))],
        [],
        id="xid-154-alone-nothing-the-field-decides",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0, xids=(74,)))],
        ["notify_job", "drain"],
        id="xid-74-nvlink-drains",
    ),
    pytest.param(
        every(10, 7, lambda t: bmc("n1", t, 60.0, 87.5, 61.0)),
        ["drain", "notify_job"],
        id="bmc-source-drives-gpu-hot-with-absolute-threshold",
    ),
    pytest.param(
        every(5, 3, lambda t: bmc("n1", t, 60.0, 95.0)),
        ["notify_job", "power_off_now"],
        id="bmc-source-drives-shutdown-heat",
    ),
    pytest.param(
        every(10, 12, lambda t: bmc("n1", t, 60.0, 70.0)),
        [],
        id="bmc-source-cool-nothing",
    ),
    pytest.param(
        [agent("n1", t, gpu(0), gpu(1, nvlink_down=2)) for t in (0, 10)],
        ["notify_job", "drain"],
        id="nvlinks-down-two-samples-drain",
    ),
    pytest.param(
        [agent("n1", 0, gpu(0), gpu(1, nvlink_down=1))],
        [],
        id="nvlink-down-one-sample-not-yet",
    ),
    pytest.param(
        [agent("n1", t, gpu(0, fabric_degraded=True)) for t in (0, 10)],
        ["notify_job", "drain"],
        id="fabric-degraded-drains",
    ),
    pytest.param(
        [agent("n1", t, gpu(0, fabric_degraded=None)) for t in (0, 10)],
        [],
        id="no-fabric-is-not-degraded",
    ),
]


@pytest.mark.parametrize(("samples", "expected"), CASES)
def test_default_rule(samples: list[HealthSample], expected: list[str]) -> None:
    engine = PolicyEngine(load_default_rules())
    actions = feed(engine, samples)
    assert kinds(actions) == expected
    assert all(a.node == "n1" and a.executable for a in actions)


def test_default_rules_never_name_informational_xids() -> None:
    for rule in load_default_rules().rules:
        if rule.when.metric is Metric.XID:
            assert isinstance(rule.when.value, frozenset)
            assert not rule.when.value & {63, 92, 94}, rule.name


def test_agent_silent_then_bmc_fallback_takes_over() -> None:
    """Agent reports heat, falls silent; BMC samples at the same cadence keep
    the rule working (the streak restarts with the new source's series)."""
    engine = PolicyEngine(load_default_rules())
    actions = feed(engine, [hot("n1", t, 88.0) for t in (0, 10, 20)])
    actions += feed(engine, [bmc("n1", t, 88.0) for t in range(30, 90, 10)])
    assert kinds(actions) == []
    actions = engine.observe(bmc("n1", 90, 88.0))
    assert kinds(actions) == ["drain", "notify_job"]
    assert "from bmc" in actions[0].reason


def test_bmc_sample_does_not_clear_ecc_episode() -> None:
    engine = PolicyEngine(load_default_rules())
    assert kinds(engine.observe(agent("n1", 0, gpu(0, dbe=1)))) == ["notify_job", "quarantine"]
    assert engine.observe(bmc("n1", 10, 50.0)) == []
    # The volatile counter is still set: same episode, no repeat.
    assert engine.observe(agent("n1", 20, gpu(0, dbe=1))) == []


def test_reason_names_gpu_value_and_duration() -> None:
    engine = PolicyEngine(load_default_rules())
    actions = feed(engine, [hot("n1", t, 87.0, hot_index=5) for t in range(0, 70, 10)])
    reason = actions[0].reason
    assert "gpu5" in reason
    assert "gpu_temp_margin_to_slowdown_c=2" in reason
    assert "for 60s over 7 samples" in reason
    assert actions[0].kind is ActionKind.DRAIN
    assert actions[0].rule == "gpu-hot"
    assert actions[0].at == 60
