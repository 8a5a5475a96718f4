"""Failed-node replacement inside a booking's NVLink domain.

Kueue replaces one failed node and evicts the workload if more fail; a
workload filling a whole rack can never get an in-rack replacement, and two
of its fixes were for double-booked replacements. Here a booking carries hot
spares in its own domains, so a failure is absorbed in the same NVLink
domain for as long as spares last, and a replacement is checked against the
overlay: it is never a node anyone else books.
"""

from __future__ import annotations

from dataclasses import replace as dc_replace

from controller.core.errors import InvalidArgument
from controller.placement.model import Booking, NoFit
from controller.placement.topology import Topology
from controller.placement.usage import Usage

_EMPTY: frozenset[str] = frozenset()


def replace_failed(
    topology: Topology,
    usage: Usage,
    booking: Booking,
    failed: str,
    *,
    blocked: frozenset[str] = _EMPTY,
) -> Booking | NoFit:
    """The booking with ``failed`` swapped for a node in the same NVLink domain.

    Order of choice: the booking's own spares in that domain, then a free
    schedulable node of that domain not in ``blocked``. ``failed`` leaves the
    booking (the caller marks it unschedulable). A failed spare is dropped
    and replenished from a free node of its domain when one exists. Returns
    ``NoFit`` when the domain has nothing left; raises ``InvalidArgument``
    when ``failed`` is not part of ``booking``. Pure; books nothing.
    """
    if failed not in booking.nodes and failed not in booking.spares:
        raise InvalidArgument(f"node {failed!r} is not part of booking {booking.key!r}")
    domain = topology.node(failed).domain
    gpus_failed = topology.node(failed).gpus
    if failed in booking.spares:
        spares = tuple(s for s in booking.spares if s != failed)
        fresh = _free_in(topology, usage, domain, booking, blocked)
        if fresh is not None:
            spares = (*spares, fresh)
            gpus = booking.gpus - gpus_failed + topology.node(fresh).gpus
        else:
            gpus = booking.gpus - gpus_failed
        return dc_replace(booking, spares=spares, gpus=gpus)
    spare = next(
        (
            s
            for s in booking.spares
            if topology.node(s).domain == domain
            and s not in blocked
            and topology.node(s).schedulable
            and usage.booked_by(s) in (None, booking.key)
        ),
        None,
    )
    if spare is not None:
        nodes = tuple(spare if n == failed else n for n in booking.nodes)
        spares = tuple(s for s in booking.spares if s != spare)
        gpus = booking.gpus - gpus_failed
        return dc_replace(booking, nodes=nodes, spares=spares, gpus=gpus)
    fresh = _free_in(topology, usage, domain, booking, blocked)
    if fresh is None:
        return NoFit(
            f"no spare or free schedulable node left in NVLink domain {domain!r} "
            f"to replace {failed!r} of booking {booking.key!r}",
            permanent=False,
        )
    nodes = tuple(fresh if n == failed else n for n in booking.nodes)
    gpus = booking.gpus - gpus_failed + topology.node(fresh).gpus
    return dc_replace(booking, nodes=nodes, gpus=gpus)


def _free_in(
    topology: Topology,
    usage: Usage,
    domain: str,
    booking: Booking,
    blocked: frozenset[str],
) -> str | None:
    """A free schedulable node of ``domain`` usable by ``booking``."""
    mine = set(booking.nodes) | set(booking.spares)
    d = topology.dom_id[domain]
    st = usage.state(d)
    if st.exclusive and not booking.exclusive:
        return None
    names = topology.dom_nodes[d]
    for i in st.free:
        n = names[i]
        if n not in blocked and n not in mine:
            return n
    return None
