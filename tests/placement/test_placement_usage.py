"""The usage overlay: snapshot isolation, double-booking guards, index upkeep."""

from __future__ import annotations

import pytest
from placement_fleet import book, check_indexes, fleet, hold_nodes, rack_nodes

from controller.core.errors import FailedPrecondition, InvalidArgument, NotFound
from controller.placement import Booking, NodeSpec, Request, Topology, Usage


def test_snapshot_never_leaks_into_another() -> None:
    topo = fleet().nvl72_racks(2).hgx(2).build()
    base = Usage(topo)
    a, pa = book(topo, base, Request("a", nodes=20))
    b, pb = book(topo, base, Request("b", nodes=20))
    # Same request against the same base: same answer, independent overlays.
    assert pa.nodes == pb.nodes
    assert a.booked_by(pa.nodes[0]) == "a"
    assert b.booked_by(pb.nodes[0]) == "b"
    assert base.booked_by(pa.nodes[0]) is None
    assert len(base) == 0
    # Releasing in one child leaves the other intact.
    a2 = a.without("a")
    assert all(a2.is_free(n) for n in pa.nodes)
    assert all(not a.is_free(n) for n in pa.nodes)
    c, _ = book(topo, a, Request("c", nodes=2))
    assert "c" not in {x.key for x in a.bookings()}
    assert {x.key for x in c.bookings()} == {"a", "c"}
    for u in (base, a, a2, b, c):
        check_indexes(u)


def test_double_booking_is_refused() -> None:
    topo = fleet().nvl72_racks(1).build()
    u = hold_nodes(Usage(topo), "x", rack_nodes(1, [1, 2]), topo)
    with pytest.raises(FailedPrecondition):
        hold_nodes(u, "y", rack_nodes(1, [2, 3]), topo)
    # The failed attempt changed nothing.
    assert u.is_free(rack_nodes(1, [3])[0])
    check_indexes(u)


def test_same_booking_twice_is_idempotent_and_other_content_refused() -> None:
    topo = fleet().nvl72_racks(1).build()
    b = Booking("x", tuple(rack_nodes(1, [1])), (), ("c0ffee.1",), False, "default", 4)
    u = Usage(topo).with_booking(b)
    assert u.with_booking(b) is u
    with pytest.raises(FailedPrecondition):
        u.with_booking(Booking("x", tuple(rack_nodes(1, [2])), (), ("c0ffee.1",), False, "q", 4))
    assert u.without("nope") is u


def test_unknown_node_is_not_found() -> None:
    topo = fleet().nvl72_racks(1).build()
    with pytest.raises(NotFound):
        Usage(topo).with_booking(Booking("x", ("ghost",), (), (), False, "default", 0))
    with pytest.raises(NotFound):
        Usage(topo).is_free("ghost")


def test_release_frees_every_node_and_queue_gpus() -> None:
    topo = fleet().nvl72_racks(2).build()
    u, p = book(topo, Usage(topo), Request("a", nodes=16, spares_per_domain=2, queue="q"))
    assert u.queue_gpus("q") == 18 * 4
    assert all(u.booked_by(n) == "a" for n in p.nodes + p.spares)
    u2 = u.without("a")
    assert all(u2.is_free(n) for n in p.nodes + p.spares)
    assert u2.queue_gpus("q") == 0
    check_indexes(u2)
    assert u2.whole == Usage(topo).whole


def test_unschedulable_node_is_never_free_but_may_be_booked() -> None:
    topo = fleet().nvl72_racks(1).down("gb-r01-t01").build()
    u = Usage(topo)
    assert not u.is_free("gb-r01-t01")
    u2 = hold_nodes(u, "running", ["gb-r01-t01"], topo)  # a job that was there before the drain
    assert u2.booked_by("gb-r01-t01") == "running"
    check_indexes(u2)


@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param(
            [
                NodeSpec("a", "H100", 8, "d", "r", "l", "s"),
                NodeSpec("a", "H100", 8, "e", "r", "l", "s"),
            ],
            id="duplicate-node",
        ),
        pytest.param(
            [
                NodeSpec("a", "H100", 8, "d", "r", "l", "s"),
                NodeSpec("b", "H200", 8, "d", "r", "l", "s"),
            ],
            id="domain-mixes-models",
        ),
        pytest.param(
            [
                NodeSpec("a", "H100", 8, "d", "r", "l", "s"),
                NodeSpec("b", "H100", 8, "e", "r", "l", "t"),
            ],
            id="leaf-under-two-spines",
        ),
    ],
)
def test_topology_rejects_inconsistent_input(nodes: list[NodeSpec]) -> None:
    with pytest.raises(InvalidArgument):
        Topology.build(nodes)


def test_topology_accessors() -> None:
    topo = fleet().nvl72_racks(1).hgx(1).build(generation=7)
    assert topo.generation == 7
    assert len(topo.nodes) == 19
    assert topo.is_rack_domain("c0ffee.1")
    assert not topo.is_rack_domain("hgx-h200-001")
    assert topo.domain_nodes("c0ffee.1")[0] == "gb-r01-t01"
    assert topo.leaves == ("leaf01", "leaf02")
    assert topo.spines == ("spine1",)
    with pytest.raises(NotFound):
        topo.node("ghost")
