"""Domain values ⇄ kiln.v1 messages. Wire types stop here."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.message import Message

from controller.core.model import (
    AllocationInfo,
    AllocationSpec,
    EventInfo,
    GpuInfo,
    NodeInfo,
    PowerResult,
    RackInfo,
)
from kiln.v1 import fleet_pb2, types_pb2

NODE_STATE = {
    s.removeprefix("NODE_STATE_").lower(): v
    for s, v in types_pb2.NodeState.items()
    if v != types_pb2.NODE_STATE_UNSPECIFIED
}
POWER_STATE = {"on": types_pb2.POWER_STATE_ON, "off": types_pb2.POWER_STATE_OFF}
POWER_ACTION = {
    v: s.removeprefix("POWER_ACTION_").lower()
    for s, v in types_pb2.PowerAction.items()
    if v != types_pb2.POWER_ACTION_UNSPECIFIED
}
ALLOCATION_STATE = {
    s.removeprefix("ALLOCATION_STATE_").lower(): v
    for s, v in fleet_pb2.AllocationState.items()
    if v != fleet_pb2.ALLOCATION_STATE_UNSPECIFIED
}
TOPOLOGY = {
    fleet_pb2.TOPOLOGY_LEVEL_UNSPECIFIED: "any",
    fleet_pb2.TOPOLOGY_LEVEL_NVLINK: "nvlink",
    fleet_pb2.TOPOLOGY_LEVEL_LEAF: "leaf",
    fleet_pb2.TOPOLOGY_LEVEL_SPINE: "spine",
    fleet_pb2.TOPOLOGY_LEVEL_ANY: "any",
}
TOPOLOGY_PB = {v: k for k, v in TOPOLOGY.items() if k != fleet_pb2.TOPOLOGY_LEVEL_UNSPECIFIED}


def power_pb(state: str) -> int:
    return POWER_STATE.get(state, types_pb2.POWER_STATE_UNKNOWN)


def gpu_pb(g: GpuInfo) -> types_pb2.Gpu:
    return types_pb2.Gpu(
        index=g.index,
        uuid=g.uuid,
        model=g.model,
        serial=g.serial,
        pci_bus_id=g.pci_bus_id,
        memory_mib=g.memory_mib,
        architecture=g.architecture,
        clique=g.clique,
        pci_device_id=g.pci_device_id,
    )


def gpu_from_pb(g: types_pb2.Gpu) -> GpuInfo:
    return GpuInfo(
        index=g.index,
        uuid=g.uuid,
        model=g.model,
        serial=g.serial,
        pci_bus_id=g.pci_bus_id,
        pci_device_id=g.pci_device_id,
        memory_mib=g.memory_mib,
        architecture=g.architecture,
        clique=g.clique,
    )


def message_to_plain(msg: Message) -> dict[str, Any]:
    """A message as a dict of plain values: absent optional fields are None,
    64-bit integers stay integers (unlike json_format, which makes strings)."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None:
            if field.is_repeated:
                out[field.name] = [message_to_plain(v) for v in value]
            else:
                out[field.name] = message_to_plain(value) if msg.HasField(field.name) else None
        elif field.is_repeated:
            out[field.name] = list(value)
        elif field.has_presence and not msg.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = value
    return out


def health_pb(health: dict[str, Any] | None) -> types_pb2.NodeHealth | None:
    if not health:
        return None
    msg = types_pb2.NodeHealth(
        sampled_at=health.get("sampled_at", 0.0),
        source=health.get("source", ""),
        bmc_temps_c=health.get("bmc_temps_c") or [],
        drift=health.get("drift") or [],
    )
    for g in health.get("gpus") or []:
        msg.gpus.append(types_pb2.GpuHealth(**{k: v for k, v in g.items() if v is not None}))
    return msg


def node_pb(n: NodeInfo) -> fleet_pb2.Node:
    msg = fleet_pb2.Node(
        name=n.name,
        rack=n.rack,
        leaf=n.leaf,
        spine=n.spine,
        bmc_url=n.bmc_url,
        bmc_username=n.bmc_username,
        state=NODE_STATE.get(n.state, 0),
        state_reason=n.state_reason,
        power=power_pb(n.power),
        bmc_health=n.bmc_health,
        agent_connected=n.agent_connected,
        agent_last_seen=n.agent_last_seen,
        gpu_model=n.gpu_model,
        gpu_count=n.gpu_count,
        gpus=[gpu_pb(g) for g in n.gpus],
        nvlink_domain=n.nvlink_domain,
        allocation=n.allocation,
        profile=n.profile,
        updated_at=n.updated_at,
        schedulable=n.schedulable,
    )
    health = health_pb(n.health)
    if health is not None:
        msg.health.CopyFrom(health)
    return msg


def rack_pb(r: RackInfo) -> fleet_pb2.Rack:
    return fleet_pb2.Rack(
        name=r.name,
        nvlink_domain=r.nvlink_domain,
        gpu_model=r.gpu_model,
        nodes=r.nodes,
        gpus=r.gpus,
        ready=r.ready,
        allocated=r.allocated,
        leaf=r.leaf,
        spine=r.spine,
    )


def spec_from_pb(s: fleet_pb2.AllocationSpec) -> AllocationSpec:
    return AllocationSpec(
        nodes=s.nodes,
        racks=s.racks,
        gpu_model=s.gpu_model.strip().upper(),
        topology=TOPOLOGY.get(s.topology, "any"),
        preferred=s.preferred,
        segment=s.segment,
        spares_per_domain=s.spares_per_domain,
        exclusive=s.exclusive,
        queue=s.queue or "default",
        priority=s.priority,
        profile=s.profile,
    )


def spec_pb(s: AllocationSpec) -> fleet_pb2.AllocationSpec:
    return fleet_pb2.AllocationSpec(
        nodes=s.nodes,
        racks=s.racks,
        gpu_model=s.gpu_model,
        topology=TOPOLOGY_PB.get(s.topology, fleet_pb2.TOPOLOGY_LEVEL_ANY),
        preferred=s.preferred,
        segment=s.segment,
        spares_per_domain=s.spares_per_domain,
        exclusive=s.exclusive,
        queue=s.queue,
        priority=s.priority,
        profile=s.profile,
    )


def allocation_pb(a: AllocationInfo) -> fleet_pb2.Allocation:
    return fleet_pb2.Allocation(
        id=a.id,
        key=a.key,
        spec=spec_pb(a.spec),
        state=ALLOCATION_STATE.get(a.state, 0),
        reason=a.reason,
        nodes=list(a.nodes),
        spares=list(a.spares),
        domains=list(a.domains),
        created_at=a.created_at,
        updated_at=a.updated_at,
    )


def event_pb(e: EventInfo) -> types_pb2.Event:
    return types_pb2.Event(
        seq=e.seq,
        at=e.at,
        kind=e.kind,
        node=e.node,
        allocation=e.allocation,
        rule=e.rule,
        reason=e.reason,
        data_json=json.dumps(e.data, sort_keys=True),
    )


def power_progress_pb(r: PowerResult, done: int, total: int) -> fleet_pb2.PowerProgress:
    return fleet_pb2.PowerProgress(
        node=r.node, ok=r.ok, power=power_pb(r.power), error=r.error, done=done, total=total
    )
