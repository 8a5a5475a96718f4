"""A released allocation's report on a simulated fleet, through gRPC and the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from fleet_waits import wait_all_ready

from controller.cli.alloc import report_text
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc


@pytest.mark.timeout(180)
async def test_report_lists_an_injected_xid_and_throttle_time(tmp_path: Path) -> None:
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.5,
            simulation=True,
        )
    )
    address = await server.start()
    fleet = SimFleet(default_fleet(nvl72_racks=0, hgx_nodes=2), watch_interval=0.3)
    await fleet.start(address)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            for spec in fleet.specs:
                await stub.EnrollNode(
                    fleet_pb2.EnrollNodeRequest(
                        name=spec.name,
                        bmc_url=fleet.bmc_url(spec.name),
                        username=SIM_USERNAME,
                        password=SIM_PASSWORD,
                        rack=spec.rack,
                        leaf=spec.leaf,
                        spine=spec.spine,
                    )
                )
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
            report = await stub.GetAllocationReport(
                fleet_pb2.GetAllocationReportRequest(id=alloc.id)
            )
            print(report_text(report))
            from controller.cli.main import main as kiln

            code = await asyncio.to_thread(
                kiln, ["--controller", address, "alloc", "report", alloc.id]
            )
            assert code == 0
            code = await asyncio.to_thread(
                kiln, ["--controller", address, "-o", "json", "alloc", "report", "j"]
            )
            assert code == 0
            code = await asyncio.to_thread(
                kiln, ["--controller", address, "alloc", "report", "nope"]
            )
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
    finally:
        await fleet.stop()
        await server.stop()
