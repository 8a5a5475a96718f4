"""Builders for the core tests: enrol nodes and bring them to ready through
the core's own steps, with ``core_fakes`` playing BMCs and agents."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from core_fakes import SCHEME, Answer, answering, ok

from controller.core.fleet import Fleet
from controller.core.model import EnrollSpec, GpuInfo, NodeInfo
from controller.core.ports import Tx
from controller.core.states import NodeState
from controller.core.transitions import load_node


def gpus(count: int, model: str, clique: str) -> list[GpuInfo]:
    return [
        GpuInfo(index=i, uuid=f"GPU-{clique}-{i}", model=model, clique=clique) for i in range(count)
    ]


def spec(name: str, rack: str = "", profile: str = "") -> EnrollSpec:
    return EnrollSpec(
        name=name,
        bmc_url=f"{SCHEME}{name}",
        username="admin",
        password="secret-pw",
        rack=rack,
        profile=profile,
    )


async def reconcile(fleet: Fleet, passes: int = 4) -> None:
    """Run lifecycle passes until every started step has finished."""
    for _ in range(passes):
        await fleet.lifecycle.reconcile_once()
        await fleet.lifecycle.settle()


async def power_sync_cycle(fleet: Fleet) -> None:
    """Power sync passes until every node's BMC was read at least once: a
    node its agent vouches for is read on one pass of every ``vouched_every``."""
    for _ in range(fleet.power_sync.vouched_every):
        await fleet.power_sync.run_once()


async def set_fields(fleet: Fleet, name: str, **fields: object) -> None:
    """Change a node's stored fields directly (what an operator or a BMC
    reading would change), in one transaction."""

    def write(tx: Tx) -> None:
        node = load_node(tx, name)
        for key, value in fields.items():
            setattr(node, key, value)
        tx.nodes.save(node)

    await fleet.store.tx(write)


async def states(fleet: Fleet) -> dict[str, NodeState]:
    return {n.name: n.state for n in await fleet.list_nodes()}


class Racks:
    """NVL72-shaped racks of ``trays`` nodes (4 GB200 each) and HGX boxes
    (8 H200 each, one NVLink domain apiece), enrolled and brought to ready."""

    def __init__(self, fleet: Fleet, stack: contextlib.AsyncExitStack) -> None:
        self.fleet = fleet
        self._stack = stack

    async def add(
        self,
        names: Sequence[str],
        *,
        rack: str,
        gpu_count: int = 4,
        model: str = "NVIDIA GB200",
        domain: str | None = None,
        answer: Answer = ok,
    ) -> list[NodeInfo]:
        for name in names:
            await self.fleet.enroll(spec(name, rack))
        await reconcile(self.fleet)  # enrolled → inspecting, powered on
        for name in names:
            clique = domain or (rack if gpu_count == 4 else name)
            session = await self.fleet.agent_connected(name, gpus(gpu_count, model, clique), "")
            await self._stack.enter_async_context(answering(self.fleet.agents, session, answer))
        await reconcile(self.fleet)
        return [await self.fleet.get_node(n) for n in names]
