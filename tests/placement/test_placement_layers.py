"""The copy-on-write layers that keep a scheduling pass from costing the
fleet's size: ``LayeredSet`` (a ``Usage`` bucket of domains) and
``SpecLayers`` (a topology generation's node specs). Each must read exactly
as the plain set or dict it stands for, through folds, and a copy must
never see its origin's later changes, nor the origin the copy's."""

from __future__ import annotations

import dataclasses
import random

import pytest
from placement_fleet import check_indexes, fleet, hold_nodes

from controller.placement import Topology, Usage
from controller.placement.layered_set import LayeredSet

pytestmark = pytest.mark.timeout(60)


def test_a_layered_set_reads_as_the_plain_set_through_copies_and_folds() -> None:
    rng = random.Random(5)
    sets = [(LayeredSet(range(0, 400, 3)), set(range(0, 400, 3)))]
    origin = sets[0][0]._base
    for _ in range(3000):
        # Mostly the newest set, so that changes pile up past a fold.
        i = len(sets) - 1 if rng.random() < 0.8 else rng.randrange(len(sets))
        layered, plain = sets[i]
        op = rng.random()
        d = rng.randrange(450)
        if op < 0.6:
            layered.add(d)
            plain.add(d)
        elif op < 0.97:
            layered.discard(d)
            plain.discard(d)
        else:
            sets.append((layered.copy(), set(plain)))
        for layered, plain in sets:
            assert len(layered) == len(plain)
        assert (d in layered) == (d in plain)
    for layered, plain in sets:
        assert layered == plain and set(layered) == plain
        assert sorted(layered) == sorted(plain)  # iteration gives each id once
    folded = sum(layered._base is not origin for layered, _ in sets)
    assert len(sets) > 50 and folded, "the run never folded a layer"


def test_a_copy_of_a_big_set_costs_its_changes_not_its_size() -> None:
    big = LayeredSet(range(100_000))
    big.discard(7)
    big.add(100_001)
    copy = big.copy()
    assert copy._base is big._base  # shared, not copied
    copy.discard(8)
    assert 8 in big and 8 not in copy and 7 not in copy and 100_001 in copy


def test_topology_generations_share_specs_and_track_what_changed() -> None:
    """Many generations, each a few nodes rescheduled, on a fleet big enough
    for the spec layers to fold: every generation reads as a fresh build,
    and ``changed_domains`` against its parent (the short way) and against
    an older generation (the scan) both name exactly the changed domains."""
    rng = random.Random(3)
    specs = {s.name: s for s in fleet().nvl72_racks(40, trays=18).hgx(600).nodes()}
    topo = Topology.build(specs.values(), generation=0)
    first = topo
    for step in range(1, 300):
        changed = []
        for name in rng.sample(sorted(specs), rng.randint(1, 6)):
            specs[name] = dataclasses.replace(specs[name], schedulable=not specs[name].schedulable)
            changed.append(specs[name])
        moved = topo.with_specs(changed, generation=step)
        assert moved is not None
        fresh = Topology.build(specs.values(), generation=step)
        assert moved.dom_sched == fresh.dom_sched
        want = [d for d in range(len(fresh.dom_name)) if moved.dom_sched[d] != topo.dom_sched[d]]
        assert moved.changed_domains(topo) == want
        older = [d for d in range(len(fresh.dom_name)) if moved.dom_sched[d] != first.dom_sched[d]]
        assert moved.changed_domains(first) == older
        topo = moved
    assert all(topo.node(n) == s for n, s in specs.items())
    assert len(topo._spec) == len(specs) and set(topo._spec) == set(specs)
    assert topo._spec._over != {} or topo._spec._base is not first._spec._base
    assert first._spec._base is not topo._spec._base, "1,000+ changes never folded the specs"


def test_an_older_overlay_is_untouched_by_its_successors() -> None:
    """Bookings taken and released across many overlays (enough for the
    buckets to fold): each overlay's indexes match a fresh build, and one
    kept from the start still holds exactly what it held."""
    topo = fleet().nvl72_racks(4, trays=18).hgx(400).build()
    names = list(topo.nodes)
    rng = random.Random(9)
    kept = hold_nodes(Usage.from_bookings(topo, []), "k0", names[:3], topo)
    kept_avail = {k: set(v) for k, v in kept.avail.items()}
    kept_states = kept.states()
    u = kept
    held: list[str] = []
    for step in range(400):
        if held and rng.random() < 0.45:
            u = u.without(held.pop(rng.randrange(len(held))))
        else:
            free = [n for n in rng.sample(names, 3) if u.is_free(n)]
            if free:
                key = f"j{step}"
                u = hold_nodes(u, key, free[:1], topo)
                held.append(key)
        if step % 40 == 0:
            check_indexes(u)
    check_indexes(u)
    check_indexes(kept)
    assert {k: set(v) for k, v in kept.avail.items()} == kept_avail
    assert kept.states() == kept_states
    assert [b.key for b in kept.bookings()] == ["k0"]


def test_sibling_overlays_never_see_each_others_domain_changes() -> None:
    """Two overlays made from one parent change domains that share a chunk
    of per-domain state: each sees its own change only, the parent neither."""
    topo = fleet().hgx(200).build()  # a domain per box: many domains to a chunk
    names = list(topo.nodes)
    parent = hold_nodes(Usage.from_bookings(topo, []), "p", names[:1], topo)
    left = hold_nodes(parent, "left", names[1:2], topo)
    right = hold_nodes(parent, "right", names[2:3], topo)
    assert topo.loc[names[1]][0] // 64 == topo.loc[names[2]][0] // 64  # one chunk
    assert [parent.booked_by(n) for n in names[:3]] == ["p", None, None]
    assert [left.booked_by(n) for n in names[:3]] == ["p", "left", None]
    assert [right.booked_by(n) for n in names[:3]] == ["p", None, "right"]
    for u in (parent, left, right):
        check_indexes(u)
