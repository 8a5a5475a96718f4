"""The kinds of event Kiln records (docs/events.md has each one's data)."""

from __future__ import annotations

from enum import StrEnum


class EventKind(StrEnum):
    """Kinds Kiln emits today. An event's kind travels as a plain string so
    that new kinds never break old consumers; they ignore kinds they don't know."""

    NODE_ENROLLED = "node.enrolled"
    NODE_CREDENTIALS = "node.credentials"
    NODE_REMOVED = "node.removed"
    NODE_TRANSITION = "node.transition"
    NODE_POWER = "node.power"
    NODE_AGENT = "node.agent"
    NODE_DRIFT = "node.drift"
    NODE_GPU_DRIFT = "node.gpu_drift"
    ALLOCATION_CREATED = "allocation.created"
    ALLOCATION_WAITING = "allocation.waiting"
    ALLOCATION_PREPARING = "allocation.preparing"
    ALLOCATION_READY = "allocation.ready"
    ALLOCATION_FAILED = "allocation.failed"
    ALLOCATION_NOTICE = "allocation.notice"
    ALLOCATION_NODE_REPLACED = "allocation.node_replaced"
    ALLOCATION_DEGRADED = "allocation.degraded"
    ALLOCATION_RELEASED = "allocation.released"
    ALLOCATION_HEALTH_REPORT = "allocation.health_report"
    NODE_CHECK = "node.check"  # a run of the health-check suite ended
    NODE_LEAK = "node.leak"  # a leak detector's state changed
    NODE_LEAK_CLEARED = "node.leak_cleared"
    RACK_ISOLATION_REQUESTED = "rack.isolation_requested"
    POLICY_ACTION = "policy.action"
    AUDIT_CALL = "audit.call"
