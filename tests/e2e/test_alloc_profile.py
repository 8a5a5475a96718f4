"""An allocation that names a profile gets its nodes prepared before hand-off,
and its release resets the GPUs to defaults."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pynvml
import pytest
import yaml
from fleet_waits import wait_all_ready, wait_allocation
from sim_env import enroll_all, sim_env

from controller.core.profiles import ProfileCatalog, parse_profile
from controller.sim.fleet import SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

PROFILE = """
version: v1
name: h200-train
gpu:
  persistence_mode: true
  power_limit_w: 600
  locked_clocks: {sm_mhz: [1500, 1980], mem_mhz: null}
  mig:
    - devices: all
      mig-enabled: false
"""


@pytest.fixture
async def env(
    tmp_path: Path,
) -> AsyncIterator[tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet]]:
    profiles = ProfileCatalog()
    profiles.add(parse_profile(yaml.safe_load(PROFILE), "test"))
    async with sim_env(tmp_path, default_fleet(nvl72_racks=0, hgx_nodes=2), profiles=profiles) as e:
        await enroll_all(e.stub, e.fleet)
        yield e.stub, e.fleet


def power_limit_w(nvml: object, index: int) -> float:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)  # type: ignore[attr-defined]
    return float(nvml.nvmlDeviceGetPowerManagementLimit(handle)) / 1000  # type: ignore[attr-defined]


def persistence(nvml: object, index: int) -> int:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)  # type: ignore[attr-defined]
    return int(nvml.nvmlDeviceGetPersistenceMode(handle))  # type: ignore[attr-defined]


async def test_profile_is_applied_before_hand_off_and_reset_after_release(
    env: tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet],
) -> None:
    stub, fleet = env
    await wait_all_ready(stub)
    nvml = fleet.nodes["h200-n01"].nvml
    assert power_limit_w(nvml, 0) == 700 and persistence(nvml, 0) == pynvml.NVML_FEATURE_DISABLED

    alloc = await stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="train",
            spec=fleet_pb2.AllocationSpec(nodes=2, gpu_model="H200", profile="h200-train"),
        )
    )
    assert alloc.state in (fleet_pb2.ALLOCATION_STATE_PREPARING, fleet_pb2.ALLOCATION_STATE_READY)
    ready = await wait_allocation(stub, alloc.id, fleet_pb2.ALLOCATION_STATE_READY)
    assert sorted(ready.nodes) == ["h200-n01", "h200-n02"]
    for name in ready.nodes:
        gpus = fleet.nodes[name].nvml
        assert all(power_limit_w(gpus, i) == 600 for i in range(8))
        assert all(persistence(gpus, i) == pynvml.NVML_FEATURE_ENABLED for i in range(8))
    events = stub.WatchEvents(fleet_pb2.WatchEventsRequest(allocation=alloc.id))
    kinds = [e.kind async for e in events]
    assert kinds.index("allocation.preparing") < kinds.index("allocation.ready")

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(
                spec=fleet_pb2.AllocationSpec(nodes=1, profile="no-such-profile")
            )
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))
    await wait_all_ready(stub)
    for name in ready.nodes:
        gpus = fleet.nodes[name].nvml
        assert all(power_limit_w(gpus, i) == 700 for i in range(8)), "default power limit"
        assert all(persistence(gpus, i) == pynvml.NVML_FEATURE_DISABLED for i in range(8))
