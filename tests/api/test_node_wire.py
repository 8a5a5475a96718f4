"""``convert.NodeWire``: a node's ``Node`` message kept in wire form, the same
message ``convert.node_pb`` builds, built again whenever the node changed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controller.api import convert
from controller.core.health import GpuHealth, HealthReport
from controller.core.model import GpuInfo, NodeInfo
from controller.core.states import NodeKind, NodeState, PowerState
from kiln.v1 import fleet_pb2

pytestmark = pytest.mark.timeout(30)


def report(at: float, temp: float = 41.0) -> HealthReport:
    return HealthReport(
        sampled_at=at,
        gpus=tuple(
            GpuHealth(index=i, uuid=f"GPU-{i}", temp_c=temp + i, xids=(79,)) for i in range(8)
        ),
        bmc_temps_c=(30.5,),
    )


def node(name: str = "n1", **changes: Any) -> NodeInfo:
    info = NodeInfo(
        name=name,
        rack="r1",
        leaf="leaf1",
        spine="spine1",
        bmc_url="redfish+http://127.0.0.1:1/redfish/v1/Systems/1",
        bmc_username="admin",
        state=NodeState.READY,
        state_reason="",
        power=PowerState.ON,
        bmc_health="ok",
        agent_connected=True,
        agent_last_seen=100.0,
        gpu_model="NVIDIA H200",
        gpu_count=8,
        gpus=tuple(
            GpuInfo(index=i, uuid=f"GPU-{i}", model="NVIDIA H200", clique="c1") for i in range(8)
        ),
        nvlink_domain="d1",
        allocation="",
        health=report(99.0),
        health_version=3,
        profile="train",
        updated_at=50.0,
        schedulable=True,
        drained=False,
    )
    return dataclasses.replace(info, **changes)


class CountingBuilds:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = convert._bare_node_pb

        def counted(n: NodeInfo) -> fleet_pb2.Node:
            self.count += 1
            return real(n)

        monkeypatch.setattr(convert, "_bare_node_pb", counted)


@pytest.mark.parametrize(
    "info",
    [node(), node(health=None, health_version=0), node(gpus=(), gpu_count=0, agent_last_seen=0.0)],
)
def test_the_kept_message_is_the_one_built_field_by_field(info: NodeInfo) -> None:
    wire = convert.NodeWire()
    expected = convert.node_pb(info)
    assert wire.node_pb(info) == expected
    assert wire.node_pb(info) == expected  # and again, from what was kept


def test_a_node_that_did_not_change_is_not_built_again(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = CountingBuilds(monkeypatch)
    wire = convert.NodeWire()
    wire.node_pb(node())
    # A new NodeInfo each read (as the core gives), equal but for the fields
    # every report changes: the node's message is kept, those set afresh.
    later = node(agent_last_seen=101.0, health=report(100.5, temp=60.0), health_version=4)
    msg = wire.node_pb(later)
    assert builds.count == 1
    assert msg == convert.node_pb(later)
    assert msg.agent_last_seen == 101.0 and msg.health.gpus[0].temp_c == 60.0


CHANGES = {
    "rack": "r2",
    "leaf": "leaf2",
    "spine": "spine2",
    "bmc_url": "redfish+http://127.0.0.1:2/redfish/v1/Systems/1",
    "bmc_username": "operator",
    "state": NodeState.ALLOCATED,
    "state_reason": "booked",
    "power": PowerState.OFF,
    "bmc_health": "unreachable",
    "agent_connected": False,
    "gpu_model": "NVIDIA GB200",
    "gpu_count": 4,
    "gpus": (GpuInfo(index=0, uuid="GPU-x", model="NVIDIA GB200", clique="c2"),),
    "nvlink_domain": "d2",
    "allocation": "a1",
    "profile": "infer",
    "updated_at": 51.0,
    "schedulable": False,
    "drained": True,
    "agent_cert_expires_at": 2e9,
    "power_block": "coolant leak in r1",
    "kind": NodeKind.SWITCH_TRAY,
    "rack_hold": "rack bring-up",
}


def test_every_field_is_either_kept_by_or_set_afresh() -> None:
    fields = {f.name for f in dataclasses.fields(NodeInfo)}
    assert fields - {"name"} == set(CHANGES) | convert.NODE_EVERY_REPORT


@pytest.mark.parametrize(("field", "value"), sorted(CHANGES.items()))
def test_a_node_changed_in_any_field_is_built_again(field: str, value: Any) -> None:
    wire = convert.NodeWire()
    wire.node_pb(node())
    changed = node(**{field: value})
    assert wire.node_pb(changed) == convert.node_pb(changed)
    if field in fleet_pb2.Node.DESCRIPTOR.fields_by_name:  # ``drained`` is not sent
        assert wire.node_pb(changed) != convert.node_pb(node())


def test_a_page_holds_each_node_as_built_and_the_token() -> None:
    wire = convert.NodeWire()
    infos = [node(f"n{i}", health=report(float(i)) if i % 2 else None) for i in range(5)]
    page = wire.page_pb(infos, "next")
    assert page == fleet_pb2.ListNodesResponse(
        nodes=[convert.node_pb(n) for n in infos], next_page_token="next"
    )
    assert wire.page_pb(infos[:2], "") == fleet_pb2.ListNodesResponse(
        nodes=[convert.node_pb(n) for n in infos[:2]]
    )


def test_a_forgotten_node_is_built_again(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = convert.node_pb(node())
    builds = CountingBuilds(monkeypatch)
    wire = convert.NodeWire()
    wire.node_pb(node())
    wire.forget("n1")
    assert wire.node_pb(node()) == expected
    assert builds.count == 2
