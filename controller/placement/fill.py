"""Counting helpers over free-count histograms (pure arithmetic, no topology).

A histogram ``h`` maps a free-node count ``f`` (its index) to how many
domains of a scope have exactly ``f`` free nodes. A request shape turns ``f``
into the capacity a domain offers that request (``Shape.cap``): nodes left
after its spares, rounded down to whole segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Upper bound on search steps of `cheapest_fill`; past it the best set found
# so far is used (the greedy set is always found first, so the result is
# never worse than greedy).
MAX_STEPS = 4000


@dataclass(frozen=True)
class Shape:
    """The parts of a request that decide what a domain can offer it."""

    need: int  # job nodes (node requests)
    racks: int  # whole racks (rack requests)
    seg: int  # chunk size; 1 when the request has no segment
    spares: int  # hot spares held in every domain used
    exclusive: bool

    def cap(self, f: int) -> int:
        """Job nodes a domain with ``f`` free nodes can take for this shape."""
        c = f - self.spares
        if c < self.seg:
            return 0
        return c - c % self.seg


def min_domains(h: Sequence[int], shape: Shape, limit: int = 1 << 30) -> int | None:
    """Fewest domains of histogram ``h`` that hold ``shape.need`` nodes, or None.

    Taking the domains with the largest capacity first is optimal for the
    count, because capacity never decreases as ``f`` grows. Returns None as
    soon as more than ``limit`` domains would be needed.
    """
    rem = shape.need
    k = 0
    for f in range(len(h) - 1, 0, -1):
        c = h[f]
        if not c:
            continue
        cap = shape.cap(f)
        if cap <= 0:
            break
        q = -(-rem // cap)
        if q <= c:
            return k + q
        k += c
        if k >= limit:
            return None
        rem -= c * cap
    return None


def cheapest_fill(h: Sequence[int], shape: Shape, k: int) -> tuple[int, dict[int, int]] | None:
    """Choose exactly ``k`` domains holding ``shape.need`` nodes, fewest free nodes.

    Returns ``(sum of f over the chosen domains, {f: how many})``. Minimising
    the sum of free counts minimises the nodes left stranded in the chosen
    domains, since the nodes used (``need + k * spares``) are fixed. A small
    branch-and-bound over the distinct free counts; bounded by ``MAX_STEPS``.
    """
    items = [(f, shape.cap(f), h[f]) for f in range(len(h) - 1, 0, -1) if h[f]]
    items = [it for it in items if it[1] > 0]
    if not items:
        return None
    best: list[object] = [None, None]
    steps = [0]
    lower = shape.need + k * shape.spares  # no set can cost less than this

    def cover(i: int, r: int) -> int:
        total = 0
        for _, cap, cnt in items[i:]:
            n = cnt if cnt < r else r
            total += n * cap
            r -= n
            if not r:
                break
        return total

    def dfs(i: int, r: int, rem: int, cost: int, picks: dict[int, int]) -> bool:
        steps[0] += 1
        if rem <= 0:
            if best[0] is None or cost < best[0]:  # type: ignore[operator]
                best[0], best[1] = cost, dict(picks)
            return cost <= lower
        if r == 0 or i == len(items) or steps[0] > MAX_STEPS:
            return False
        if cover(i, r) < rem:
            return False
        if best[0] is not None and cost + r * items[-1][0] >= best[0]:  # type: ignore[operator]
            return False
        f, cap, cnt = items[i]
        for n in range(min(cnt, r), -1, -1):
            if n:
                picks[f] = n
            else:
                picks.pop(f, None)
            if dfs(i + 1, r - n, rem - n * cap, cost + n * f, picks):
                return True
        picks.pop(f, None)
        return False

    dfs(0, k, shape.need, 0, {})
    if best[1] is None:
        return None
    picks = best[1]
    assert isinstance(picks, dict) and isinstance(best[0], int)
    return best[0], picks


def split_need(caps: Sequence[int], need: int) -> list[int]:
    """Job nodes per domain: fill domains in the given order up to their caps.

    ``caps`` are multiples of the segment and ``need`` is too, so every share
    is a whole number of segments.
    """
    out = []
    rem = need
    for cap in caps:
        take = cap if cap < rem else rem
        out.append(take)
        rem -= take
    return out
