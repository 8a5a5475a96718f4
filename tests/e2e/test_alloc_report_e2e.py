"""A released allocation's report on a simulated fleet, through gRPC and the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from fleet_waits import wait_all_ready
from sim_env import enroll_request, sim_env

from controller.cli.alloc import report_text
from controller.sim.fleet import default_fleet
from kiln.v1 import fleet_pb2


@pytest.mark.timeout(180)
async def test_report_lists_an_injected_xid_and_throttle_time(tmp_path: Path) -> None:
    specs = default_fleet(nvl72_racks=0, hgx_nodes=2)
    async with sim_env(tmp_path, specs, simulation=True) as env:
        stub, fleet, address = env.stub, env.fleet, env.address
        for spec in fleet.specs:
            await stub.EnrollNode(enroll_request(fleet, spec, leaf=spec.leaf, spine=spec.spine))
        await wait_all_ready(stub, 90)
        alloc = await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="j", spec=fleet_pb2.AllocationSpec(nodes=1))
        )
        assert alloc.state == fleet_pb2.ALLOCATION_STATE_READY
        node = alloc.nodes[0]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetAllocationReport(fleet_pb2.GetAllocationReportRequest(id=alloc.id))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        print("held:", err.value.details())
        await asyncio.sleep(1.5)
        for fault in (
            {"kind": "xid", "gpu": 1, "code": 13},
            {"kind": "power_draw", "gpu": 2, "watts": 5000},
        ):
            await stub.InjectFault(
                fleet_pb2.InjectFaultRequest(node=node, fault_json=json.dumps(fault))
            )
        await asyncio.sleep(3.0)
        await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))
        report = await stub.GetAllocationReport(fleet_pb2.GetAllocationReportRequest(id=alloc.id))
        print(report_text(report))
        from controller.cli.main import main as kiln

        code = await asyncio.to_thread(kiln, ["--controller", address, "alloc", "report", alloc.id])
        assert code == 0
        code = await asyncio.to_thread(
            kiln, ["--controller", address, "-o", "json", "alloc", "report", "j"]
        )
        assert code == 0
        code = await asyncio.to_thread(kiln, ["--controller", address, "alloc", "report", "nope"])
        assert code != 0
        gpus = {(g.node, g.index): g for g in report.gpus}
        assert list(gpus[(node, 1)].xids) == [13]
        assert gpus[(node, 2)].throttled_s["sw_power_cap"] > 0
        assert all(g.energy_j > 0 and g.HasField("max_temp_c") for g in report.gpus)
        assert not report.partial and report.reports >= 4
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetAllocationReport(fleet_pb2.GetAllocationReportRequest(id="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        print("unknown:", err.value.details())
