"""What the core keeps in its store: mutable records the repositories round-trip.

The core reads a record from a repository, changes it and saves it inside one
transaction (see ``controller.core.ports``). Records hold domain types only —
states are enums, health is typed — and never a secret: a node's BMC password
stays sealed in the store and comes out only as a ``BmcTarget``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.core.health import HealthReport
from controller.core.kinds import EventKind
from controller.core.model import AllocationSpec, BmcTarget, ProvisionOp
from controller.core.states import AllocationState, NodeKind, NodeState, PowerState

BMC_ANSWERED = "ok"  # the BMC health of a node whose BMC answered its last read


@dataclass(frozen=True, slots=True)
class LeakLook:
    """The leak watcher's reads of a node's BMC that showed no detectors:
    the last one's time (Unix s), how many in a row, and the BMC URL they
    were made through (a node enrolled anew with another BMC is read afresh)."""

    bmc_url: str
    none_at: float
    none_streak: int


@dataclass(slots=True)
class NodeRecord:
    name: str
    bmc_url: str
    rack: str = ""
    leaf: str = ""
    spine: str = ""
    bmc_username: str = ""
    bmc_insecure: bool = False
    bmc_ca_bundle: str = ""
    bmc_health: str = "unknown"
    state: NodeState = NodeState.ENROLLED
    state_reason: str = ""
    drained: bool = False
    power: PowerState = PowerState.UNKNOWN
    expected_power: PowerState | None = None  # what Kiln last asked the BMC for
    gpu_model: str = ""
    gpu_count: int = 0
    nvlink_domain: str = ""
    profile: str = ""  # the node's own baseline profile
    applied_profile: str = ""  # what the agent last applied
    allocation_id: str = ""
    agent_last_seen: float = 0.0
    health: HealthReport | None = None
    # The operation in flight, so a restarted controller resumes it:
    drain_target: NodeState | None = None  # the out-of-service state a drain ends in
    allocation_profile: str | None = None  # being prepared to its allocation's profile
    provision: ProvisionOp | None = None  # the OS image being provisioned
    # Why the node may not be powered on ("": nothing blocks it): a Critical
    # coolant leak on its tray, until an operator clears it (kept across restarts).
    power_block: str = ""
    kind: NodeKind = NodeKind.COMPUTE
    # Why the rack's bring-up keeps this tray from new work ("": nothing holds
    # it): its rack is handed out whole only once every tray is ready.
    rack_hold: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def wanted_profile(self) -> str:
        """The profile the node must be prepared to now: its allocation's when
        the allocation names one, else the node's own baseline."""
        if self.allocation_profile is not None:
            return self.allocation_profile
        return self.profile

    @property
    def mid_operation(self) -> bool:
        return (
            self.drain_target is not None
            or self.allocation_profile is not None
            or self.provision is not None
        )

    def bmc_target(self, password: str) -> BmcTarget:
        """How to reach this node's BMC, with its unsealed ``password`` (the
        store's to give): whether the BMC answered the last reading comes
        from the health stored with the node."""
        return BmcTarget(
            node=self.name,
            url=self.bmc_url,
            username=self.bmc_username,
            password=password,
            insecure=self.bmc_insecure,
            ca_bundle=self.bmc_ca_bundle,
            answered_last=self.bmc_health == BMC_ANSWERED,
        )


@dataclass(slots=True)
class AllocationRecord:
    id: str
    key: str
    spec: AllocationSpec
    state: AllocationState = AllocationState.PENDING
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    spares: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    submitted: int = 0  # queue order
    created_at: float = 0.0
    updated_at: float = 0.0
    created_by: str = ""  # the identity that asked for it ("": before identities)

    @property
    def members(self) -> list[str]:
        return self.nodes + self.spares


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to record with the change it describes (``seq`` comes from the store)."""

    at: float
    kind: EventKind
    node: str = ""
    allocation: str = ""
    rule: str = ""
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)
