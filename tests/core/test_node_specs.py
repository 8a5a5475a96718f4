"""The scheduler's node specs are recomputed only where something changed
(``controller/core/node_specs.py``): after every kind of change that moves
``Nodes.placeable`` (a saved node, an agent leaving or coming back, a health
report failing or passing the baseline gate), the topology a scheduling pass
uses equals one built from the whole fleet — on both stores."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import pytest
from core_builders import Racks, gpus, set_fields
from core_fakes import answering

from controller.core.allocations import computes
from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.node_specs import node_spec
from controller.core.states import PowerState
from controller.placement import Topology

NAMES = [f"t{i}" for i in range(6)]


async def fresh_topology(fleet: Fleet) -> Topology:
    nodes = computes(await fleet.nodes.records())
    return Topology.build(node_spec(n, fleet.nodes.placeable(n)) for n in nodes)


def report(dbe: int) -> HealthReport:
    return HealthReport(sampled_at=1.0, gpus=(GpuHealth(index=0, ecc_dbe_volatile=dbe),))


@pytest.mark.timeout(120)
async def test_the_kept_specs_equal_a_fresh_build_after_every_change(
    make_fleet: Callable[..., Fleet],
) -> None:
    fleet = make_fleet()
    rng = random.Random(5)
    async with contextlib.AsyncExitStack() as stack:
        await Racks(fleet, stack).add(NAMES, rack="r1")
        kinds = {"fields": 0, "agent": 0, "health": 0}
        for _step in range(60):
            name = rng.choice(NAMES)
            kind = rng.choice(sorted(kinds))
            if kind == "fields":
                change = rng.choice(
                    [
                        {"bmc_health": "unreachable"},
                        {"bmc_health": "ok"},
                        {"power": PowerState.OFF},
                        {"power": PowerState.ON},
                        {"drained": True},
                        {"drained": False},
                    ]
                )
                await set_fields(fleet, name, **change)
            elif kind == "agent":
                if fleet.agents.is_connected(name):
                    fleet.agents.drop(name)
                else:
                    session = await fleet.agent_connected(name, gpus(4, "NVIDIA GB200", "r1"), "")
                    await stack.enter_async_context(answering(fleet.agents, session))
            else:
                await fleet.agent_health(name, report(rng.choice([0, 0, 1])))
            kinds[kind] += 1
            kept = await fleet.allocations.topology()
            fresh = await fresh_topology(fleet)
            assert kept.dom_nodes == fresh.dom_nodes
            assert kept.dom_sched == fresh.dom_sched, (kind, name)
            assert all(kept.node(n) == fresh.node(n) for n in NAMES)
        assert all(kinds.values()), kinds
    await fleet.stop()
