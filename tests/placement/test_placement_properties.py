"""Property tests: random fleets and submit/release/fail interleavings.

Invariants checked after every step: no node in two bookings, no partial
gang, every released node free again, spares never handed to another job,
replacement never double-books, required levels respected, the fewest
domains for plain node requests (checked by brute force over nodes), and the
usage indexes equal to a recomputation from scratch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_fleet import FleetBuilder, check_indexes

from controller.placement import (
    Booking,
    Level,
    NoFit,
    Placement,
    QueueConfig,
    Request,
    Topology,
    Usage,
    booking_for,
    place,
    replace_failed,
    schedule,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    b = FleetBuilder()
    for spine in ("s1", "s2")[: draw(st.integers(1, 2))]:
        for li in range(draw(st.integers(1, 2))):
            leaf = f"{spine}-l{li}"
            for _ in range(draw(st.integers(0, 3))):
                b.rack(draw(st.integers(2, 6)), leaf=leaf, spine=spine)
            boxes = draw(st.integers(0, 3))
            if boxes:
                b.hgx(boxes, model=draw(st.sampled_from(["H200", "H100"])), leaf=leaf, spine=spine)
    if not b.specs:
        b.rack(4)
    names = [s.name for s in b.specs]
    down = draw(st.lists(st.sampled_from(names), max_size=3))
    b.down(*down)
    return b.build()


@st.composite
def requests(draw: st.DrawFn, key: str) -> Request:
    if draw(st.integers(0, 9)) == 0:
        return Request(key, racks=draw(st.integers(1, 2)), gpu_model="GB200")
    seg = draw(st.sampled_from([0, 0, 0, 2, 3]))
    n = draw(st.integers(1, 8))
    if seg:
        n *= seg
    return Request(
        key,
        nodes=n,
        gpu_model=draw(st.sampled_from([None, "GB200", "GB200", "H200"])),
        level=draw(st.sampled_from(list(Level))),
        required=draw(st.booleans()),
        segment=seg,
        spares_per_domain=draw(st.sampled_from([0, 0, 1])),
        exclusive=draw(st.integers(0, 5)) == 0,
    )


def check_placement(topo: Topology, usage: Usage, req: Request, p: Placement) -> None:
    everything = p.nodes + p.spares
    assert len(set(everything)) == len(everything)
    for n in everything:
        assert usage.is_free(n), f"{n} was not free"
    per = Counter(topo.node(n).domain for n in p.nodes)
    assert set(per) == set(p.domains) == {topo.node(n).domain for n in everything}
    assert len({topo.node(n).gpu_model for n in everything}) == 1
    if req.gpu_model:
        assert topo.node(p.nodes[0]).gpu_model == req.gpu_model
    assert len(p.spares) == req.spares_per_domain * len(p.domains)
    if req.racks:
        assert len(p.domains) == req.racks
        for d in p.domains:
            assert all(usage.is_free(n) for n in topo.domain_nodes(d))
    else:
        assert len(p.nodes) == req.nodes
    if req.segment:
        assert all(v % req.segment == 0 for v in per.values())
    if req.required:
        if req.level is Level.NVLINK:
            assert len(p.domains) == 1
        if req.level is Level.LEAF:
            assert len({topo.node(n).leaf for n in everything}) == 1
        if req.level is Level.SPINE:
            assert len({topo.node(n).spine for n in everything}) == 1
    for d in p.domains:
        others = usage.domain_keys(d)
        if req.exclusive:
            assert not others
        for k in others:
            assert not usage.booking(k).exclusive  # type: ignore[union-attr]


def brute_min_domains(topo: Topology, usage: Usage, req: Request) -> int | None:
    """Fewest domains for a plain any-level request, from node-by-node counts."""
    caps = []
    for d in topo.domains:
        names = topo.domain_nodes(d)
        if topo.node(names[0]).gpu_model != req.gpu_model:
            continue
        if any(
            k is not None and usage.booking(k).exclusive  # type: ignore[union-attr]
            for k in (usage.booked_by(n) for n in names)
        ):
            continue
        caps.append(sum(1 for n in names if usage.is_free(n)))
    caps.sort(reverse=True)
    total = 0
    for k, c in enumerate(caps, start=1):
        total += c
        if total >= req.nodes:
            return k
    return None


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Topology, list[tuple[str, int, Request | None]]]:
    topo = draw(topologies())
    ops: list[tuple[str, int, Request | None]] = []
    for i in range(draw(st.integers(5, 25))):
        kind = draw(st.sampled_from(["submit", "submit", "submit", "release", "fail"]))
        req = draw(requests(f"j{i}")) if kind == "submit" else None
        ops.append((kind, draw(st.integers(0, 1000)), req))
    return topo, ops


@SETTINGS
@given(scenarios())
def test_random_interleavings_keep_invariants(
    scenario: tuple[Topology, list[tuple[str, int, Request | None]]],
) -> None:
    topo, ops = scenario
    usage = Usage(topo)
    drained: set[str] = set()
    for kind, pick, req in ops:
        keys = sorted(b.key for b in usage.bookings())
        if kind == "submit":
            assert req is not None
            got = place(topo, usage, req, blocked=frozenset(drained))
            if isinstance(got, Placement):
                check_placement(topo, usage, req, got)
                assert not set(got.nodes + got.spares) & drained
                plain = req.nodes and not req.exclusive and not req.segment
                if plain and req.gpu_model and not req.spares_per_domain and not drained:
                    if req.level is Level.ANY:
                        assert len(got.domains) == brute_min_domains(topo, usage, req)
                usage = usage.with_booking(booking_for(topo, req, got))
            else:
                assert isinstance(got, NoFit) and got.reason
                if got.permanent:
                    assert isinstance(place(topo, Usage(topo), req), NoFit)
                elif (
                    req.nodes
                    and req.gpu_model
                    and req.level is Level.ANY
                    and not (req.exclusive or req.segment or req.spares_per_domain or drained)
                ):
                    assert brute_min_domains(topo, usage, req) is None
        elif kind == "release" and keys:
            b = usage.booking(keys[pick % len(keys)])
            assert b is not None
            usage = usage.without(b.key)
            for n in b.all_nodes:
                assert usage.booked_by(n) is None
                assert usage.is_free(n) == (topo.node(n).schedulable and n not in drained) or (
                    n in drained
                )
        elif kind == "fail" and keys:
            b = usage.booking(keys[pick % len(keys)])
            assert b is not None
            failed = b.all_nodes[pick % len(b.all_nodes)]
            drained.add(failed)
            got_b = replace_failed(topo, usage, b, failed, blocked=frozenset(drained))
            if isinstance(got_b, Booking):
                fresh = set(got_b.all_nodes) - set(b.all_nodes)
                for n in fresh:
                    assert usage.booked_by(n) is None
                    assert topo.node(n).domain == topo.node(failed).domain
                    assert n not in drained
                assert failed not in got_b.all_nodes
                usage = usage.without(b.key).with_booking(got_b)  # raises if double-booked
            else:
                assert isinstance(got_b, NoFit)
        owners: dict[str, str] = {}
        for b in usage.bookings():
            for n in b.all_nodes:
                assert n not in owners, f"{n} in {owners.get(n)} and {b.key}"
                owners[n] = b.key
        check_indexes(usage)


@SETTINGS
@given(topologies(), st.data())
def test_schedule_respects_holds_and_quotas(topo: Topology, data: st.DataObject) -> None:
    reqs = []
    for i in range(data.draw(st.integers(1, 12))):
        r = data.draw(requests(f"p{i}"))
        prio = data.draw(st.integers(0, 2))
        queue = data.draw(st.sampled_from(["a", "b"]))
        reqs.append(replace(r, priority=prio, submitted=i, queue=queue))
    queues = [QueueConfig("a", gpu_quota=48, borrowing_limit=16), QueueConfig("b", gpu_quota=64)]
    res = schedule(topo, Usage(topo), reqs, queues)
    assert set(res.admitted) | set(res.waiting) | set(res.rejected) == {r.key for r in reqs}
    assert len(res.held) <= 1
    held = {n for nodes in res.held.values() for n in nodes}
    for key in res.held:
        assert key in res.waiting
    seen: set[str] = set()
    by_key = {r.key: r for r in reqs}
    for key, p in res.admitted.items():
        nodes = set(p.nodes + p.spares)
        assert not nodes & seen
        assert not nodes & held  # earlier gangs booked theirs first; later ones avoid holds
        seen |= nodes
        check_placement(topo, Usage(topo), by_key[key], p)
    assert res.usage is not None
    for q in queues:
        assert q.gpu_quota is not None
        assert res.usage.queue_gpus(q.name) <= q.gpu_quota + q.borrowing_limit
    check_indexes(res.usage)
