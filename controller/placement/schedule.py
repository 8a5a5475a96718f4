"""One scheduling cycle over the pending requests: order, quotas, holds.

Phases of :func:`schedule`:

1. *Order.* Priority descending, then ``submitted`` ascending (FIFO), then
   key. Malformed requests, duplicate keys and unknown queues are rejected.
   A key that ``usage`` already holds is reported admitted with its existing
   nodes and is not booked again (idempotent submission).
2. *Place.* Each request goes through :func:`place` against the overlay
   built so far, with the held nodes blocked. A placement is admitted when
   its queue's quota allows, and booked into the running overlay.
3. *Quota.* A queue with ``gpu_quota`` Q and ``borrowing_limit`` B may hold
   up to Q GPUs, and up to Q+B by borrowing from the unused quota of other
   queues (unused = quota minus what they hold, minus what others already
   borrow). Queues with no quota are unlimited and lend nothing. A request
   that alone needs more than Q+B is rejected; one that would exceed the
   quota now waits, and holds nothing.
4. *Hold.* The first (highest-priority) request that does not fit but could
   fit once capacity frees gets a reservation (:func:`plan_hold`): the free
   nodes of its planned domains are returned in ``held`` and blocked for
   every later request in this cycle, so small gangs cannot starve it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.core.errors import InvalidArgument
from controller.placement.engine import booking_for, place
from controller.placement.hold import plan_hold
from controller.placement.model import Booking, NoFit, Placement, QueueConfig, Request
from controller.placement.topology import Topology
from controller.placement.usage import Usage


@dataclass
class ScheduleResult:
    """Outcome of one cycle. ``usage`` is the input overlay plus the new bookings."""

    admitted: dict[str, Placement] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bookings: dict[str, Booking] = field(default_factory=dict)
    usage: Usage | None = None


def schedule(
    topology: Topology,
    usage: Usage,
    pending: Sequence[Request],
    queues: Sequence[QueueConfig] = (),
) -> ScheduleResult:
    """Admit what fits, in order, within quotas, without starving the head.

    Pure: returns decisions and the resulting overlay; books nothing outside.
    With ``queues`` empty every queue is unlimited; otherwise a request naming
    an unlisted queue is rejected.
    """
    qcfg = {q.name: q for q in queues}
    out = ScheduleResult()
    cur = usage
    held: set[str] = set()
    seen: set[str] = set()
    order = sorted(pending, key=lambda r: (-r.priority, r.submitted, r.key))
    for r in order:
        try:
            r.validate()
        except InvalidArgument as e:
            out.rejected[r.key or "<empty>"] = str(e)
            continue
        if r.key in seen:
            out.rejected[r.key] = f"request {r.key!r} appears twice in one cycle"
            continue
        seen.add(r.key)
        existing = cur.booking(r.key)
        if existing is not None:
            out.admitted[r.key] = Placement(existing.nodes, existing.spares, existing.domains, 0)
            out.bookings[r.key] = existing
            continue
        if qcfg and r.queue not in qcfg:
            out.rejected[r.key] = f"unknown queue {r.queue!r}"
            continue
        q = qcfg.get(r.queue)
        limited = q is not None and q.gpu_quota is not None
        low = _min_gpus(topology, r) if limited else 0
        refused = _quota_refusal(qcfg, cur, r.queue, low) if limited else None
        if refused is not None and refused[1]:
            out.rejected[r.key] = refused[0]
            continue
        res = place(topology, cur, r, blocked=frozenset(held))
        if isinstance(res, NoFit):
            if res.permanent:
                out.rejected[r.key] = res.reason
                continue
            if refused is not None:
                out.waiting[r.key] = refused[0]
                continue
            out.waiting[r.key] = res.reason
            if not out.held:
                hold = plan_hold(topology, cur, r, frozenset(held))
                if hold:
                    out.held[r.key] = hold
                    held.update(hold)
            continue
        b = booking_for(topology, r, res)
        refused = _quota_refusal(qcfg, cur, r.queue, b.gpus)
        if refused is not None:
            (out.rejected if refused[1] else out.waiting)[r.key] = refused[0]
            continue
        cur = cur.with_booking(b)
        out.admitted[r.key] = res
        out.bookings[r.key] = b
    out.usage = cur
    return out


def _min_gpus(topology: Topology, r: Request) -> int:
    """A lower bound of the GPUs ``r`` will book (for an early quota check)."""
    models = (r.gpu_model,) if r.gpu_model else topology.models
    per_node = [g for d, g in enumerate(topology.dom_gpus) if topology.dom_model[d] in models]
    if not per_node:
        return 0
    if r.racks:
        racks = [
            topology.dom_gpus[d] * topology.dom_cap[d]
            for d in range(len(topology.dom_name))
            if topology.dom_is_rack[d] and topology.dom_model[d] in models
        ]
        return r.racks * min(racks, default=0)
    return r.nodes * min(per_node)


def _quota_refusal(
    qcfg: Mapping[str, QueueConfig], usage: Usage, queue: str, gpus: int
) -> tuple[str, bool] | None:
    """None if ``queue`` may book ``gpus`` more; else (reason, permanent)."""
    q = qcfg.get(queue)
    if q is None or q.gpu_quota is None:
        return None
    quota, limit = q.gpu_quota, q.borrowing_limit
    if gpus > quota + limit:
        return (
            f"needs {gpus} GPUs, more than queue {queue!r} may ever hold "
            f"(quota {quota} + borrowing limit {limit})",
            True,
        )
    used = usage.queue_gpus(queue) + gpus
    if used <= quota:
        return None
    excess = used - quota
    if excess > limit:
        return (
            f"queue {queue!r} would hold {used} GPUs, over its quota {quota} "
            f"plus borrowing limit {limit}",
            False,
        )
    unused = borrowed = 0
    for o in qcfg.values():
        if o.name == queue or o.gpu_quota is None:
            continue
        held = usage.queue_gpus(o.name)
        unused += max(0, o.gpu_quota - held)
        borrowed += max(0, held - o.gpu_quota)
    lendable = unused - borrowed
    if excess > lendable:
        return (
            f"queue {queue!r} would borrow {excess} GPUs; only {max(0, lendable)} "
            "unused quota is free to lend",
            False,
        )
    return None
