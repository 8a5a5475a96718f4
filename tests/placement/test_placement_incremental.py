"""A scheduling pass reuses the last one's topology and bookings.

``Topology.rescheduled`` gives a new generation when only which nodes are
schedulable changed, and ``Usage.updated`` carries an overlay to new
bookings over it; both must end exactly where a fresh build would, or
placement would decide on a stale picture of the fleet.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from placement_fleet import check_indexes, fleet

from controller.placement import (
    Booking,
    Level,
    NodeSpec,
    Placement,
    Request,
    Topology,
    Usage,
    booking_for,
    place,
)

pytestmark = pytest.mark.timeout(60)


def _specs() -> list[NodeSpec]:
    return fleet().nvl72_racks(3, trays=6).hgx(8).hgx(4, model="B200").nodes()


def test_only_schedulability_changed_gives_a_rescheduled_generation() -> None:
    specs = _specs()
    topo = Topology.build(specs, generation=1)
    flipped = [
        dataclasses.replace(s, schedulable=not s.schedulable) if i % 5 == 0 else s
        for i, s in enumerate(specs)
    ]
    again = topo.rescheduled(flipped, generation=2)
    assert again is not None and again.generation == 2
    fresh = Topology.build(flipped, generation=2)
    assert again.dom_sched == fresh.dom_sched and again.dom_nodes == fresh.dom_nodes
    assert all(again.node(s.name) == s for s in flipped)
    assert topo.dom_sched != again.dom_sched  # the old generation is untouched
    moved = [dataclasses.replace(specs[0], gpus=2), *specs[1:]]
    assert topo.rescheduled(moved, generation=3) is None
    assert topo.rescheduled(specs[1:], generation=3) is None  # a node gone
    extra = dataclasses.replace(specs[-1], name="hgx-new", domain="hgx-new")
    assert topo.rescheduled([*specs, extra], generation=3) is None


def test_an_updated_overlay_matches_one_built_from_scratch() -> None:
    rng = random.Random(7)
    specs = _specs()
    topo = Topology.build(specs, generation=0)
    usage = Usage.from_bookings(topo, ())
    bookings: dict[str, Booking] = {}
    for step in range(200):
        # Some nodes change schedulability; some bookings end; new ones come.
        specs = [
            dataclasses.replace(s, schedulable=not s.schedulable) if rng.random() < 0.05 else s
            for s in specs
        ]
        moved = topo.rescheduled(specs, generation=step + 1)
        assert moved is not None
        topo = moved
        for key in [k for k in bookings if rng.random() < 0.3]:
            del bookings[key]
        usage = usage.updated(topo, bookings.values())
        check_indexes(usage)
        for _ in range(rng.randint(0, 3)):
            req = Request(
                key=f"job-{step}-{rng.random()}",
                nodes=rng.choice([1, 2, 3]),
                level=rng.choice([Level.NVLINK, Level.ANY]),
                exclusive=rng.random() < 0.2,
            )
            got = place(topo, usage, req)
            if isinstance(got, Placement):
                booking = booking_for(topo, req, got)
                bookings[booking.key] = booking
                usage = usage.with_booking(booking)
        fresh = Usage.from_bookings(topo, bookings.values())
        assert usage.bookings() == fresh.bookings()
        assert (
            usage.states() == fresh.states()
            and usage.hist == fresh.hist
            and usage.whole == fresh.whole
        )
    assert bookings, "the walk booked something"


def test_a_changed_layout_is_built_again() -> None:
    specs = _specs()
    topo = Topology.build(specs)
    usage = Usage.from_bookings(topo, ())
    bigger = Topology.build([*specs, dataclasses.replace(specs[-1], name="x", domain="x")])
    updated = usage.updated(bigger, ())
    assert updated.topology is bigger
    check_indexes(updated)


def test_a_few_nodes_rescheduled_equal_a_fresh_build() -> None:
    rng = random.Random(11)
    specs = {s.name: s for s in _specs()}
    topo = Topology.build(specs.values(), generation=0)
    for step in range(100):
        changed = []
        for name in rng.sample(sorted(specs), rng.randint(1, 4)):
            specs[name] = dataclasses.replace(specs[name], schedulable=not specs[name].schedulable)
            changed.append(specs[name])
        moved = topo.with_specs(changed, generation=step + 1)
        assert moved is not None and moved.generation == step + 1
        fresh = Topology.build(specs.values(), generation=step + 1)
        assert moved.dom_sched == fresh.dom_sched and moved.dom_nodes == fresh.dom_nodes
        assert all(moved.node(n) == s for n, s in specs.items())
        topo = moved
    first = next(iter(specs.values()))
    assert topo.with_specs([dataclasses.replace(first, gpus=first.gpus + 1)], 999) is None
    new = dataclasses.replace(first, name="hgx-new", domain="hgx-new")
    assert topo.with_specs([new], 999) is None
