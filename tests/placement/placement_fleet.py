"""Small fleet builders for placement tests: ``fleet().nvl72_racks(2).hgx(4)``."""

from __future__ import annotations

from collections.abc import Iterable

from controller.placement import Booking, NodeSpec, Request, Topology, Usage, booking_for, place
from controller.placement.model import Placement


class FleetBuilder:
    """Builds NodeSpecs: racks are NVLink domains, HGX boxes their own domain."""

    def __init__(self) -> None:
        self.specs: list[NodeSpec] = []
        self._racks = 0
        self._boxes = 0
        self._leaves = 0
        self._down: set[str] = set()

    def _leaf(self, leaf: str | None) -> str:
        if leaf is not None:
            return leaf
        self._leaves += 1
        return f"leaf{self._leaves:02d}"

    def rack(
        self,
        trays: int = 18,
        *,
        model: str = "GB200",
        gpus: int = 4,
        leaf: str | None = None,
        spine: str = "spine1",
    ) -> FleetBuilder:
        """One NVLink rack domain of ``trays`` nodes (its own leaf unless given)."""
        self._racks += 1
        r = self._racks
        leaf_name = self._leaf(leaf)
        for t in range(1, trays + 1):
            self.specs.append(
                NodeSpec(
                    name=f"gb-r{r:02d}-t{t:02d}",
                    gpu_model=model,
                    gpus=gpus,
                    domain=f"c0ffee.{r}",
                    rack=f"r{r:02d}",
                    leaf=leaf_name,
                    spine=spine,
                )
            )
        return self

    def nvl72_racks(
        self,
        n: int,
        *,
        trays: int = 18,
        leaf: str | None = None,
        spine: str = "spine1",
        model: str = "GB200",
    ) -> FleetBuilder:
        """``n`` racks sharing one leaf (a fresh one unless given)."""
        leaf_name = self._leaf(leaf)
        for _ in range(n):
            self.rack(trays, leaf=leaf_name, spine=spine, model=model)
        return self

    def hgx(
        self, n: int, *, model: str = "H200", leaf: str | None = None, spine: str = "spine1"
    ) -> FleetBuilder:
        """``n`` 8-GPU HGX boxes on one leaf (a fresh one unless given)."""
        leaf_name = self._leaf(leaf)
        for _ in range(n):
            self._boxes += 1
            name = f"hgx-{model.lower()}-{self._boxes:03d}"
            self.specs.append(
                NodeSpec(
                    name=name,
                    gpu_model=model,
                    gpus=8,
                    domain=name,
                    rack=f"hr{self._boxes:03d}",
                    leaf=leaf_name,
                    spine=spine,
                )
            )
        return self

    def down(self, *names: str) -> FleetBuilder:
        """Mark nodes unschedulable."""
        self._down.update(names)
        return self

    def nodes(self) -> list[NodeSpec]:
        from dataclasses import replace

        return [replace(s, schedulable=False) if s.name in self._down else s for s in self.specs]

    def build(self, generation: int = 0) -> Topology:
        return Topology.build(self.nodes(), generation)


def fleet() -> FleetBuilder:
    return FleetBuilder()


def rack_nodes(r: int, trays: Iterable[int]) -> list[str]:
    return [f"gb-r{r:02d}-t{t:02d}" for t in trays]


def book(topo: Topology, usage: Usage, req: Request) -> tuple[Usage, Placement]:
    """Place and book ``req``; fails the test if it does not fit."""
    got = place(topo, usage, req)
    assert isinstance(got, Placement), got
    return usage.with_booking(booking_for(topo, req, got)), got


def hold_nodes(usage: Usage, key: str, nodes: Iterable[str], topo: Topology) -> Usage:
    """Book arbitrary nodes for ``key`` (a stand-in for some running job)."""
    names = tuple(nodes)
    doms = tuple(sorted({topo.node(n).domain for n in names}))
    gpus = sum(topo.node(n).gpus for n in names)
    return usage.with_booking(Booking(key, names, (), doms, False, "default", gpus))


def check_indexes(u: Usage) -> None:
    """Recompute every index of ``u`` from its owners and compare."""
    t = u.topology
    fresh = Usage.from_bookings(t, u.bookings())
    assert u.states() == fresh.states()
    assert {k: v for k, v in u.avail.items() if v} == {k: v for k, v in fresh.avail.items() if v}
    assert {k: v for k, v in u.pristine.items() if v} == {
        k: v for k, v in fresh.pristine.items() if v
    }
    assert u.hist == fresh.hist
    assert u.phist == fresh.phist
    assert u.whole == fresh.whole
    for d, st in enumerate(u.states()):
        owners = [u.booked_by(n) for n in t.dom_nodes[d]]
        assert list(st.owners) == owners
        free = [i for i in t.dom_sched[d] if owners[i] is None]
        assert list(st.free) == free
    # Brute force over nodes: fleet-wide histograms and whole racks.
    for m in t.models:
        hist = [0] * (t.max_size + 1)
        whole = 0
        for d, names in enumerate(t.dom_nodes):
            if t.dom_model[d] != m:
                continue
            owners = [u.booked_by(n) for n in names]
            free = sum(1 for n in names if u.is_free(n))
            excl = any(o is not None and u.booking(o).exclusive for o in owners)  # type: ignore[union-attr]
            if free and not excl:
                hist[free] += 1
            if t.dom_is_rack[d] and free == len(names):
                whole += 1
        assert u.hist[(m, "any")] == hist
        assert u.whole[(m, "any")] == whole
