"""The rule that turns one leak detector reading into ok / warning / critical
/ fault (``controller.core.leaks.classify``), case by case."""

from __future__ import annotations

import pytest

from controller.core.leaks import classify
from controller.core.model import DetectorHealth, LeakReading, LeakState

OK, WARNING, CRITICAL = DetectorHealth.OK, DetectorHealth.WARNING, DetectorHealth.CRITICAL


def reading(
    state: DetectorHealth | None = OK,
    status_state: str | None = "Enabled",
    health: DetectorHealth | None = None,
    problem: str = "",
) -> LeakReading:
    return LeakReading(
        detector="/redfish/v1/Chassis/1/ThermalSubsystem/LeakDetection/LeakDetectors/A",
        name="A",
        detector_state=state,
        status_state=status_state,
        status_health=state if health is None else health,
        read_at=1.0,
        problem=problem,
    )


CASES = [
    ("ok", reading(), LeakState.OK, "DetectorState OK"),
    ("ok-without-status", reading(status_state=None), LeakState.OK, "OK"),
    ("critical", reading(CRITICAL), LeakState.CRITICAL, "Critical"),
    # DetectorState is the leak: a Status.Health that disagrees does not hide it.
    ("critical-health-ok", reading(CRITICAL, health=OK), LeakState.CRITICAL, "Critical"),
    ("critical-degraded", reading(CRITICAL, "Degraded"), LeakState.CRITICAL, "Critical"),
    ("critical-no-status", reading(CRITICAL, None), LeakState.CRITICAL, "Critical"),
    ("warning", reading(WARNING), LeakState.WARNING, "Warning"),
    # Not sensing: whatever DetectorState says, it is no reading.
    ("offline-critical", reading(CRITICAL, "UnavailableOffline"), LeakState.FAULT,
     "Status.State is UnavailableOffline"),
    ("offline-health-critical", reading(OK, "UnavailableOffline", CRITICAL), LeakState.FAULT,
     "not sensing"),
    ("disabled", reading(CRITICAL, "Disabled"), LeakState.FAULT, "Disabled"),
    ("absent", reading(CRITICAL, "Absent"), LeakState.FAULT, "Absent"),
    ("in-test", reading(CRITICAL, "InTest"), LeakState.FAULT, "InTest"),
    ("no-detector-state", reading(None, health=CRITICAL), LeakState.FAULT, "no DetectorState"),
    ("no-detector-state-no-health", reading(None), LeakState.FAULT, "no DetectorState"),
    ("ok-health-critical", reading(OK, health=CRITICAL), LeakState.FAULT,
     "DetectorState OK but Status.Health Critical"),
    ("ok-health-warning", reading(OK, health=WARNING), LeakState.FAULT, "Status.Health Warning"),
    ("unreadable", reading(CRITICAL, problem="DetectorState is the number 42"), LeakState.FAULT,
     "unreadable: DetectorState is the number 42"),
]  # fmt: skip


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("r", "state", "why"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify(r: LeakReading, state: LeakState, why: str) -> None:
    got, reason = classify(r)
    assert got is state
    assert why in reason


@pytest.mark.timeout(10)
def test_only_a_trusted_critical_reading_is_a_leak() -> None:
    """Of every combination of the three fields, the leaks are exactly the
    Critical DetectorStates of a detector that is sensing (or does not say)."""
    states = [None, OK, WARNING, CRITICAL]
    status_states = [None, "Enabled", "Degraded", "Qualified", "UnavailableOffline", "Disabled"]
    for state in states:
        for status_state in status_states:
            for health in states:
                r = LeakReading("/d", "d", state, status_state, health, 1.0)
                leak = classify(r)[0] is LeakState.CRITICAL
                sensing = status_state in (None, "Enabled", "Degraded", "Qualified")
                assert leak == (state is CRITICAL and sensing), r
