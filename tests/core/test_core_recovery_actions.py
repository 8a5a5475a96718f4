"""NVML's recovery action and the catalogue's XIDs, carried out on simulated nodes.

The fleet is real peers (``recovery_harness``): the controller with the
shipped default rules, the sushy-tools emulator as every BMC, and agents on
the NVML fake of an HGX H200, whose XIDs set the recovery-action field as the
driver does. Each test injects a fault through the API and reads the outcome
where it lands: the fake's field through NVML, node states over gRPC, the
controller's events, the emulator's power state.

The last test drives the core alone (``core_fakes``) to show that two rules
asking for the same reboot in one report power-cycle the node once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest
from core_builders import Racks
from core_fakes import FakeBmc
from recovery_harness import recovery_fleet, state

from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.states import NodeState

GPU_RESET = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
NODE_REBOOT = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
NONE = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
NODE = "h200-n01"


async def held_for(seconds: float, check: Callable[[], bool]) -> None:
    """Assert ``check`` stays true for ``seconds``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        assert check()
        await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
async def test_idle_node_gpu_reset_xid_resets_the_gpu_and_returns_to_ready(
    tmp_path: Path,
) -> None:
    async with recovery_fleet(tmp_path) as h:
        await h.inject(NODE, kind="xid", gpu=2, code=62)  # catalogue: reset the GPU
        assert h.recovery_field(NODE, 2) == GPU_RESET

        await h.wait_event(
            NODE,
            lambda e: (
                e.kind == "policy.action"
                and e.data.get("action") == "reset_gpu"
                and "reset, recovery action none: back to service" in str(e.data.get("outcome"))
            ),
        )
        assert h.recovery_field(NODE, 2) == NONE
        ready = await h.wait_ready(NODE)
        assert ready.state_reason.startswith("prepared")
        moves = await h.transitions(NODE)
        back = moves.index("maintenance")
        assert moves[back - 1 : back + 4] == [
            "draining",
            "maintenance",
            "inspecting",
            "preparing",
            "ready",
        ]
        outcomes = await h.outcomes(NODE, "reset_gpu")
        assert "node out of service: GPU 2 reset once it is idle" in outcomes
        assert "GPU 2 reset; waiting for the recovery action to read none" in outcomes
        reset = [
            e for e in await h.events(NODE, "policy.action") if e.data["action"] == "reset_gpu"
        ]
        assert {e.rule for e in reset} <= {"xid-gpu-reset", "recovery-gpu-reset"}
        assert all(e.data["gpus"] == [2] for e in reset)
        assert h.sim(NODE).boots == 1  # the GPU was reset, the node never rebooted
        other = await h.node("h200-n02")
        assert state(other) == "ready"  # only the node that asked


@pytest.mark.timeout(120)
async def test_allocated_node_tells_the_job_drains_and_resets_once_released(
    tmp_path: Path,
) -> None:
    async with recovery_fleet(tmp_path) as h:
        alloc = await h.allocate("train")
        (node,) = alloc.nodes
        await h.inject(node, kind="recovery_action", gpu=4, action=GPU_RESET)

        notice = await h.wait_event(
            node,
            lambda e: e.kind == "allocation.notice" and e.data.get("action") == "reset_gpu",
        )
        assert notice.allocation == alloc.id and notice.rule == "recovery-gpu-reset"
        assert (
            "GPU 4 need a reset" in notice.reason
            and "once the allocation releases" in notice.reason
        )
        draining = await h.wait_node(node, lambda n: state(n) == "draining")
        assert draining.state_reason.startswith("GPU reset: recovery-gpu-reset: gpu4")
        # The job keeps the node, and its GPU is not reset under it.
        await held_for(1.5, lambda: h.recovery_field(node, 4) == GPU_RESET)
        assert state(await h.node(node)) == "draining"

        await h.release(alloc.id)
        await h.wait_event(
            node,
            lambda e: e.kind == "policy.action" and "back to service" in str(e.data.get("outcome")),
        )
        assert h.recovery_field(node, 4) == NONE
        await h.wait_ready(node)
        moves = await h.transitions(node)
        assert moves[moves.index("draining") :][:3] == ["draining", "maintenance", "inspecting"]


@pytest.mark.timeout(120)
async def test_a_reset_the_gpu_refuses_quarantines_with_the_agents_words(
    tmp_path: Path,
) -> None:
    async with recovery_fleet(tmp_path) as h:
        await h.inject(NODE, kind="add_process", gpu=3, pid=4242)  # a leftover process
        await h.inject(NODE, kind="xid", gpu=3, code=95)

        node = await h.wait_node(NODE, lambda n: state(n) == "quarantined")
        assert node.state_reason.startswith("xid-gpu-reset: GPU reset failed: GPU 3: reset failed")
        assert f"code {pynvml.NVML_ERROR_IN_USE}" in node.state_reason
        assert h.recovery_field(NODE, 3) == GPU_RESET  # nothing was reset
        outcomes = await h.outcomes(NODE, "reset_gpu")
        assert any(o.startswith("reset failed: GPU 3: reset failed") for o in outcomes)
        await held_for(1.0, lambda: True)
        assert state(await h.node(NODE)) == "quarantined"  # and it stays there


@pytest.mark.timeout(180)
async def test_node_reboot_power_cycles_through_the_bmc_and_quarantines(
    tmp_path: Path,
) -> None:
    async with recovery_fleet(tmp_path, power_delay=True) as h:
        sim = h.sim(NODE)
        assert sim.boots == 1
        await h.inject(NODE, kind="recovery_action", gpu=0, action=NODE_REBOOT)

        cycled = await h.wait_event(
            NODE,
            lambda e: e.kind == "node.power" and e.data.get("action") == "cycle",
            within=60.0,
        )
        assert cycled.data["power"] == "on"
        assert await h.outcomes(NODE, "power_cycle") == ["power cycle"]
        # The emulator took the node down and back up: the sim saw both, and
        # the fake rebooted with it, which cleared the field.
        assert sim.boots == 2 and sim.history[-2:] == ["off", "on"]
        assert h.recovery_field(NODE, 0) == NONE
        node = await h.wait_node(NODE, lambda n: state(n) == "quarantined")
        assert node.state_reason.startswith(
            "recovery-node-reboot: gpu0 recovery_action=node_reboot"
        )
        assert await h.outcomes(NODE, "quarantine") == ["node to quarantined"]


REBOOT_TWICE = HealthReport(
    gpus=(GpuHealth(index=0, temp_c=50.0, xids=(79,), recovery_action=NODE_REBOOT),)
)


@pytest.mark.timeout(60)
async def test_two_rules_asking_for_one_reboot_power_cycle_once(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        fleet = make_fleet()  # the default rules: fatal-xid and recovery-node-reboot
        await Racks(fleet, stack).add(["n1"], rack="r1", gpu_count=1)
        bmc.calls.clear()
        await fleet.agent_health("n1", REBOOT_TWICE)
        await fleet.policies.settle()
        assert [op for node, op in bmc.calls if node == "n1" and op == "cycle"] == ["cycle"]
        cycles = [
            (e.rule, e.data["outcome"])
            for e in await fleet.events.since(0, node="n1")
            if e.kind == "policy.action" and e.data["action"] == "power_cycle"
        ]
        assert cycles[0] == ("fatal-xid", "power cycle")
        assert cycles[1][0] == "recovery-node-reboot"
        assert cycles[1][1].startswith("skipped: power-cycled 0s ago by rule fatal-xid")
        assert (await fleet.get_node("n1")).state in (NodeState.DRAINING, NodeState.QUARANTINED)
        await fleet.stop()
