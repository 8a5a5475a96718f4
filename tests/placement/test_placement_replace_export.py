"""Failed-node replacement and the Slurm / Kubernetes exports."""

from __future__ import annotations

import re

import pytest
from placement_fleet import book, fleet, hold_nodes, rack_nodes

from controller.core.errors import InvalidArgument
from controller.placement import (
    Booking,
    NodeSpec,
    NoFit,
    Request,
    Topology,
    Usage,
    booking_for,
    export_k8s_labels,
    export_slurm_topology,
    hostlist,
    place,
    replace_failed,
)


def _booked(topo: Topology, req: Request) -> tuple[Usage, Booking]:
    p = place(topo, Usage(topo), req)
    assert not isinstance(p, NoFit)
    b = booking_for(topo, req, p)
    return Usage(topo).with_booking(b), b


def test_replacement_takes_own_spare_first() -> None:
    topo = fleet().nvl72_racks(1).build()
    usage, b = _booked(topo, Request("j", nodes=16, spares_per_domain=2))
    failed = b.nodes[3]
    got = replace_failed(topo, usage, b, failed)
    assert isinstance(got, Booking)
    assert failed not in got.nodes + got.spares
    assert got.nodes[3] == b.spares[0]
    assert len(got.nodes) == 16 and len(got.spares) == 1
    assert got.gpus == b.gpus - 4
    usage.without("j").with_booking(got)  # applies cleanly, no double booking


def test_replacement_uses_free_node_in_same_domain_never_anothers() -> None:
    topo = fleet().nvl72_racks(2).build()
    usage, b = _booked(topo, Request("j", nodes=10, gpu_model="GB200"))
    dom = b.domains[0]
    r = 1 if dom == "c0ffee.1" else 2
    usage = hold_nodes(usage, "other", rack_nodes(r, range(11, 18)), topo)
    got = replace_failed(topo, usage, b, b.nodes[0])
    assert isinstance(got, Booking)
    new = set(got.nodes) - set(b.nodes)
    assert new == set(rack_nodes(r, [18]))
    assert usage.booked_by(next(iter(new))) is None
    # Nothing left (the first failed node is drained): no cross-domain replacement.
    usage2 = usage.without("j").with_booking(got)
    again = replace_failed(topo, usage2, got, got.nodes[1], blocked=frozenset([b.nodes[0]]))
    assert isinstance(again, NoFit) and not again.permanent


def test_blocked_nodes_are_not_replacements() -> None:
    topo = fleet().nvl72_racks(1).build()
    usage, b = _booked(topo, Request("j", nodes=17))
    free = [n for n in topo.nodes if usage.is_free(n)]
    got = replace_failed(topo, usage, b, b.nodes[0], blocked=frozenset(free))
    assert isinstance(got, NoFit)


def test_failed_spare_is_replenished() -> None:
    topo = fleet().nvl72_racks(1).build()
    usage, b = _booked(topo, Request("j", nodes=10, spares_per_domain=2))
    got = replace_failed(topo, usage, b, b.spares[0])
    assert isinstance(got, Booking)
    assert got.nodes == b.nodes
    assert len(got.spares) == 2 and b.spares[0] not in got.spares


def test_node_outside_booking_is_an_error() -> None:
    topo = fleet().nvl72_racks(1).build()
    usage, b = _booked(topo, Request("j", nodes=2))
    with pytest.raises(InvalidArgument):
        replace_failed(topo, usage, b, "gb-r01-t18")


@pytest.mark.parametrize(
    ("names", "want"),
    [
        pytest.param(["n01", "n02", "n03"], "n[01-03]", id="range"),
        pytest.param(["n1", "n3", "n2", "n7"], "n[1-3,7]", id="gap"),
        pytest.param(["n05"], "n05", id="single"),
        pytest.param(["login", "n01", "n02"], "login,n[01-02]", id="plain-name"),
        pytest.param(["a9", "a10"], "a10,a9", id="different-widths"),
        pytest.param(
            [f"gb200-r01-t{i:02d}" for i in range(1, 19)], "gb200-r01-t[01-18]", id="nvl72-rack"
        ),
    ],
)
def test_hostlist(names: list[str], want: str) -> None:
    assert hostlist(names) == want


def test_slurm_topology_has_one_block_per_domain() -> None:
    topo = fleet().nvl72_racks(2).hgx(2).build(generation=3)
    conf = export_slurm_topology(topo)
    blocks = [ln for ln in conf.splitlines() if ln.startswith("BlockName=")]
    assert blocks[0] == "BlockName=c0ffee.1 Nodes=gb-r01-t[01-18]"
    assert len(blocks) == 4
    assert "BlockSizes=18,36,72" in conf.splitlines()
    assert "generation 3" in conf


def test_k8s_labels_are_valid_values() -> None:
    specs = [
        NodeSpec(f"t{i}", "GB200", 4, "8f6c2a1e-uuid.7", "rack/01", "leaf 1", "s1")
        for i in range(2)
    ] + [NodeSpec("box", "H100", 8, "box", "r2", "leaf 1", "s1")]
    labels = export_k8s_labels(Topology.build(specs))
    assert labels["t0"]["nvidia.com/gpu.clique"] == "8f6c2a1e-uuid.7"
    assert labels["t0"]["kiln.dev/rack"] == "rack-01"
    assert labels["t0"]["kiln.dev/leaf"] == "leaf-1"
    assert labels["t0"]["kiln.dev/nvlink-domain"] == "8f6c2a1e-uuid.7"
    assert "nvidia.com/gpu.clique" not in labels["box"]
    valid = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
    assert all(valid.match(v) for node in labels.values() for v in node.values())


def test_book_helper_roundtrip() -> None:
    topo = fleet().nvl72_racks(1).build()
    u, p = book(topo, Usage(topo), Request("a", nodes=3))
    assert u.booking("a") is not None and u.booking("a").nodes == p.nodes  # type: ignore[union-attr]
