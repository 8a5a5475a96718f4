"""The frames between the controller and its BMC readers, and their values.

Controller to reader:

* ``(POWER, call, targets, concurrency, spread)``: read every target's power
  (``PoolGateway.poll_power``); answered with ``{node: (power, health)}``;
* ``(LEAKS, call, target)``: one node's leak detectors, as reading tuples;
* ``(THERMAL, call, target)``: one node's GPU temperatures;
* ``(FORGET, node)``: drop the node's handle (its BMC or credentials changed).

Reader to controller:

* ``(READY,)`` once it serves;
* ``(DONE, call, value)``;
* ``(ERROR, call, kind, message)``: the call raised the Kiln error ``kind``
  (its class name) with ``message``, rebuilt as that class in the controller.

A target is ``(node, url, username, password, insecure, ca_bundle)``: the
password crosses the private socket pair, never a log or an error.
"""

from __future__ import annotations

from typing import Any

from controller.bmc import errors as bmc_errors
from controller.core import errors as core_errors
from controller.core.errors import KilnError, Unavailable
from controller.core.model import BmcTarget, DetectorHealth, LeakReading

READY = 0
DONE = 1
ERROR = 2
POWER = 3
LEAKS = 4
THERMAL = 5
FORGET = 6

TargetTuple = tuple[str, str, str, str, bool, str, bool]
LeakTuple = tuple[str, str, str | None, str | None, str | None, float, str, str, str]


def target_tuple(t: BmcTarget) -> TargetTuple:
    return (t.node, t.url, t.username, t.password, t.insecure, t.ca_bundle, t.answered_last)


def target_from(values: Any) -> BmcTarget:
    node, url, username, password, insecure, ca_bundle, answered_last = values
    return BmcTarget(node, url, username, password, bool(insecure), ca_bundle, bool(answered_last))


def leak_tuple(r: LeakReading) -> LeakTuple:
    return (
        r.detector,
        r.name,
        r.detector_state.value if r.detector_state else None,
        r.status_state,
        r.status_health.value if r.status_health else None,
        r.read_at,
        r.problem,
        r.detector_type,
        r.physical_context,
    )


def leak_from(values: Any) -> LeakReading:
    detector, name, state, status_state, status_health, read_at, problem, kind, where = values
    return LeakReading(
        detector=detector,
        name=name,
        detector_state=DetectorHealth(state) if state else None,
        status_state=status_state,
        status_health=DetectorHealth(status_health) if status_health else None,
        read_at=read_at,
        problem=problem,
        detector_type=kind,
        physical_context=where,
    )


def _error_classes() -> dict[str, type[KilnError]]:
    found: dict[str, type[KilnError]] = {}
    for module in (core_errors, bmc_errors):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, KilnError):
                found[value.__name__] = value
    return found


ERROR_CLASSES = _error_classes()


def error_frame(call: int, e: BaseException) -> tuple[int, int, str, str]:
    """The ERROR frame for ``e``: a Kiln error by its class; anything else
    as Unavailable, naming its type (its text may carry anything)."""
    if isinstance(e, KilnError) and type(e).__name__ in ERROR_CLASSES:
        return (ERROR, call, type(e).__name__, str(e))
    return (ERROR, call, "Unavailable", f"the BMC reader failed: {type(e).__name__}")


def error_from(kind: str, message: str) -> KilnError:
    """The Kiln error an ERROR frame names, with its message as sent."""
    cls = ERROR_CLASSES.get(kind, Unavailable)
    error = cls.__new__(cls)
    KilnError.__init__(error, message)  # the message is final: no template to fill
    return error
