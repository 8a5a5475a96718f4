"""Topology-aware, all-or-nothing gang placement.

``place(topology, usage, request, blocked=...)`` is a pure function: it reads
a frozen :class:`Topology` and a :class:`Usage` overlay and returns a
:class:`Placement` or a :class:`NoFit`. It never books anything; the caller
turns the placement into a :class:`Booking` (see :func:`booking_for`).

Phases
------
1. *Validate and shape.* The request is validated; a :class:`fill.Shape`
   captures what a domain with ``f`` free nodes offers it: ``f - spares``
   rounded down to whole segments. Exclusive requests only see domains nobody
   books; others never see domains held by an exclusive gang. ``blocked``
   nodes are subtracted from the domains they sit in (a small overlay).
2. *Levels.* A required level is the widest scope tried. A preferred level is
   tried first, then the next wider one, one level at a time, up to the
   fleet. With no GPU model given, each model is tried and the best kept;
   a gang never mixes models.
3. *One domain* (tier 0). Best fit: the domain with the fewest free nodes
   that still holds the whole gang and its spares, found through the
   ``(model, free count)`` buckets in O(max domain size), not by scanning.
   One domain always beats several.
4. *Several domains* (tiers 1..3). From the per-scope free-count histograms,
   the fewest domains ``k`` any scope within the widest allowed level needs
   (largest first is optimal for the count). Then the tightest tier (leaf,
   then spine, then fleet) holding a ``k``-domain set, and in it the scope
   and set that strand the fewest free nodes (exact branch and bound over
   the distinct free counts, :func:`fill.cheapest_fill`), ties to the scope
   with the least free capacity (best fit), then name.
5. *Materialise.* Pick concrete domains with the chosen free counts, fill
   them in order of capacity in whole segments (36 nodes in segments of 12
   on three 17-node domains become 12+12+12), take spares from each domain
   after the job nodes. Stranded GPUs = GPUs left free in the domains used.
6. *No fit.* The reason names the scope that was too small. ``permanent`` is
   set when the same search over an empty fleet (every node free and
   schedulable) would also fail: then waiting cannot help.

Rack requests follow the same phases with whole, fully schedulable, unbooked
rack domains: the tightest tier with ``K`` of them, best-fit scope first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.core.errors import InvalidArgument
from controller.placement.fill import Shape, cheapest_fill, min_domains, split_need
from controller.placement.model import TIER_NAMES, Booking, NoFit, Placement, Request
from controller.placement.topology import ANY_SCOPE, Topology
from controller.placement.usage import Usage

_EMPTY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Choice:
    """A candidate placement for one model, comparable across models."""

    rank: tuple[int, int, int, str]  # domains, tier, stranded nodes, model
    picks: tuple[tuple[int, int], ...]  # (domain id, job nodes)


class _View:
    """The usage overlay as one request sees it: minus ``blocked`` nodes."""

    def __init__(self, topo: Topology, usage: Usage, blocked: frozenset[str]) -> None:
        self.topo = topo
        self.usage = usage
        self.adj: dict[int, tuple[int, ...]] = {}
        if blocked:
            hit: dict[int, set[int]] = {}
            for n in blocked:
                loc = topo.loc.get(n)
                if loc is not None:
                    hit.setdefault(loc[0], set()).add(loc[1])
            for d, idx in hit.items():
                self.adj[d] = tuple(i for i in usage.state(d).free if i not in idx)
        self._hist_cache: dict[tuple[str, str, bool], Sequence[int]] = {}
        self._whole_cache: dict[tuple[str, str], int] = {}

    def free(self, d: int) -> tuple[int, ...]:
        got = self.adj.get(d)
        return self.usage.state(d).free if got is None else got

    def eligible(self, d: int, exclusive: bool) -> bool:
        """May the request use domain ``d`` at all (ignoring its size)?"""
        st = self.usage.state(d)
        if exclusive:
            return st.booked == 0 and d not in self.adj
        return st.exclusive == 0

    def is_whole(self, d: int) -> bool:
        t = self.topo
        st = self.usage.state(d)
        return (
            t.dom_is_rack[d]
            and st.booked == 0
            and d not in self.adj
            and len(st.free) == t.dom_cap[d]
        )

    def hist(self, m: str, scope: str, exclusive: bool) -> Sequence[int]:
        """Free-count histogram of scope for model ``m`` with blocked nodes removed."""
        base = (self.usage.phist if exclusive else self.usage.hist)[(m, scope)]
        if not self.adj:
            return base
        key = (m, scope, exclusive)
        got = self._hist_cache.get(key)
        if got is not None:
            return got
        h = list(base)
        t = self.topo
        for d, free in self.adj.items():
            if t.dom_model[d] != m or scope not in t.dom_scopes[d]:
                continue
            st = self.usage.state(d)
            counted = (st.booked == 0) if exclusive else (st.exclusive == 0)
            if counted and st.free:
                h[len(st.free)] -= 1
                if free and not exclusive:
                    h[len(free)] += 1
        self._hist_cache[key] = h
        return h

    def whole(self, m: str, scope: str) -> int:
        n = self.usage.whole[(m, scope)]
        if not self.adj:
            return n
        key = (m, scope)
        got = self._whole_cache.get(key)
        if got is None:
            t = self.topo
            state = self.usage.state
            got = n - sum(
                1
                for d in self.adj
                if t.dom_model[d] == m
                and scope in t.dom_scopes[d]
                and t.dom_is_rack[d]
                and state(d).booked == 0
                and len(state(d).free) == t.dom_cap[d]
            )
            self._whole_cache[key] = got
        return got


class _StaticView:
    """The empty fleet with every node schedulable: the 'could it ever fit' oracle."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo

    def hist(self, m: str, scope: str, exclusive: bool) -> Sequence[int]:
        return self.topo.static_hist[(m, scope)]

    def whole(self, m: str, scope: str) -> int:
        return self.topo.static_whole[(m, scope)]


def shape_of(request: Request) -> Shape:
    return Shape(
        need=request.nodes,
        racks=request.racks,
        seg=request.segment or 1,
        spares=request.spares_per_domain,
        exclusive=request.exclusive,
    )


def place(
    topology: Topology,
    usage: Usage,
    request: Request,
    *,
    blocked: frozenset[str] = _EMPTY,
) -> Placement | NoFit:
    """Place ``request`` all-or-nothing; never books, never raises for no-fit.

    Raises ``InvalidArgument`` for a malformed request, or when ``usage`` was
    built over a different topology snapshot.
    """
    request.validate()
    if usage.topology is not topology:
        raise InvalidArgument(
            f"usage overlay is for topology generation {usage.topology.generation}, "
            f"not {topology.generation}"
        )
    if request.gpu_model is not None and request.gpu_model not in topology.models:
        return NoFit(f"no {request.gpu_model} nodes in this fleet", permanent=True)
    models = (request.gpu_model,) if request.gpu_model else topology.models
    shape = shape_of(request)
    view = _View(topology, usage, blocked)
    first = request.level.tier
    tiers = (first,) if request.required else tuple(range(first, 4))
    for max_tier in tiers:
        best: _Choice | None = None
        for m in models:
            c = _search(view, m, shape, max_tier)
            if c is not None and (best is None or c.rank < best.rank):
                best = c
        if best is not None:
            return _materialise(view, shape, best)
    what = f"{request.racks} whole racks" if request.racks else f"{request.nodes} nodes"
    model = request.gpu_model or "any-model"
    static = _StaticView(topology)
    ever = any(_fits(static, m, shape, tiers[-1]) for m in models)
    where = TIER_NAMES[tiers[-1]]
    if not ever:
        return NoFit(f"{what} of {model} can never fit {where}", True)
    spare = f" with {shape.spares} spares per domain" if shape.spares else ""
    return NoFit(f"{what} of {model}{spare} do not fit {where} now", False)


def booking_for(topology: Topology, request: Request, placement: Placement) -> Booking:
    """The booking that holds ``placement`` for ``request``."""
    gpus = sum(topology.node(n).gpus for n in placement.nodes + placement.spares)
    return Booking(
        key=request.key,
        nodes=placement.nodes,
        spares=placement.spares,
        domains=placement.domains,
        exclusive=request.exclusive,
        queue=request.queue,
        gpus=gpus,
    )


# -- search ------------------------------------------------------------------


def _search(view: _View, m: str, shape: Shape, max_tier: int) -> _Choice | None:
    if shape.racks:
        return _search_racks(view, m, shape, max_tier)
    single = _best_single(view, m, shape)
    if single is not None:
        d, f = single
        stranded = (f - shape.need - shape.spares) * view.topo.dom_gpus[d]
        return _Choice((1, 0, stranded, m), ((d, shape.need),))
    if max_tier == 0:
        return None
    return _search_multi(view, m, shape, max_tier)


def _best_single(view: _View, m: str, shape: Shape) -> tuple[int, int] | None:
    """Best-fit domain (fewest free nodes that still hold the gang) and its f."""
    lo = shape.need + shape.spares
    best_d, best_f = -1, view.topo.max_size + 1
    for d, free in view.adj.items():  # domains with blocked nodes: adjusted counts
        if (
            view.topo.dom_model[d] == m
            and lo <= len(free) < best_f
            and view.eligible(d, shape.exclusive)
        ):
            best_d, best_f = d, len(free)
    buckets = view.usage.pristine if shape.exclusive else view.usage.avail
    for f in range(lo, best_f):
        for d in buckets.get((m, f), ()):
            if d not in view.adj:
                return d, f
    return (best_d, best_f) if best_d >= 0 else None


def _search_multi(view: _View, m: str, shape: Shape, max_tier: int) -> _Choice | None:
    topo = view.topo
    excl = shape.exclusive
    widest = topo.scopes_by_tier.get((m, max_tier), ())
    ks = [k for s in widest if (k := min_domains(view.hist(m, s, excl), shape)) is not None]
    if not ks:
        return None
    k = min(ks)
    for tier in range(1, max_tier + 1):
        best: tuple[int, int, str, dict[int, int]] | None = None
        for scope in topo.scopes_by_tier.get((m, tier), ()):
            h = view.hist(m, scope, excl)
            if min_domains(h, shape, k) != k:
                continue
            got = cheapest_fill(h, shape, k)
            if got is None:
                continue
            cost, picks = got
            key = (cost, sum(f * c for f, c in enumerate(h)), scope, picks)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is not None:
            cost, _, scope, picks = best
            doms = _domains_with(view, m, scope, picks, excl)
            stranded_nodes = cost - shape.need - len(doms) * shape.spares
            caps = [shape.cap(len(view.free(d))) for d in doms]
            takes = split_need(caps, shape.need)
            gpus = topo.dom_gpus[doms[0]]
            return _Choice(
                (len(doms), tier, stranded_nodes * gpus, m),
                tuple((d, t) for d, t in zip(doms, takes, strict=True)),
            )
    return None


def _domains_with(
    view: _View, m: str, scope: str, picks: Mapping[int, int], excl: bool
) -> list[int]:
    """Concrete domains of ``scope`` with the chosen free counts, largest first."""
    want = dict(picks)
    out: list[int] = []
    if scope == ANY_SCOPE:
        buckets = view.usage.pristine if excl else view.usage.avail
        candidates: list[int] = [d for d in view.adj if view.topo.dom_model[d] == m]
        for f in sorted(want, reverse=True):
            candidates.extend(sorted(d for d in buckets.get((m, f), ()) if d not in view.adj))
    else:
        candidates = list(view.topo.scope_doms[(m, scope)])
    for d in candidates:
        if not view.eligible(d, excl):
            continue
        f = len(view.free(d))
        if want.get(f):
            want[f] -= 1
            out.append(d)
            if not any(want.values()):
                break
    out.sort(key=lambda d: -len(view.free(d)))
    return out


def _search_racks(view: _View, m: str, shape: Shape, max_tier: int) -> _Choice | None:
    topo = view.topo
    first = 0 if shape.racks == 1 else 1
    for tier in range(first, max_tier + 1):
        scopes = topo.scopes_by_tier.get((m, max(tier, 1)), ())
        best: tuple[int, str] | None = None
        for scope in scopes:
            n = view.whole(m, scope)
            if n >= shape.racks and (best is None or (n, scope) < best):
                best = (n, scope)
        if best is None:
            continue
        doms = [d for d in topo.scope_doms[(m, best[1])] if view.is_whole(d)][: shape.racks]
        if len(doms) < shape.racks or shape.cap(topo.dom_cap[doms[0]]) <= 0:
            return None
        picks = tuple((d, topo.dom_cap[d] - shape.spares) for d in doms)
        return _Choice((shape.racks, tier, 0, m), picks)
    return None


def _fits(view: _StaticView, m: str, shape: Shape, max_tier: int) -> bool:
    """Could ``shape`` fit model ``m`` within ``max_tier`` on an empty fleet?"""
    topo = view.topo
    if shape.racks:
        if max_tier == 0:
            return shape.racks == 1 and view.whole(m, ANY_SCOPE) >= 1
        return any(
            view.whole(m, s) >= shape.racks for s in topo.scopes_by_tier.get((m, max_tier), ())
        )
    h = view.hist(m, ANY_SCOPE, shape.exclusive)
    if max_tier == 0:
        return any(h[f] for f in range(shape.need + shape.spares, len(h)))
    return any(
        min_domains(view.hist(m, s, shape.exclusive), shape) is not None
        for s in topo.scopes_by_tier.get((m, max_tier), ())
    )


def _materialise(view: _View, shape: Shape, choice: _Choice) -> Placement:
    topo = view.topo
    nodes: list[str] = []
    spares: list[str] = []
    domains: list[str] = []
    stranded = 0
    for d, take in choice.picks:
        free = view.free(d)
        names = topo.dom_nodes[d]
        nodes.extend(names[i] for i in free[:take])
        spares.extend(names[i] for i in free[take : take + shape.spares])
        domains.append(topo.dom_name[d])
        stranded += max(0, len(free) - take - shape.spares) * topo.dom_gpus[d]
    return Placement(tuple(nodes), tuple(spares), tuple(domains), stranded)
