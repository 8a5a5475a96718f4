"""Topology-aware gang placement: pure functions over a frozen topology.

``Topology`` (built once per inventory generation) + ``Usage`` (the booking
overlay) in, ``Placement``/``NoFit``/``ScheduleResult`` out. No I/O, clock or
configuration reads; see ``docs/placement.md`` for the model and algorithm.
"""

from controller.placement.engine import booking_for, place
from controller.placement.export import (
    export_k8s_labels,
    export_k8s_labels_text,
    export_slurm_topology,
    hostlist,
)
from controller.placement.hold import plan_hold
from controller.placement.model import (
    Booking,
    Level,
    NodeSpec,
    NoFit,
    Placement,
    QueueConfig,
    Request,
)
from controller.placement.replace import replace_failed
from controller.placement.schedule import ScheduleResult, schedule
from controller.placement.topology import Topology
from controller.placement.usage import Usage

__all__ = [
    "Booking",
    "Level",
    "NoFit",
    "NodeSpec",
    "Placement",
    "QueueConfig",
    "Request",
    "ScheduleResult",
    "Topology",
    "Usage",
    "booking_for",
    "export_k8s_labels",
    "export_k8s_labels_text",
    "export_slurm_topology",
    "hostlist",
    "place",
    "plan_hold",
    "replace_failed",
    "schedule",
]
