"""Table tests for the placement rules of ``place``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from placement_fleet import fleet, hold_nodes, rack_nodes

from controller.core.errors import InvalidArgument
from controller.placement import Level, NoFit, Placement, Request, Topology, Usage, place


@dataclass(frozen=True)
class Case:
    id: str
    topo: Callable[[], Topology]
    request: Request
    busy: tuple[str, ...] = ()  # nodes some other job holds
    domains: int | None = None  # expected number of NVLink domains
    per_domain: tuple[int, ...] | None = None  # expected job nodes per domain (sorted)
    spares: int = 0
    stranded: int | None = None
    nofit: bool | None = None  # None: expect a placement; else NoFit.permanent
    in_domains: tuple[str, ...] | None = None


def two_racks_hgx() -> Topology:
    return fleet().nvl72_racks(2).hgx(4).build()


def three_17() -> Topology:
    return fleet().nvl72_racks(3, trays=17).build()


def leafs_2x1() -> Topology:
    return fleet().nvl72_racks(1).nvl72_racks(1).build()


def spines_2() -> Topology:
    return fleet().nvl72_racks(1, spine="s1").nvl72_racks(1, spine="s2").build()


def mixed_free() -> Topology:
    return fleet().nvl72_racks(3).build()


CASES = [
    Case("one-node-prefers-hgx-box", two_racks_hgx, Request("r", nodes=1), domains=1, stranded=0),
    Case(
        "one-node-best-fit-partly-used-rack",
        two_racks_hgx,
        Request("r", nodes=1, gpu_model="GB200"),
        busy=tuple(rack_nodes(2, range(1, 18))),
        in_domains=("c0ffee.2",),
        stranded=0,
    ),
    Case("full-rack-one-domain", two_racks_hgx, Request("r", nodes=18), domains=1, stranded=0),
    Case(
        "20-nodes-two-domains",
        two_racks_hgx,
        Request("r", nodes=20),
        domains=2,
        per_domain=(2, 18),
    ),
    Case(
        "fewest-domains-then-least-stranded",
        mixed_free,
        Request("r", nodes=20),
        busy=tuple(rack_nodes(2, range(1, 9)) + rack_nodes(3, range(1, 9))),
        domains=2,
        per_domain=(10, 10),
        stranded=0,
    ),
    Case(
        "slurm-pr225-segment-12-on-three-17-blocks",
        three_17,
        Request("r", nodes=36, segment=12),
        domains=3,
        per_domain=(12, 12, 12),
    ),
    Case(
        "segment-that-can-never-fit",
        lambda: fleet().nvl72_racks(2, trays=17).build(),
        Request("r", nodes=36, segment=12),
        nofit=True,
    ),
    Case(
        "segment-waits-when-busy",
        three_17,
        Request("r", nodes=36, segment=12),
        busy=tuple(rack_nodes(1, range(1, 7))),
        nofit=False,
    ),
    Case(
        "required-nvlink-too-big",
        two_racks_hgx,
        Request("r", nodes=20, level=Level.NVLINK),
        nofit=True,
    ),
    Case(
        "required-nvlink-busy-waits",
        two_racks_hgx,
        Request("r", nodes=18, level=Level.NVLINK),
        busy=("gb-r01-t01", "gb-r02-t01"),
        nofit=False,
    ),
    Case(
        "required-leaf-across-leaves-never",
        leafs_2x1,
        Request("r", nodes=20, level=Level.LEAF),
        nofit=True,
    ),
    Case(
        "preferred-leaf-falls-back-to-spine",
        leafs_2x1,
        Request("r", nodes=20, level=Level.LEAF, required=False),
        domains=2,
    ),
    Case(
        "required-spine-across-spines-never",
        spines_2,
        Request("r", nodes=20, level=Level.SPINE),
        nofit=True,
    ),
    Case(
        "preferred-spine-falls-back-to-fleet",
        spines_2,
        Request("r", nodes=20, level=Level.SPINE, required=False),
        domains=2,
    ),
    Case(
        "spares-in-the-same-domain",
        two_racks_hgx,
        Request("r", nodes=16, spares_per_domain=2),
        domains=1,
        spares=2,
        stranded=0,
    ),
    Case(
        "spares-per-domain-on-two-domains",
        two_racks_hgx,
        Request("r", nodes=32, spares_per_domain=2),
        domains=2,
        per_domain=(16, 16),
        spares=4,
    ),
    Case(
        "exclusive-skips-shared-rack",
        two_racks_hgx,
        Request("r", nodes=4, gpu_model="GB200", exclusive=True),
        busy=("gb-r01-t01",),
        in_domains=("c0ffee.2",),
        stranded=14 * 4,
    ),
    Case(
        "exclusive-waits-when-all-racks-shared",
        two_racks_hgx,
        Request("r", nodes=4, gpu_model="GB200", exclusive=True),
        busy=("gb-r01-t01", "gb-r02-t01"),
        nofit=False,
    ),
    Case("two-whole-racks", two_racks_hgx, Request("r", racks=2), domains=2, per_domain=(18, 18)),
    Case(
        "whole-rack-skips-rack-with-down-tray",
        lambda: fleet().nvl72_racks(2).down("gb-r01-t05").build(),
        Request("r", racks=1),
        in_domains=("c0ffee.2",),
    ),
    Case(
        "rack-with-spares",
        two_racks_hgx,
        Request("r", racks=1, spares_per_domain=2),
        domains=1,
        per_domain=(16,),
        spares=2,
    ),
    Case("more-racks-than-fleet", two_racks_hgx, Request("r", racks=3), nofit=True),
    Case(
        "racks-wait-when-partly-used",
        two_racks_hgx,
        Request("r", racks=2),
        busy=("gb-r02-t18",),
        nofit=False,
    ),
    Case("unknown-gpu-model", two_racks_hgx, Request("r", nodes=1, gpu_model="MI300X"), nofit=True),
    Case("larger-than-fleet", two_racks_hgx, Request("r", nodes=41), nofit=True),
    Case(
        "never-mixes-models",
        two_racks_hgx,
        Request("r", nodes=37),
        nofit=True,
    ),
    Case(
        "down-nodes-are-never-placed",
        lambda: fleet().nvl72_racks(1).down(*rack_nodes(1, range(1, 4))).build(),
        Request("r", nodes=16),
        nofit=False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_place(case: Case) -> None:
    topo = case.topo()
    usage = Usage(topo)
    if case.busy:
        usage = hold_nodes(usage, "other", case.busy, topo)
    got = place(topo, usage, case.request)
    if case.nofit is not None:
        assert isinstance(got, NoFit), got
        assert got.permanent is case.nofit, got.reason
        assert got.reason
        return
    assert isinstance(got, Placement), got
    req = case.request
    want_nodes = req.nodes or sum(
        len(topo.domain_nodes(d)) - req.spares_per_domain for d in got.domains
    )
    assert len(got.nodes) == want_nodes
    assert len(set(got.nodes + got.spares)) == len(got.nodes) + len(got.spares)
    for n in got.nodes + got.spares:
        assert usage.is_free(n), n
        assert topo.node(n).domain in got.domains
    per = Counter(topo.node(n).domain for n in got.nodes)
    assert set(per) == set(got.domains)
    if case.domains is not None:
        assert len(got.domains) == case.domains
    if case.per_domain is not None:
        assert tuple(sorted(per.values())) == case.per_domain
    assert len(got.spares) == case.spares
    if case.stranded is not None:
        assert got.stranded_gpus == case.stranded
    if case.in_domains is not None:
        assert got.domains == case.in_domains
    if req.segment:
        assert all(v % req.segment == 0 for v in per.values())


def test_preferred_leaf_stays_in_leaf_when_it_can() -> None:
    # Leaf A: two racks with 10 free each; leaf B: one full rack plus one with 2 free.
    topo = fleet().nvl72_racks(2, leaf="A").nvl72_racks(2, leaf="B").build()
    usage = hold_nodes(
        Usage(topo), "x", rack_nodes(1, range(1, 9)) + rack_nodes(2, range(1, 9)), topo
    )
    usage = hold_nodes(usage, "y", rack_nodes(4, range(1, 17)), topo)
    got = place(topo, usage, Request("r", nodes=20, level=Level.LEAF, required=False))
    assert isinstance(got, Placement)
    assert {topo.node(n).leaf for n in got.nodes} in ({"A"}, {"B"})


def test_tighter_leaf_wins_at_equal_domain_count() -> None:
    # Two racks with 10 free in different leaves vs two with 10 free in one leaf.
    topo = fleet().nvl72_racks(1).nvl72_racks(1).nvl72_racks(2, leaf="C").build()
    busy = [n for r in (1, 2, 3, 4) for n in rack_nodes(r, range(1, 9))]
    usage = hold_nodes(Usage(topo), "x", busy, topo)
    got = place(topo, usage, Request("r", nodes=20))
    assert isinstance(got, Placement)
    assert {topo.node(n).leaf for n in got.nodes} == {"C"}


def test_blocked_nodes_are_never_used() -> None:
    topo = fleet().nvl72_racks(2).build()
    blocked = frozenset(rack_nodes(1, range(1, 19)))
    got = place(topo, Usage(topo), Request("r", nodes=10), blocked=blocked)
    assert isinstance(got, Placement)
    assert not set(got.nodes) & blocked
    full = place(topo, Usage(topo), Request("r", nodes=20), blocked=blocked)
    assert isinstance(full, NoFit) and not full.permanent


def test_exclusive_domain_is_not_shared_afterwards() -> None:
    topo = fleet().nvl72_racks(1).build()
    req = Request("x", nodes=4, exclusive=True)
    got = place(topo, Usage(topo), req)
    assert isinstance(got, Placement)
    from controller.placement import booking_for

    usage = Usage(topo).with_booking(booking_for(topo, req, got))
    other = place(topo, usage, Request("y", nodes=1))
    assert isinstance(other, NoFit) and not other.permanent


def test_usage_of_other_topology_is_refused() -> None:
    topo = fleet().nvl72_racks(1).build()
    with pytest.raises(InvalidArgument):
        place(topo, Usage(fleet().nvl72_racks(1).build()), Request("r", nodes=1))


@pytest.mark.parametrize(
    "req",
    [
        pytest.param(Request("r"), id="neither-nodes-nor-racks"),
        pytest.param(Request("r", nodes=2, racks=1), id="both-nodes-and-racks"),
        pytest.param(Request("r", nodes=-1), id="negative-nodes"),
        pytest.param(Request("r", nodes=10, segment=4), id="segment-does-not-divide"),
        pytest.param(Request("r", racks=1, segment=2), id="segment-on-racks"),
        pytest.param(Request("", nodes=1), id="empty-key"),
        pytest.param(Request("r", nodes=1, spares_per_domain=-1), id="negative-spares"),
    ],
)
def test_invalid_requests_raise(req: Request) -> None:
    topo = fleet().nvl72_racks(1).build()
    with pytest.raises(InvalidArgument):
        place(topo, Usage(topo), req)
