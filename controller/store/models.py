"""Persistent state: the tables Kiln keeps in SQLite or PostgreSQL.

Rows are plain storage shapes; ``controller.store.repositories`` converts
them to the core's records and back, in one place. JSON columns hold lists and
small documents that are always read and written whole.
"""

from __future__ import annotations

from sqlalchemy import Index
from sqlmodel import Field, SQLModel


class NodeRow(SQLModel, table=True):
    __tablename__ = "nodes"

    name: str = Field(primary_key=True)
    rack: str = Field(default="", index=True)
    leaf: str = ""
    spine: str = ""
    bmc_url: str = Field(index=True)  # one node per BMC: checked at enrolment
    bmc_username: str = ""
    # Stored so the controller can drive the BMC; never logged or returned.
    bmc_password: str = ""
    bmc_insecure: bool = False
    bmc_ca_bundle: str = ""
    bmc_health: str = "unknown"
    state: str = Field(default="enrolled", index=True)
    state_reason: str = ""
    drained: bool = False
    power: str = "unknown"
    expected_power: str = ""
    gpu_model: str = ""
    gpu_count: int = 0
    nvlink_domain: str = ""
    profile: str = ""
    applied_profile: str = ""
    allocation_id: str = Field(default="", index=True)
    agent_last_seen: float = 0.0
    health_json: str = ""
    # The unfinished operation, for resume after a restart ("": none):
    drain_target: str = ""  # the out-of-service state a drain ends in
    allocation_profile: str = ""  # preparing to its allocation's profile
    power_block: str = ""  # why it may not be powered on (a coolant leak); "": nothing
    provision_json: str = ""  # the OS image being provisioned (ProvisionOp), "": none
    kind: str = "compute"  # compute, switch_tray or power_shelf (NodeKind)
    rack_hold: str = ""  # why its rack's bring-up holds it from new work; "": nothing
    created_at: float = 0.0
    updated_at: float = 0.0


class GpuRow(SQLModel, table=True):
    __tablename__ = "gpus"

    node: str = Field(primary_key=True, foreign_key="nodes.name")
    index: int = Field(primary_key=True)
    uuid: str = ""
    model: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    pci_device_id: int = 0
    memory_mib: int = 0
    architecture: str = ""
    clique: str = ""


class AllocationRow(SQLModel, table=True):
    __tablename__ = "allocations"
    # Queue order: the next position (max) and ListAllocations pages.
    __table_args__ = (Index("ix_allocations_submitted_id", "submitted", "id"),)

    id: str = Field(primary_key=True)
    key: str = Field(unique=True, index=True)
    spec_json: str
    state: str = Field(default="pending", index=True)
    reason: str = ""
    nodes_json: str = "[]"
    spares_json: str = "[]"
    domains_json: str = "[]"
    queue: str = "default"
    priority: int = 0
    submitted: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    created_by: str = ""  # the caller's identity (a provisioner releases only its own)


class EventRow(SQLModel, table=True):
    __tablename__ = "events"

    seq: int | None = Field(default=None, primary_key=True)
    at: float
    kind: str = Field(index=True)
    node: str = Field(default="", index=True)
    allocation: str = Field(default="", index=True)
    rule: str = ""
    reason: str = ""
    data_json: str = "{}"
    published: bool = Field(default=False, index=True)


class TokenRow(SQLModel, table=True):
    """A bearer token: its public id, never its secret, only a salted hash of it."""

    __tablename__ = "tokens"

    id: str = Field(primary_key=True)  # the kiln.<id>.… prefix a token is looked up by
    name: str = Field(unique=True, index=True)
    role: str
    secret_hash: str  # scrypt$N$r$p$salt$hash
    node: str = Field(default="", index=True)  # agent tokens: the node it may register
    created_at: float = 0.0
    expires_at: float = 0.0
    created_by: str = ""
    last_used_at: float = 0.0
    revoked_at: float = 0.0


class LeakLookRow(SQLModel, table=True):
    """A node whose BMC showed no leak detectors at the leak watcher's last
    reads: when (Unix s), how many reads in a row, and through which BMC URL.
    Kept so that a restarted controller asks again when the one before would
    have, not every BMC at once (``core/leaks.py``)."""

    __tablename__ = "leak_looks"

    node: str = Field(primary_key=True, foreign_key="nodes.name")
    bmc_url: str = ""
    none_at: float = 0.0
    none_streak: int = 0
