"""GPU profiles through the controller, on real peers.

A ControllerServer loads the example profiles shipped in ``profiles/``; a
SimFleet serves the nodes' BMCs on the sushy-tools emulator and runs their
agents on the NVML fake. Nodes are enrolled with ``profile=<name>`` over gRPC,
and what the GPUs ended up as is read back from each node's fake through the
pynvml-named calls a real tool would make (not through the agent's helpers).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pynvml

from agent.client import DRIFT_CHECK_EVERY
from controller.core.profiles import ProfileCatalog, parse_profile
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, SimNodeSpec
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
SAMPLE_INTERVAL = 0.5  # seconds between an agent's health samples
READY = types_pb2.NODE_STATE_READY
ALLOCATED = types_pb2.NODE_STATE_ALLOCATED
QUARANTINED = types_pb2.NODE_STATE_QUARANTINED
MIG_ON = pynvml.NVML_DEVICE_MIG_ENABLE
MIG_OFF = pynvml.NVML_DEVICE_MIG_DISABLE

# 3 + 3 + 2 + 1 = 9 compute slices: more than the 7 an H200 has.
OVERFULL = {
    "version": "v1",
    "name": "h200-overfull",
    "gpu": {
        "mig": [
            {
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {"3g.71gb": 2, "2g.35gb": 1, "1g.18gb": 1},
            }
        ]
    },
}


# -- reading a node's GPUs the way nvidia-smi would --------------------------------------


@dataclass(frozen=True)
class GpuSettings:
    persistence: bool
    power_limit_w: int
    default_power_limit_w: int
    clocks_locked: bool
    sm_clock_mhz: int
    mig: tuple[int, int]  # (current, pending)
    instances: dict[int, int]  # GPU-instance profile enum -> instances (MIG on only)


def _instances(nvml: Any, handle: Any) -> dict[int, int]:
    out: Counter[int] = Counter()
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        found = (pynvml.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(handle, info.id, found, ctypes.byref(count))
        if count.value:
            out[profile] = count.value
    return dict(out)


def read_gpus(nvml: Any) -> list[GpuSettings]:
    """Every GPU's settings, read through pynvml-named calls. Blocking."""
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            current, pending = nvml.nvmlDeviceGetMigMode(h)
            gpus.append(
                GpuSettings(
                    persistence=(
                        nvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_ENABLED
                    ),
                    power_limit_w=nvml.nvmlDeviceGetPowerManagementLimit(h) // 1000,
                    default_power_limit_w=nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) // 1000,
                    clocks_locked=bool(
                        reasons & pynvml.nvmlClocksEventReasonApplicationsClocksSetting
                    ),
                    sm_clock_mhz=nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                    mig=(current, pending),
                    instances=_instances(nvml, h) if current == MIG_ON else {},
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def assert_mig_balanced(gpus: list[GpuSettings]) -> None:
    """The GPUs hold profiles/h200-mig-balanced.yaml."""
    assert len(gpus) == 8
    for i, g in enumerate(gpus):
        assert g.mig == (MIG_ON, MIG_ON), f"GPU {i}: {g}"
        assert g.instances == {
            pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 2,  # 1g.18gb
            pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: 1,  # 2g.35gb
            pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: 1,  # 3g.71gb
        }, f"GPU {i}: {g}"
        assert g.clocks_locked and 1500 <= g.sm_clock_mhz <= 1980, f"GPU {i}: {g}"
        assert g.power_limit_w == 600 and g.persistence, f"GPU {i}: {g}"


def assert_at_defaults(gpus: list[GpuSettings], count: int = 8) -> None:
    assert len(gpus) == count
    for i, g in enumerate(gpus):
        assert g.mig == (MIG_OFF, MIG_OFF), f"GPU {i}: MIG not off: {g}"
        assert not g.clocks_locked, f"GPU {i}: clocks still locked"
        assert g.power_limit_w == g.default_power_limit_w == 700, f"GPU {i}: {g}"
        assert not g.persistence, f"GPU {i}: persistence still on"


# -- the harness ----------------------------------------------------------------------------


class Harness:
    def __init__(self, fleet: SimFleet, stub: fleet_pb2_grpc.FleetServiceStub) -> None:
        self.fleet = fleet
        self.stub = stub

    def nvml(self, node: str) -> Any:
        return self.fleet.nodes[node].nvml

    async def gpus(self, node: str) -> list[GpuSettings]:
        return await asyncio.to_thread(read_gpus, self.nvml(node))

    async def enroll(self, node: str, profile: str) -> fleet_pb2.Node:
        spec = self.fleet.nodes[node].spec
        return await self.stub.EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name=node,
                bmc_url=self.fleet.bmc_url(node),
                username=SIM_USERNAME,
                password=SIM_PASSWORD,
                rack=spec.rack,
                leaf=spec.leaf,
                profile=profile,
            )
        )

    async def power(self, name: str, action: int) -> None:
        await self.stub.PowerNode(fleet_pb2.PowerNodeRequest(name=name, action=action))

    async def node(self, name: str) -> fleet_pb2.Node:
        return await self.stub.GetNode(fleet_pb2.GetNodeRequest(name=name))

    async def wait_node(
        self, name: str, done: Callable[[fleet_pb2.Node], bool], timeout: float = 20.0
    ) -> fleet_pb2.Node:
        deadline = time.monotonic() + timeout
        while True:
            node = await self.node(name)
            if done(node):
                return node
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}: {node.state} ({node.state_reason})")
            await asyncio.sleep(0.1)

    async def wait_state(self, name: str, state: int, timeout: float = 20.0) -> fleet_pb2.Node:
        return await self.wait_node(name, lambda n: n.state == state, timeout)

    async def wait_alloc(
        self, ident: str, state: int, timeout: float = 20.0
    ) -> fleet_pb2.Allocation:
        deadline = time.monotonic() + timeout
        while True:
            alloc = await self.stub.GetAllocation(fleet_pb2.GetAllocationRequest(id=ident))
            if alloc.state == state:
                return alloc
            if time.monotonic() > deadline:
                raise AssertionError(f"{ident}: {alloc.state} ({alloc.reason})")
            await asyncio.sleep(0.1)

    async def events(self, node: str, after_seq: int = 0) -> list[types_pb2.Event]:
        request = fleet_pb2.WatchEventsRequest(node=node, after_seq=after_seq, follow=False)
        return [e async for e in self.stub.WatchEvents(request)]


@asynccontextmanager
async def sim_controller(tmp_path: Path, *nodes: str) -> AsyncIterator[Harness]:
    """A controller with the shipped profiles (plus an unfittable one) and H200 ``nodes``."""
    catalog = ProfileCatalog.load(PROFILES_DIR)
    catalog.add(parse_profile(OVERFULL, "test"))
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            profiles=catalog,
            reconcile_interval=0.2,
            sample_interval=SAMPLE_INTERVAL,
        )
    )
    address = await server.start()
    specs = [SimNodeSpec(name=n, kind="h200", rack="r01", leaf="leaf-1") for n in nodes]
    fleet = SimFleet(specs, watch_interval=0.2)
    try:
        await fleet.start(address)
        async with grpc.aio.insecure_channel(address) as channel:
            yield Harness(fleet, fleet_pb2_grpc.FleetServiceStub(channel))
    finally:
        await fleet.stop()
        await server.stop()


# -- the tests --------------------------------------------------------------------------------


def test_shipped_profiles_load_and_are_what_the_docs_say() -> None:
    catalog = ProfileCatalog.load(PROFILES_DIR)
    assert catalog.names() == ["h200-locked-clocks", "h200-mig-balanced"]
    balanced = catalog.get("h200-mig-balanced").gpu
    assert balanced["mig"][0]["mig-devices"] == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    docs = (PROFILES_DIR.parent / "docs" / "gpu-profiles.md").read_text()
    for name in catalog.names():
        assert f"profiles/{name}.yaml" in docs


async def test_nodes_are_prepared_to_their_baseline_profiles_and_back_after_a_job(
    tmp_path: Path,
) -> None:
    async with sim_controller(tmp_path, "h200-mig", "h200-clk") as h:
        await h.enroll("h200-mig", "h200-mig-balanced")
        await h.enroll("h200-clk", "h200-locked-clocks")
        for name, profile in (
            ("h200-mig", "h200-mig-balanced"),
            ("h200-clk", "h200-locked-clocks"),
        ):
            node = await h.wait_node(name, lambda n: n.state == READY and n.schedulable)
            assert node.profile == profile
            assert node.state_reason == f"prepared to {profile}"
            assert node.gpu_count == 8 and node.gpu_model == "H200"
        mig = await h.gpus("h200-mig")
        assert_mig_balanced(mig)
        clk = await h.gpus("h200-clk")
        for i, g in enumerate(clk):
            assert g.mig == (MIG_OFF, MIG_OFF) and not g.instances, f"GPU {i}"
            assert g.clocks_locked and 1755 <= g.sm_clock_mhz <= 1980, f"GPU {i}: {g}"
            assert g.power_limit_w == 650 and g.persistence, f"GPU {i}: {g}"

        # A job holds both nodes; while it does, the GPUs keep their profiles.
        alloc = await h.stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(
                key="job", spec=fleet_pb2.AllocationSpec(nodes=2, gpu_model="H200")
            )
        )
        assert alloc.state == fleet_pb2.ALLOCATION_STATE_READY
        assert sorted(alloc.nodes) == ["h200-clk", "h200-mig"]
        assert (await h.node("h200-mig")).state == ALLOCATED
        assert await h.gpus("h200-mig") == mig

        # Release resets the GPUs to defaults, then prepares the node's baseline
        # again: the second apply has real changes to make, so the reset happened.
        seq = max(e.seq for e in await h.events("h200-mig"))
        await h.stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))
        for name in ("h200-mig", "h200-clk"):
            await h.wait_node(name, lambda n: n.state == READY and n.schedulable)
        moves = [
            (json.loads(e.data_json), e.reason)
            for e in await h.events("h200-mig", after_seq=seq)
            if e.kind == "node.transition"
        ]
        assert [(d["to_state"], reason) for d, reason in moves] == [
            ("releasing", f"released by {alloc.id}"),
            ("preparing", "GPUs reset after release; preparing to baseline h200-mig-balanced"),
            ("ready", "prepared to h200-mig-balanced"),
        ]
        changed = moves[-1][0]["changed"]
        assert "GPU 0: MIG mode enabled" in changed
        assert "GPU 7: clocks locked (SM 1500-1980 MHz)" in changed
        assert_mig_balanced(await h.gpus("h200-mig"))


async def test_a_job_profile_is_applied_for_the_job_and_reset_to_defaults_on_release(
    tmp_path: Path,
) -> None:
    async with sim_controller(tmp_path, "h200-job") as h:
        await h.enroll("h200-job", "")
        node = await h.wait_node("h200-job", lambda n: n.state == READY and n.schedulable)
        assert node.state_reason == "prepared to defaults"
        assert_at_defaults(await h.gpus("h200-job"))

        spec = fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200", profile="h200-mig-balanced")
        alloc = await h.stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="infer", spec=spec)
        )
        alloc = await h.wait_alloc(alloc.id, fleet_pb2.ALLOCATION_STATE_READY)
        assert list(alloc.nodes) == ["h200-job"]
        assert (await h.node("h200-job")).state == ALLOCATED
        assert_mig_balanced(await h.gpus("h200-job"))

        seq = max(e.seq for e in await h.events("h200-job"))
        await h.stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))
        node = await h.wait_state("h200-job", READY)
        assert node.state_reason == "GPUs reset to defaults after release"
        assert node.schedulable
        assert_at_defaults(await h.gpus("h200-job"))

        # The node stays at defaults when its agent comes back (a power cycle):
        # what the GPUs hold and what the controller believes they hold agree,
        # so the controller does not re-apply the job's profile.
        await h.power("h200-job", types_pb2.POWER_ACTION_FORCE_OFF)
        await h.wait_node("h200-job", lambda n: not n.agent_connected)
        await h.power("h200-job", types_pb2.POWER_ACTION_ON)
        await h.wait_node("h200-job", lambda n: n.agent_connected and n.schedulable)
        assert h.fleet.nodes["h200-job"].boots == 2, "the fake node really rebooted"
        later = await h.events("h200-job", after_seq=seq)
        assert [e.reason for e in later if e.kind == "node.agent"][-1] == "agent connected"
        moves = [json.loads(e.data_json)["to_state"] for e in later if e.kind == "node.transition"]
        assert moves == ["releasing", "ready"], moves
        assert_at_defaults(await h.gpus("h200-job"))


async def test_a_layout_that_cannot_fit_quarantines_the_node_with_the_reason(
    tmp_path: Path,
) -> None:
    async with sim_controller(tmp_path, "h200-big") as h:
        await h.enroll("h200-big", "h200-overfull")
        node = await h.wait_state("h200-big", QUARANTINED)
        assert node.state_reason.startswith("cannot reach profile h200-overfull: ")
        for i in range(8):
            assert f"GPU {i}: MIG layout needs 9 compute slices, the GPU has 7" in node.state_reason
        assert not node.schedulable
        gpus = await h.gpus("h200-big")
        assert all(not g.instances for g in gpus), "nothing half-applied"
        # Nothing can be allocated onto it.
        pending = await h.stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="j", spec=fleet_pb2.AllocationSpec(nodes=1))
        )
        assert pending.state == fleet_pb2.ALLOCATION_STATE_PENDING and not pending.nodes


async def test_a_gpu_in_use_quarantines_the_node_with_the_reason(tmp_path: Path) -> None:
    async with sim_controller(tmp_path, "h200-busy") as h:
        # Two processes hold GPU 3 before the node is ever prepared.
        faults = h.nvml("h200-busy").faults
        await asyncio.to_thread(faults.add_process, 3, 4101)
        await asyncio.to_thread(faults.add_process, 3, 4102)
        await h.enroll("h200-busy", "h200-mig-balanced")
        node = await h.wait_state("h200-busy", QUARANTINED)
        assert node.state_reason == (
            "cannot reach profile h200-mig-balanced: GPU 3 in use by 2 processes; MIG mode pending"
        )
        assert not node.schedulable
        gpus = await h.gpus("h200-busy")
        assert gpus[3].mig == (MIG_OFF, MIG_ON), "the request stays pending on the busy GPU"
        assert all(g.mig == (MIG_ON, MIG_ON) for i, g in enumerate(gpus) if i != 3)
        events = await h.events("h200-busy")
        quarantined = [e for e in events if e.kind == "node.transition" and "GPU 3" in e.reason]
        assert quarantined, "the reason is in the event stream too"


async def test_a_process_left_by_a_job_quarantines_the_node_on_release(tmp_path: Path) -> None:
    async with sim_controller(tmp_path, "h200-left") as h:
        await h.enroll("h200-left", "h200-mig-balanced")
        await h.wait_node("h200-left", lambda n: n.state == READY and n.schedulable)
        alloc = await h.stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="leaky", spec=fleet_pb2.AllocationSpec(nodes=1))
        )
        assert list(alloc.nodes) == ["h200-left"]
        await asyncio.to_thread(h.nvml("h200-left").faults.add_process, 3, 5150)
        await h.stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))

        # Not handed to the next job with a stranger's process on GPU 3.
        node = await h.wait_state("h200-left", QUARANTINED)
        assert node.state_reason == (
            "cannot reset GPUs after release: GPU 3 in use by 1 processes; MIG layout not changed"
        )
        assert not node.schedulable
        # The agent gave the profile up with the reset: drift repair (every
        # DRIFT_CHECK_EVERY health samples) must not bring it back.
        await asyncio.sleep((DRIFT_CHECK_EVERY + 1) * SAMPLE_INTERVAL)
        gpus = await h.gpus("h200-left")
        assert_at_defaults([g for i, g in enumerate(gpus) if i != 3], count=7)
        assert gpus[3].instances, "the busy GPU kept its instances"
