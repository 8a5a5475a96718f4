"""Reservations for a head-of-queue gang that does not fit yet.

When the highest-priority waiting request cannot be placed, the scheduler
plans where it *will* go once running gangs release their nodes, and holds
the free nodes of that plan so that a stream of small requests cannot keep
nibbling at them (the starvation Slurm's backfill and Kueue's StrictFIFO
address).

Plan: every domain counts with its full schedulable size (bookings end); among
domain sets that would hold the gang in the tightest allowed scope, choose the
one with the most nodes free *now*, so the gang starts as early as possible
and holding costs others the least. Pure and O(domains of the model).
"""

from __future__ import annotations

from controller.placement.engine import shape_of
from controller.placement.fill import Shape, split_need
from controller.placement.model import Request
from controller.placement.topology import Topology
from controller.placement.usage import Usage


def plan_hold(
    topology: Topology, usage: Usage, request: Request, blocked: frozenset[str]
) -> tuple[str, ...]:
    """Free nodes to hold for ``request`` (sorted); () if it can never fit."""
    shape = shape_of(request)
    models = (request.gpu_model,) if request.gpu_model else topology.models
    first = request.level.tier
    tiers = (first,) if request.required else tuple(range(first, 4))
    for max_tier in tiers:
        best: tuple[int, int, list[tuple[int, int]]] | None = None
        for m in models:
            if m not in topology.models:
                continue
            got = _plan(topology, usage, blocked, m, shape, max_tier)
            if got is not None and (best is None or got[:2] > best[:2]):
                best = got
        if best is not None:
            out: list[str] = []
            for d, count in best[2]:
                names = topology.dom_nodes[d]
                out.extend(names[i] for i in _free(topology, usage, blocked, d)[:count])
            return tuple(sorted(out))
    return ()


def _free(topo: Topology, usage: Usage, blocked: frozenset[str], d: int) -> tuple[int, ...]:
    free = usage.state(d).free
    if not blocked:
        return free
    names = topo.dom_nodes[d]
    return tuple(i for i in free if names[i] not in blocked)


def _plan(
    topo: Topology,
    usage: Usage,
    blocked: frozenset[str],
    m: str,
    shape: Shape,
    max_tier: int,
) -> tuple[int, int, list[tuple[int, int]]] | None:
    """(free now, -domains, [(domain, nodes to hold)]) of the best plan, or None."""
    if shape.racks:
        return _plan_racks(topo, usage, blocked, m, shape, max_tier)
    scope_all = topo.scope_doms[(m, "any")]
    best_single: tuple[int, int, int] | None = None
    for d in scope_all:
        size = len(topo.dom_sched[d])
        if shape.cap(size) < shape.need:
            continue
        now = _now(topo, usage, blocked, d, shape.exclusive)
        key = (now, -size, -d)
        if best_single is None or key > best_single:
            best_single = key
    if best_single is not None:
        now, _, neg_d = best_single
        d = -neg_d
        hold = now if shape.exclusive else min(now, shape.need + shape.spares)
        return hold, -1, [(d, hold)]
    for tier in range(1, max_tier + 1):
        best: tuple[int, int, list[tuple[int, int]]] | None = None
        for scope in topo.scopes_by_tier.get((m, tier), ()):
            doms = sorted(
                topo.scope_doms[(m, scope)],
                key=lambda d: (
                    -_now(topo, usage, blocked, d, shape.exclusive),
                    -len(topo.dom_sched[d]),
                    d,
                ),
            )
            chosen: list[int] = []
            covered = 0
            for d in doms:
                cap = shape.cap(len(topo.dom_sched[d]))
                if cap <= 0:
                    continue
                chosen.append(d)
                covered += cap
                if covered >= shape.need:
                    break
            if covered < shape.need:
                continue
            takes = split_need([shape.cap(len(topo.dom_sched[d])) for d in chosen], shape.need)
            plan = []
            total = 0
            for d, take in zip(chosen, takes, strict=True):
                now = _now(topo, usage, blocked, d, shape.exclusive)
                hold = now if shape.exclusive else min(now, take + shape.spares)
                plan.append((d, hold))
                total += hold
            cand = (total, -len(chosen), plan)
            if best is None or cand[:2] > best[:2]:
                best = cand
        if best is not None:
            return best
    return None


def _plan_racks(
    topo: Topology,
    usage: Usage,
    blocked: frozenset[str],
    m: str,
    shape: Shape,
    max_tier: int,
) -> tuple[int, int, list[tuple[int, int]]] | None:
    if max_tier == 0 and shape.racks > 1:
        return None
    for tier in range(1, max(max_tier, 1) + 1):
        best: tuple[int, int, list[tuple[int, int]]] | None = None
        for scope in topo.scopes_by_tier.get((m, tier), ()):
            racks = [d for d in topo.scope_doms[(m, scope)] if topo.dom_is_rack[d]]
            if len(racks) < shape.racks:
                continue
            racks.sort(key=lambda d: (-_now(topo, usage, blocked, d, True), d))
            plan = [(d, _now(topo, usage, blocked, d, True)) for d in racks[: shape.racks]]
            cand = (sum(h for _, h in plan), -shape.racks, plan)
            if best is None or cand[:2] > best[:2]:
                best = cand
        if best is not None:
            return best
    return None


def _now(topo: Topology, usage: Usage, blocked: frozenset[str], d: int, exclusive: bool) -> int:
    """Nodes of domain ``d`` free now (0 while another gang holds it exclusively)."""
    st = usage.state(d)
    if st.exclusive and not exclusive:
        return 0
    return len(_free(topo, usage, blocked, d))
