"""Active health checks on a simulated fleet (real controller, sushy-tools
BMCs, agents on the NVML fake): intake burn-in gates readiness and a faulted
GPU is quarantined by its check in the check's words; periodic checks never
touch an allocated node and keep to the per-rack cap; an NVL72 rack runs its
NVLink check on every tray together, and a tray with downed links fails it;
a profile's checks run before hand-off; the history reads back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from fleet_waits import enroll_sim_fleet, wait_all_ready, wait_allocation, wait_node_state

from controller.checks import Suite, load_suite
from controller.core.profiles import ProfileCatalog, parse_profile
from controller.policies import load_rules
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SimFleet, SimNodeSpec, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

pytestmark = pytest.mark.timeout(120)

SUITE = """
version: v1
name: test-suite
revision: "7"
gates: {intake: medium, repair: quick}
periodic: {level: "%(periodic)s", every: 1s, per_rack: 1, fleet: 8}
levels:
  quick:
    - {name: dcgm-r1, kind: dcgm_diag, run: 1, simulated: 0.3s, timeout: 30s}
  medium:
    - {name: dcgm-r2, kind: dcgm_diag, run: 2, simulated: 0.05s, timeout: 30s}
    - name: nvlink-bandwidth
      kind: nvbandwidth
      min_gbps: {H200: 380, GB200: 760}
      scope: rack
      simulated: 0.2s
      timeout: 30s
  long:
    - {name: dcgm-r3, kind: dcgm_diag, run: 3, simulated: 60s, timeout: 120s}
"""

# Only a heat rule: the default rules would act on the injected faults too
# (drain for a pending remap, reset the GPU), and these tests are about checks.
RULES = """
version: v1
rules:
  - name: shutdown-heat
    when: {metric: gpu_temp_margin_to_shutdown_c, op: "<=", value: 0}
    for_samples: 2
    actions: [notify_job, {power_off: now}]
"""

PROFILE = """
version: v1
name: checked
checks: quick
gpu:
  persistence_mode: true
"""


@dataclass
class Env:
    stub: fleet_pb2_grpc.FleetServiceStub
    sim: SimFleet


def suite(periodic: str = "") -> Suite:
    return load_suite(SUITE % {"periodic": periodic})


@pytest.fixture
def specs() -> list[SimNodeSpec]:
    return default_fleet(nvl72_racks=0, hgx_nodes=2)


@pytest.fixture
def periodic() -> str:
    return ""


@pytest.fixture
async def env(tmp_path: Path, specs: list[SimNodeSpec], periodic: str) -> AsyncIterator[Env]:
    profiles = ProfileCatalog()
    profiles.add(parse_profile(yaml.safe_load(PROFILE), "test"))
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.5,
            profiles=profiles,
            checks=suite(periodic),
            rules=load_rules(RULES),
        )
    )
    address = await server.start()
    sim = SimFleet(specs, watch_interval=0.3)
    await sim.start(address)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield Env(fleet_pb2_grpc.FleetServiceStub(channel), sim)
    finally:
        await sim.stop()
        await server.stop()


async def runs(stub: fleet_pb2_grpc.FleetServiceStub, node: str) -> list[fleet_pb2.CheckRun]:
    return list((await stub.ListChecks(fleet_pb2.ListChecksRequest(node=node))).runs)


async def transitions(stub: fleet_pb2_grpc.FleetServiceStub) -> list[tuple[str, dict[str, str]]]:
    events = stub.WatchEvents(fleet_pb2.WatchEventsRequest())
    return [(e.node, json.loads(e.data_json)) async for e in events if e.kind == "node.transition"]


async def test_intake_burn_in_gates_readiness_and_quarantines_a_bad_memory_row(env: Env) -> None:
    bad = env.sim.nodes["h200-n02"].nvml
    bad.faults.apply_fault({"kind": "row_remap", "gpu": 3, "pending": True, "uncorrectable": 2})
    await enroll_sim_fleet(env.stub, env.sim)

    good = await wait_node_state(env.stub, "h200-n01", types_pb2.NODE_STATE_READY)
    assert good.schedulable
    failed = await wait_node_state(env.stub, "h200-n02", types_pb2.NODE_STATE_QUARANTINED)
    assert failed.state_reason == (
        "check failed: dcgm-r2: Page Retirement/Row Remap: "
        "GPU 3 has a pending row remap: it needs a reset; GPU Memory: GPU 3: memory test "
        "found an uncorrectable error on a bad row (2 rows remapped for uncorrectable errors)"
    )

    (passed,) = await runs(env.stub, "h200-n01")
    assert (passed.level, passed.trigger, passed.passed) == ("medium", "intake", True)
    assert passed.suite_version == "test-suite@7"
    assert [c.name for c in passed.checks] == ["dcgm-r2", "nvlink-bandwidth"]
    bandwidth = passed.checks[1]
    assert json.loads(bandwidth.baseline_json) == {"min_gbps": 380.0, "gpu_model": "H200"}
    rates = json.loads(bandwidth.figures_json)["gpu_gbps"]
    assert len(rates) == 8 and min(rates.values()) > 380
    assert passed.duration_s > 0 and passed.started_at > 0

    (failing,) = await runs(env.stub, "h200-n02")
    assert not failing.passed and failing.trigger == "intake"
    assert [c.name for c in failing.checks] == ["dcgm-r2"]  # the first failure ends the run
    assert json.loads(failing.checks[0].figures_json)["tests"]["GPU Memory"] == "Fail"

    # Both went inspecting -> testing, and only the good one on to preparing.
    moves = [(n, d["from_state"], d["to_state"]) for n, d in await transitions(env.stub)]
    assert ("h200-n01", "inspecting", "testing") in moves
    assert ("h200-n01", "testing", "preparing") in moves
    assert ("h200-n02", "inspecting", "testing") in moves
    assert ("h200-n02", "testing", "draining") in moves
    assert ("h200-n02", "testing", "preparing") not in moves

    # Repaired (the GPU reset clears the pending remap) and undrained: it never
    # passed intake, so intake again; it passes and is ready.
    bad.faults.apply_fault({"kind": "gpu_reset", "gpu": 3})
    await env.stub.UndrainNode(fleet_pb2.UndrainNodeRequest(name="h200-n02"))
    await wait_node_state(env.stub, "h200-n02", types_pb2.NODE_STATE_READY)
    again = (await runs(env.stub, "h200-n02"))[-1]
    assert (again.level, again.trigger, again.passed) == ("medium", "intake", True)

    # A node that passed once and comes back from maintenance gets the repair level.
    await env.stub.DrainNode(fleet_pb2.DrainNodeRequest(name="h200-n01", reason="new DIMM"))
    await wait_node_state(env.stub, "h200-n01", types_pb2.NODE_STATE_MAINTENANCE)
    await env.stub.UndrainNode(fleet_pb2.UndrainNodeRequest(name="h200-n01"))
    await wait_node_state(env.stub, "h200-n01", types_pb2.NODE_STATE_READY)
    repair = (await runs(env.stub, "h200-n01"))[-1]
    assert (repair.level, repair.trigger, repair.passed) == ("quick", "repair", True)


@pytest.mark.parametrize("periodic", ["quick"])
@pytest.mark.parametrize(
    "specs", [default_fleet(nvl72_racks=1, hgx_nodes=2, trays=3)], ids=["nvl72x3+hgx2"]
)
async def test_periodic_checks_skip_allocated_nodes_and_keep_to_the_rack_cap(env: Env) -> None:
    await enroll_sim_fleet(env.stub, env.sim)
    await wait_all_ready(env.stub, within=90)
    alloc = await env.stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="held", spec=fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200")
        )
    )
    alloc = await wait_allocation(env.stub, alloc.id, fleet_pb2.ALLOCATION_STATE_READY)
    (held,) = alloc.nodes
    rack_of = {s.name: s.rack for s in env.sim.specs}

    async def periodic_runs() -> dict[str, int]:
        counts: dict[str, int] = {}
        for spec in env.sim.specs:
            counts[spec.name] = sum(
                1 for r in await runs(env.stub, spec.name) if r.trigger == "periodic"
            )
        return counts

    for _ in range(200):  # every idle node checked at least twice
        counts = await periodic_runs()
        if all(n >= 2 for name, n in counts.items() if name != held):
            break
        await asyncio.sleep(0.2)
    assert all(n >= 2 for name, n in counts.items() if name != held), counts
    assert counts[held] == 0

    # Replay the transitions: never two nodes of one rack testing at once,
    # and the allocated node never testing.
    testing: dict[str, set[str]] = {}
    for node, data in await transitions(env.stub):
        if data["to_state"] == "testing" and data["from_state"] == "ready":
            assert node != held
            testing.setdefault(rack_of[node], set()).add(node)
            assert len(testing[rack_of[node]]) <= 1, testing
        elif data["from_state"] == "testing":
            testing.get(rack_of[node], set()).discard(node)

    # An operator's run is refused on the allocated node, with its allocation.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.stub.RunChecks(fleet_pb2.RunChecksRequest(nodes=[held], level="quick"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{held} (allocated, {alloc.id})" in (err.value.details() or "")


@pytest.mark.parametrize(
    "specs", [default_fleet(nvl72_racks=1, hgx_nodes=0, trays=4)], ids=["nvl72x4"]
)
async def test_a_rack_runs_its_nvlink_check_together_and_names_the_slow_tray(env: Env) -> None:
    await enroll_sim_fleet(env.stub, env.sim)
    await wait_all_ready(env.stub, within=90)
    slow = env.sim.nodes["gb200-r01-t03"].nvml
    for link in range(10):
        slow.faults.apply_fault({"kind": "nvlink_down", "gpu": 1, "link": link})

    started = await env.stub.RunChecks(fleet_pb2.RunChecksRequest(rack="r01", level="medium"))
    assert sorted(started.started) == [f"gb200-r01-t{t:02d}" for t in range(1, 5)]
    failed = await wait_node_state(env.stub, "gb200-r01-t03", types_pb2.NODE_STATE_QUARANTINED)
    assert failed.state_reason.startswith("check failed: nvlink-bandwidth: GPU 1: ")
    assert "under 760 GB/s" in failed.state_reason
    for t in (1, 2, 4):
        name = f"gb200-r01-t{t:02d}"
        await wait_node_state(env.stub, name, types_pb2.NODE_STATE_READY)
        last = (await runs(env.stub, name))[-1]
        assert (last.trigger, last.passed) == ("operator", True)
        assert [c.name for c in last.checks] == ["dcgm-r2", "nvlink-bandwidth"]
    # The tray's own GPUs: only GPU 1 is under the floor.
    last = (await runs(env.stub, "gb200-r01-t03"))[-1]
    rates = json.loads(last.checks[-1].figures_json)["gpu_gbps"]
    assert rates["1"] < 760 <= min(v for k, v in rates.items() if k != "1")

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.stub.RunChecks(fleet_pb2.RunChecksRequest(rack="r01", level="extreme"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_profiles_checks_run_before_hand_off(env: Env) -> None:
    await enroll_sim_fleet(env.stub, env.sim)
    await wait_all_ready(env.stub)
    alloc = await env.stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="checked", spec=fleet_pb2.AllocationSpec(nodes=1, profile="checked")
        )
    )
    ready = await wait_allocation(env.stub, alloc.id, fleet_pb2.ALLOCATION_STATE_READY)
    (node,) = ready.nodes
    hand_off = (await runs(env.stub, node))[-1]
    assert (hand_off.level, hand_off.trigger, hand_off.passed) == ("quick", "hand_off", True)


async def test_a_node_that_overheats_under_test_is_powered_off_by_the_thermal_rules(
    env: Env,
) -> None:
    await enroll_sim_fleet(env.stub, env.sim)
    await wait_all_ready(env.stub)
    await env.stub.RunChecks(fleet_pb2.RunChecksRequest(nodes=["h200-n01"], level="long"))
    await wait_node_state(env.stub, "h200-n01", types_pb2.NODE_STATE_TESTING)
    env.sim.nodes["h200-n01"].nvml.faults.apply_fault(
        {"kind": "heat", "gpu": 4, "target_c": 97, "rate_c_per_s": 200}
    )
    off = await wait_node_state(env.stub, "h200-n01", types_pb2.NODE_STATE_POWERED_OFF, 30)
    assert "shutdown-heat" in off.state_reason
    assert env.sim.read_power()["h200-n01"] == "Off"
    # The interrupted run does not bring the node back.
    await asyncio.sleep(1.0)
    assert (await env.stub.GetNode(fleet_pb2.GetNodeRequest(name="h200-n01"))).state == (
        types_pb2.NODE_STATE_POWERED_OFF
    )
