"""The domain's own value types: what the core hands to the API layer."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from controller.core.health import HealthReport
from controller.core.states import AllocationState, NodeKind, NodeState, PowerState
from kiln_common.values import value_class


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    serial: str = ""
    pci_bus_id: str = ""
    pci_device_id: int = 0
    memory_mib: int = 0
    architecture: str = ""
    clique: str = ""


@dataclass(frozen=True)
class BmcTarget:
    """Everything needed to reach one node's BMC. The password never prints."""

    node: str
    url: str
    username: str
    password: str = field(repr=False)
    insecure: bool = False
    ca_bundle: str = ""
    # The BMC answered the last reading Kiln stored (the node's BMC health
    # is "ok"): a process that has not called it yet (a restarted
    # controller, a new BMC reader) gives it the trusted lane of its
    # threads at once, so the first pass after a restart is not held to the
    # half of the threads kept for BMCs never heard from.
    answered_last: bool = False


@dataclass(frozen=True)
class EnrollSpec:
    name: str
    bmc_url: str
    username: str
    password: str = field(repr=False)
    rack: str = ""
    leaf: str = ""
    spine: str = ""
    insecure: bool = False
    ca_bundle: str = ""
    profile: str = ""
    kind: NodeKind = NodeKind.COMPUTE


@value_class  # built for every node of every page read: see kiln_common.values
class NodeInfo:
    name: str
    rack: str
    leaf: str
    spine: str
    bmc_url: str
    bmc_username: str
    state: NodeState
    state_reason: str
    power: PowerState
    bmc_health: str
    agent_connected: bool
    agent_last_seen: float
    gpu_model: str
    gpu_count: int
    gpus: tuple[GpuInfo, ...]
    nvlink_domain: str
    allocation: str
    health: HealthReport | None
    profile: str
    updated_at: float
    schedulable: bool
    drained: bool
    agent_cert_expires_at: float = 0.0  # the connected agent's certificate (0: none)
    power_block: str = ""  # why it may not be powered on (a coolant leak); "": nothing
    kind: NodeKind = NodeKind.COMPUTE
    rack_hold: str = ""  # why its rack's bring-up holds it from new work; "": nothing
    # ``health``'s number (``LiveHealth.version``): changes with every report,
    # for what is worked out once per report (0: unknown, work it out again).
    health_version: int = 0


class DetectorHealth(enum.StrEnum):
    """DMTF ``Resource.Health`` as a leak detector reports it (its
    ``DetectorState`` and its ``Status.Health``)."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"


class LeakState(enum.StrEnum):
    """What Kiln makes of one leak detector's reading (``core.leaks.classify``)."""

    OK = "ok"
    WARNING = "warning"  # a leak warning: recorded, no power action
    CRITICAL = "critical"  # a leak: the tray is powered off and blocked from power-on
    FAULT = "fault"  # the detector cannot be trusted: flagged for repair, no power action


@dataclass(frozen=True)
class LeakReading:
    """One leak detector as the node's BMC reported it (DMTF ``LeakDetector``).

    ``detector`` is its resource path on the BMC (unique there), ``name`` its
    ``Name``. ``detector_state`` is ``DetectorState`` and ``status_health``
    ``Status.Health`` (None: absent or null); ``status_state`` is
    ``Status.State`` as the DMTF spells it ("Enabled", "UnavailableOffline",
    ...; None: absent). ``problem`` says what was wrong with the detector's
    document ("" when nothing). ``read_at``: when it was read (Unix seconds).
    """

    detector: str
    name: str
    detector_state: DetectorHealth | None
    status_state: str | None
    status_health: DetectorHealth | None
    read_at: float
    problem: str = ""
    detector_type: str = ""  # LeakDetectorType: Moisture, FloatSwitch
    physical_context: str = ""


@dataclass(frozen=True)
class RackInfo:
    name: str
    nvlink_domain: str
    gpu_model: str
    nodes: int
    gpus: int
    ready: int
    allocated: int
    leaf: str
    spine: str
    members: int = 0  # switch trays and power shelves (not in ``nodes``)
    hold: str = ""  # why its bring-up holds the rack from new work ("": none)


@dataclass(frozen=True)
class AllocationSpec:
    nodes: int = 0
    racks: int = 0
    gpu_model: str = ""
    topology: str = "any"  # nvlink | leaf | spine | any
    preferred: bool = False
    segment: int = 0
    spares_per_domain: int = 0
    exclusive: bool = False
    queue: str = "default"
    priority: int = 0
    profile: str = ""

    def to_dict(self) -> dict[str, Any]:
        # Flat: every field is a plain value (``asdict``'s deep copy is most
        # of the cost of a save, which compares the stored spec).
        return {name: getattr(self, name) for name in _SPEC_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AllocationSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(AllocationSpec))


@dataclass(frozen=True)
class AllocationInfo:
    id: str
    key: str
    spec: AllocationSpec
    state: AllocationState
    reason: str
    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    domains: tuple[str, ...]
    created_at: float
    updated_at: float
    created_by: str = ""


@dataclass(frozen=True)
class EventInfo:
    seq: int
    at: float
    kind: str
    node: str
    allocation: str
    rule: str
    reason: str
    data: dict[str, Any]


@dataclass(frozen=True)
class PowerScope:
    """The nodes a bulk power action covers: the named ones, one rack, or all."""

    names: tuple[str, ...] = ()
    rack: str = ""
    all_nodes: bool = False


@dataclass(frozen=True)
class PowerResult:
    node: str
    ok: bool
    power: PowerState
    error: str = ""
    bmc_health: str = ""


@dataclass(frozen=True)
class AgentCommand:
    """A command for a node's agent: apply_profile, reset_gpus, inject_fault,
    run_check (payload: the check as JSON) or reset_gpu (payload: a JSON list
    of GPU indices)."""

    kind: str
    payload: str = ""


@dataclass(frozen=True)
class ReportInterval:
    """Not a command (no answer is awaited): the agent is asked to report
    every ``seconds`` from now on (``core/report_pace.py``)."""

    seconds: float


@dataclass(frozen=True)
class CommandOutcome:
    ok: bool
    changed: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()
    message: str = ""
    figures_json: str = ""  # run_check: what the check measured
    duration_s: float = 0.0  # run_check: how long it ran on the node


def short_gpu_model(nvml_name: str) -> str:
    """ "NVIDIA H100 80GB HBM3" → "H100"; "NVIDIA GB200" → "GB200"."""
    words = nvml_name.replace("NVIDIA", "").split()
    return words[0].upper() if words else ""


class ProvisionPhase(enum.StrEnum):
    """Where a node's provisioning is; persisted with the node (``ProvisionOp``)."""

    QUEUED = "queued"  # in provisioning, waiting for a fleet or rack slot
    MEDIA = "media"  # slot taken: inserting media, setting the boot, power-cycling
    BOOTING = "booting"  # power-cycled at ``cycled_at``: waiting for the agent


@dataclass(frozen=True)
class ProvisionOp:
    """The image a node is being provisioned with, kept on the node record so
    that a restarted controller resumes it (``controller.core.provisioning``).

    ``url`` is what the BMC fetches (resolved against the image server when
    the operation began); ``sha256`` the pinned digest it was verified
    against. Times are Unix seconds (wall clock: they outlive the process);
    ``agent_back_at`` is 0 until the node's agent registered after the cycle.
    """

    image: str
    url: str
    sha256: str
    phase: ProvisionPhase = ProvisionPhase.QUEUED
    started_at: float = 0.0
    cycled_at: float = 0.0
    agent_back_at: float = 0.0
    by: str = ""  # who asked

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["phase"] = self.phase.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProvisionOp:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["phase"] = ProvisionPhase(values.get("phase", ProvisionPhase.QUEUED.value))
        return cls(**values)


@dataclass(frozen=True)
class ProvisionScope:
    """The nodes a provisioning request covers: the named ones or one rack."""

    names: tuple[str, ...] = ()
    rack: str = ""


@dataclass(frozen=True)
class ProvisionProgress:
    """One node reached ``phase`` (see ``controller.core.provisioning.PHASES``)."""

    node: str
    phase: str
    ok: bool = True
    error: str = ""
    image: str = ""
    image_url: str = ""
    done: int = 0
    total: int = 0
    elapsed_s: float = 0.0
