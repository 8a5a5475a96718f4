"""The node state machine (DESIGN.md, "Node lifecycle").

    enrolled → inspecting → preparing → ready ⇄ allocated → releasing → ready
    inspecting | preparing | ready → testing → preparing | ready | quarantined
    any state → draining → (quarantined | powered_off | maintenance)
    enrolled | inspecting | ready | out of service → provisioning → inspecting
                                        (docs/provisioning.md)

A transition is legal when it is listed here; moving to the state a node is
already in is always allowed (idempotent) and records nothing new.
"""

from __future__ import annotations

import enum

from controller.core.errors import FailedPrecondition


class NodeState(enum.StrEnum):
    ENROLLED = "enrolled"
    INSPECTING = "inspecting"
    PREPARING = "preparing"
    READY = "ready"
    ALLOCATED = "allocated"
    RELEASING = "releasing"
    DRAINING = "draining"
    QUARANTINED = "quarantined"
    POWERED_OFF = "powered_off"
    MAINTENANCE = "maintenance"
    TESTING = "testing"  # running a level of the health-check suite
    PROVISIONING = "provisioning"  # booting an OS image from the catalogue


class NodeKind(enum.StrEnum):
    """What a rack member is (docs/bring-up.md). Only compute nodes run an
    agent and take jobs; switch trays and power shelves are powered in
    bring-up order and never allocated."""

    COMPUTE = "compute"
    SWITCH_TRAY = "switch_tray"  # an NVLink switch tray
    POWER_SHELF = "power_shelf"


# Members Kiln powers but never inspects, prepares or allocates.
MEMBERS = frozenset({NodeKind.SWITCH_TRAY, NodeKind.POWER_SHELF})


class PowerState(enum.StrEnum):
    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"


class AllocationState(enum.StrEnum):
    PENDING = "pending"
    PREPARING = "preparing"  # booked; nodes being prepared to the allocation's profile
    READY = "ready"  # handed over
    RELEASED = "released"
    FAILED = "failed"  # refused by the scheduler; holds nothing


# Allocations that hold nodes.
HOLDING = frozenset({AllocationState.PREPARING, AllocationState.READY})
# Allocations the scheduler still looks at.
OPEN = frozenset({AllocationState.PENDING, *HOLDING})

S = NodeState

# States a controller may find a node in after a crash, and where it resumes.
TRANSITIONAL = frozenset(
    {S.INSPECTING, S.PREPARING, S.RELEASING, S.DRAINING, S.TESTING, S.PROVISIONING}
)

OUT_OF_SERVICE = frozenset({S.QUARANTINED, S.POWERED_OFF, S.MAINTENANCE})

ALLOWED: dict[NodeState, frozenset[NodeState]] = {
    # A rack member (switch tray, power shelf) has no agent: once powered it
    # is ready, and never schedulable (docs/bring-up.md).
    S.ENROLLED: frozenset({S.INSPECTING, S.PROVISIONING, S.READY}),
    # Inspecting a node with no OS yet: provisioning may start there too.
    S.INSPECTING: frozenset({S.PREPARING, S.ENROLLED, S.TESTING, S.PROVISIONING}),
    S.PREPARING: frozenset({S.READY, S.ALLOCATED, S.INSPECTING, S.TESTING}),
    S.READY: frozenset({S.ALLOCATED, S.PREPARING, S.INSPECTING, S.TESTING, S.PROVISIONING}),
    S.TESTING: frozenset({S.PREPARING, S.READY, S.INSPECTING, S.QUARANTINED}),
    S.ALLOCATED: frozenset({S.RELEASING, S.PREPARING, S.READY}),
    S.RELEASING: frozenset({S.READY, S.PREPARING}),
    S.DRAINING: frozenset({S.QUARANTINED, S.POWERED_OFF, S.MAINTENANCE}),
    S.QUARANTINED: frozenset({S.INSPECTING, S.MAINTENANCE, S.PROVISIONING}),
    S.POWERED_OFF: frozenset({S.INSPECTING, S.MAINTENANCE, S.PROVISIONING}),
    S.MAINTENANCE: frozenset({S.INSPECTING, S.PROVISIONING}),
    # The agent of the new OS registered: inspected as any node. A node whose
    # agent never came back leaves through draining (quarantined).
    S.PROVISIONING: frozenset({S.INSPECTING}),
}

# Where provisioning may start (an allocated node is refused with its allocation).
PROVISIONABLE = frozenset(
    {S.ENROLLED, S.INSPECTING, S.READY, S.QUARANTINED, S.POWERED_OFF, S.MAINTENANCE}
)


def check_transition(node: str, current: NodeState, target: NodeState) -> bool:
    """Return True when the node must move, False when it is already there.

    Every state may go to draining and every out-of-service state may go to
    another out-of-service state directly (an operator's or a policy's call).

    Raises:
        FailedPrecondition: the state machine has no such transition.
    """
    if current == target:
        return False
    if target == S.DRAINING or (target in OUT_OF_SERVICE and current in OUT_OF_SERVICE):
        return True
    if target in ALLOWED.get(current, frozenset()):
        return True
    raise FailedPrecondition(f"node {node!r} cannot go from {current.value} to {target.value}")
