"""``plainly_fits``: the never-fits check's shortcut for requests that need
no topology (N nodes of one model anywhere) agrees with what placement
answers on the whole fleet, for random fleets and requests, and never
answers for a request that does need topology."""

from __future__ import annotations

import random

import pytest

from controller.core.allocations import plainly_fits, request_for
from controller.core.model import AllocationSpec
from controller.core.node_specs import node_spec
from controller.core.records import NodeRecord
from controller.placement import Topology, Usage
from controller.placement.engine import place
from controller.placement.model import NoFit

MODELS = ("NVIDIA H200", "NVIDIA GB200", "")


def random_fleet(rng: random.Random) -> list[NodeRecord]:
    """NVLink domains of a few nodes alike (model, GPUs, rack), and boxes alone."""
    domains = {
        f"d{d}": (rng.choice(MODELS), rng.choice((0, 4, 8)), f"r{rng.randint(0, 3)}")
        for d in range(6)
    }
    nodes = []
    for i in range(rng.randint(0, 40)):
        if rng.random() < 0.6:
            domain = rng.choice(sorted(domains))
            model, gpus, rack = domains[domain]
        else:
            domain = ""
            model, gpus, rack = rng.choice(MODELS), rng.choice((0, 4, 8)), f"r{rng.randint(0, 3)}"
        nodes.append(
            NodeRecord(
                name=f"n{i:03d}",
                bmc_url=f"redfish+http://127.0.0.1:9/x/{i}",
                rack=rack,
                gpu_model=model,
                gpu_count=gpus,
                nvlink_domain=domain,
            )
        )
    return nodes


def placement_fits(spec: AllocationSpec, nodes: list[NodeRecord]) -> bool:
    fleet = Topology.build(node_spec(n, n.gpu_count > 0) for n in nodes)
    verdict = place(fleet, Usage.from_bookings(fleet, ()), request_for("x", spec, 0))
    return not isinstance(verdict, NoFit)


@pytest.mark.timeout(60)
def test_plain_requests_get_the_answer_placement_gives() -> None:
    rng = random.Random(7)
    checked = {True: 0, False: 0}
    for _ in range(400):
        nodes = random_fleet(rng)
        spec = AllocationSpec(
            nodes=rng.randint(1, 30), gpu_model=rng.choice(("", "NVIDIA H200", "NVIDIA GB200"))
        )
        answer = plainly_fits(spec, nodes)
        assert answer == placement_fits(spec, nodes), (spec, len(nodes))
        checked[answer] += 1
    assert checked[True] > 50 and checked[False] > 50, checked


@pytest.mark.parametrize(
    "spec",
    [
        AllocationSpec(nodes=1, topology="nvlink"),
        AllocationSpec(racks=1),
        AllocationSpec(nodes=2, segment=2),
        AllocationSpec(nodes=1, spares_per_domain=1),
        AllocationSpec(nodes=1, exclusive=True),
    ],
)
def test_requests_that_need_topology_are_left_to_placement(spec: AllocationSpec) -> None:
    nodes = random_fleet(random.Random(3))
    assert not plainly_fits(spec, nodes)
