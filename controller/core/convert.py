"""Rows to domain values (the store's shapes never leave the core)."""

from __future__ import annotations

import json

from controller.core.model import AllocationInfo, AllocationSpec, GpuInfo, NodeInfo
from controller.store.models import AllocationRow, GpuRow, NodeRow


def gpu_info(row: GpuRow) -> GpuInfo:
    return GpuInfo(
        index=row.index,
        uuid=row.uuid,
        model=row.model,
        serial=row.serial,
        pci_bus_id=row.pci_bus_id,
        pci_device_id=row.pci_device_id,
        memory_mib=row.memory_mib,
        architecture=row.architecture,
        clique=row.clique,
    )


def node_info(
    row: NodeRow, gpus: list[GpuRow], *, agent_connected: bool, schedulable: bool
) -> NodeInfo:
    return NodeInfo(
        name=row.name,
        rack=row.rack,
        leaf=row.leaf,
        spine=row.spine,
        bmc_url=row.bmc_url,
        bmc_username=row.bmc_username,
        state=row.state,
        state_reason=row.state_reason,
        power=row.power,
        bmc_health=row.bmc_health,
        agent_connected=agent_connected,
        agent_last_seen=row.agent_last_seen,
        gpu_model=row.gpu_model,
        gpu_count=row.gpu_count,
        gpus=tuple(gpu_info(g) for g in sorted(gpus, key=lambda g: g.index)),
        nvlink_domain=row.nvlink_domain,
        allocation=row.allocation_id,
        health=json.loads(row.health_json) if row.health_json else None,
        profile=row.profile,
        updated_at=row.updated_at,
        schedulable=schedulable,
        drained=row.drained,
    )


def allocation_info(row: AllocationRow) -> AllocationInfo:
    return AllocationInfo(
        id=row.id,
        key=row.key,
        spec=AllocationSpec.from_dict(json.loads(row.spec_json)),
        state=row.state,
        reason=row.reason,
        nodes=tuple(json.loads(row.nodes_json)),
        spares=tuple(json.loads(row.spares_json)),
        domains=tuple(json.loads(row.domains_json)),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )
