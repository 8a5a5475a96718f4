"""The agent's ``reset_gpu`` command on the fake H200, over its real wire.

A bare ``grpc.aio`` AgentService on loopback (``bare_controller``) registers the agent, sends it
``Command(reset_gpu=...)`` messages and records the ``CommandResult``s and
health reports it sends back. The GPUs are the NVML fake: an injected XID sets
the recovery-action field the way the driver does, a compute process holds a
GPU the way a leftover job would, and the field is read back through NVML.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pynvml
import pytest
from bare_controller import BareController, serving, until

from agent.client import Agent
from agent.nvml import FakeNvml, open_backend
from kiln.v1 import agent_pb2

pytestmark = pytest.mark.timeout(60)

GPU_RESET = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
NONE = pynvml.NVML_GPU_RECOVERY_ACTION_NONE


class CommandingController(BareController):
    """Registers one agent (a sample every 0.1 s), then sends it what
    ``commands`` holds."""

    def __init__(self) -> None:
        super().__init__(sample_interval=0.1)

    async def reset(self, ident: str, *indices: int) -> agent_pb2.CommandResult:
        await self.commands.put(
            agent_pb2.Command(id=ident, reset_gpu=agent_pb2.ResetGpu(indices=list(indices)))
        )
        await until(lambda: ident in self.results)
        return self.results[ident]

    def reported_recovery(self, index: int) -> int:
        """GPU ``index``'s recovery action in the latest health report."""
        gpus = {g.index: g for g in self.health[-1].health.gpus}
        return int(gpus[index].recovery_action)


def recovery_field(nvml: FakeNvml, index: int) -> int:
    """The GPU's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, read through NVML."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    assert value.nvmlReturn == pynvml.NVML_SUCCESS
    return int(value.value.uiVal)


@pytest.fixture
async def running() -> AsyncIterator[tuple[CommandingController, FakeNvml]]:
    nvml = open_backend("fake:h200", node_name="h200-reset")
    assert isinstance(nvml, FakeNvml)
    controller = CommandingController()
    async with serving(controller) as port:
        agent = Agent(
            f"127.0.0.1:{port}", "h200-reset", nvml, backoff=(0.1, 0.3), sample_interval=0.1
        )
        task = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(controller.registered.wait(), 30)
            yield controller, nvml
        finally:
            await agent.stop()
            await asyncio.wait_for(task, 30)


async def test_a_gpu_whose_recovery_action_asks_for_a_reset_is_reset_and_reads_none(
    running: tuple[CommandingController, FakeNvml],
) -> None:
    controller, nvml = running
    nvml.faults.apply_fault({"kind": "xid", "gpu": 2, "code": 62})  # the catalogue: reset
    nvml.faults.apply_fault({"kind": "recovery_action", "gpu": 6, "action": GPU_RESET})
    assert recovery_field(nvml, 2) == GPU_RESET
    await until(lambda: bool(controller.health) and controller.reported_recovery(2) == GPU_RESET)

    result = await controller.reset("c1", 2)

    assert result.ok and list(result.failures) == []
    assert list(result.changed) == ["GPU 2: reset"]
    assert recovery_field(nvml, 2) == NONE
    assert recovery_field(nvml, 6) == GPU_RESET  # only the GPU named was reset
    seen = len(controller.health)
    await until(lambda: len(controller.health) > seen)  # a report sampled after the reset
    assert controller.reported_recovery(2) == NONE
    assert controller.reported_recovery(6) == GPU_RESET


async def test_a_gpu_held_by_a_process_is_not_reset_and_the_failure_names_it(
    running: tuple[CommandingController, FakeNvml],
) -> None:
    controller, nvml = running
    for index in (1, 3):
        nvml.faults.apply_fault({"kind": "xid", "gpu": index, "code": 95})
    nvml.faults.apply_fault({"kind": "add_process", "gpu": 3, "pid": 4242})

    result = await controller.reset("c1", 1, 3)

    assert not result.ok
    assert list(result.changed) == ["GPU 1: reset"]
    (failure,) = result.failures
    assert failure.startswith("GPU 3: reset failed:"), failure
    # NVML_ERROR_IN_USE, as pynvml words it without a driver's error strings.
    assert f"code {pynvml.NVML_ERROR_IN_USE}" in failure or "In use" in failure, failure
    assert recovery_field(nvml, 1) == NONE
    assert recovery_field(nvml, 3) == GPU_RESET  # still asks: nothing was reset

    nvml.faults.apply_fault({"kind": "remove_process", "gpu": 3, "pid": 4242})
    again = await controller.reset("c2", 3)
    assert again.ok and list(again.changed) == ["GPU 3: reset"]
    assert recovery_field(nvml, 3) == NONE


async def test_a_reset_naming_no_gpu_or_a_gpu_the_node_lacks_fails(
    running: tuple[CommandingController, FakeNvml],
) -> None:
    controller, _ = running
    empty = await controller.reset("c1")
    assert not empty.ok and list(empty.failures) == ["no GPU named to reset"]
    missing = await controller.reset("c2", 8)
    assert not missing.ok
    assert len(missing.failures) == 1 and "GPU 8" in missing.failures[0]
