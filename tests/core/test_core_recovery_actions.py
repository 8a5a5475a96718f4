"""NVML's recovery action and the catalogue's XIDs, carried out on simulated nodes.

The fleet is real peers (``recovery_harness``): the controller with the
shipped default rules, the sushy-tools emulator as every BMC, and agents on
the NVML fake of an HGX H200, whose XIDs set the recovery-action field as the
driver does. Each test injects a fault through the API and reads the outcome
where it lands: the fake's field through NVML, node states over gRPC, the
controller's events, the emulator's power state.

The last tests drive the core alone, on both stores (``core_fakes`` plays
the BMC and answers for the agent): two rules asking for the same reboot in
one report power-cycle the node once; a GPU still asking for a reset after
its reset quarantines the node; and a controller restarted mid-reset picks
the reset up from what the GPU still says and the node's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest
from core_builders import Racks, gpus, reconcile
from core_fakes import FakeBmc, answering
from recovery_harness import recovery_fleet, state

from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.model import AgentCommand, AllocationSpec, CommandOutcome
from controller.core.states import NodeState

GPU_RESET = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
NODE_REBOOT = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
NONE = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
NODE = "h200-n01"


async def until(check: Callable[[], bool], within: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not check():
        assert loop.time() < end, "never happened"
        await asyncio.sleep(0.1)


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
            "GPU 4 needs a reset" in notice.reason
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
        # The emulator took the node down and back up: the sim sees both (it
        # polls the emulator), and the fake reboots with it, clearing the field.
        await until(lambda: sim.history[-2:] == ["off", "on"], within=30.0)
        assert sim.boots == 2
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


def asks(action: int) -> HealthReport:
    """A one-GPU report whose recovery action is ``action``."""
    return HealthReport(gpus=(GpuHealth(index=0, temp_c=50.0, recovery_action=action),))


class Agent:
    """Answers the core's commands as an agent would, and keeps them."""

    def __init__(self) -> None:
        self.commands: list[AgentCommand] = []

    def __call__(self, command: AgentCommand) -> CommandOutcome:
        self.commands.append(command)
        return CommandOutcome(ok=True, changed=(command.kind,))

    def resets(self) -> list[str]:
        return [c.payload for c in self.commands if c.kind == "reset_gpu"]


@pytest.mark.timeout(60)
async def test_a_gpu_still_asking_after_its_reset_quarantines_the_node(
    make_fleet: Callable[..., Fleet],
) -> None:
    agent = Agent()
    async with contextlib.AsyncExitStack() as stack:
        fleet = make_fleet()
        stack.push_async_callback(fleet.stop)
        await Racks(fleet, stack).add(["n1"], rack="r1", gpu_count=1, answer=agent)
        await fleet.agent_health("n1", asks(GPU_RESET))
        await fleet.policies.settle()
        assert agent.resets() == ["[0]"]
        assert (await fleet.get_node("n1")).state == NodeState.MAINTENANCE
        for _ in range(2):
            await fleet.agent_health("n1", asks(GPU_RESET))
            await fleet.policies.settle()
            assert (await fleet.get_node("n1")).state == NodeState.MAINTENANCE
        await fleet.agent_health("n1", asks(GPU_RESET))  # the third report after it
        await fleet.policies.settle()
        node = await fleet.get_node("n1")
        assert node.state == NodeState.QUARANTINED
        assert node.state_reason == (
            "recovery-gpu-reset: GPU reset failed: GPU 0 still asks for gpu_reset "
            "3 reports after its reset"
        )
        assert agent.resets() == ["[0]"]  # reset once, not again and again


@pytest.mark.timeout(60)
async def test_a_restarted_controller_resumes_a_reset_from_the_gpu_and_the_reason(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        before = make_fleet()
        await Racks(before, stack).add(["n1"], rack="r1", gpu_count=1)
        alloc = await before.create_allocation("job", AllocationSpec(nodes=1))
        await before.agent_health("n1", asks(GPU_RESET))
        await before.policies.settle()
        held = await before.get_node("n1")
        assert held.state == NodeState.DRAINING and held.allocation == alloc.id
        assert held.state_reason.startswith("GPU reset: recovery-gpu-reset: gpu0")
        await before.stop()

        # Another controller on the same store: its agent registers, reports
        # the field still set, and the job lets go of the node.
        after = make_fleet()
        stack.push_async_callback(after.stop)
        agent = Agent()
        session = await after.agent_connected("n1", gpus(1, "NVIDIA GB200", "r1"), "")
        await stack.enter_async_context(answering(after.agents, session, agent))
        await after.agent_health("n1", asks(GPU_RESET))
        await after.policies.settle()
        assert agent.resets() == []  # the job still holds it
        await after.release(alloc.id)
        await reconcile(after, passes=2)  # draining → maintenance
        assert (await after.get_node("n1")).state == NodeState.MAINTENANCE
        await after.policies.resets.advance()
        await after.policies.settle()
        assert agent.resets() == ["[0]"]
        await after.agent_health("n1", asks(NONE))
        await after.policies.settle()
        # Its reason said a reset took it out: back to service, not left out.
        assert (await after.get_node("n1")).state == NodeState.INSPECTING
        await reconcile(after)
        assert (await after.get_node("n1")).state == NodeState.READY
