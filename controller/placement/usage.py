"""The allocation overlay: who holds which node, kept apart from the topology.

A :class:`Usage` is immutable from the outside: :meth:`Usage.with_booking` and
:meth:`Usage.without` return a new overlay and leave the old one untouched, so
a snapshot handed to one scheduling cycle never sees another's changes.

Internally it keeps, per NVLink domain, the owner of every node and the tuple
of free node indices, plus indexes the engine reads instead of scanning nodes:

* ``avail[(model, f)]`` - domains not held by an exclusive gang with exactly
  ``f`` free nodes; ``pristine[(model, f)]`` - domains nobody books, by ``f``.
* ``hist[(model, scope)][f]`` / ``phist`` - how many such domains a leaf,
  spine or the fleet has, by free count.
* ``whole[(model, scope)]`` - whole, fully schedulable, unbooked rack domains.

A change touches only the domains of one booking. Copy-on-write: a new
overlay copies the top-level containers (C-speed shallow copies) and only the
index entries it changes, so an update costs O(domains touched + index size)
rather than O(nodes). The per-domain states are kept in chunks of
``CHUNK`` domains, so a new overlay copies one pointer per chunk rather than
one per domain (a fleet of HGX boxes has a domain per node: at 25,000 a flat
copy, and freeing it, cost about 40 us an overlay, several a scheduling
pass), and a change copies the one chunk it writes to.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from controller.core.errors import FailedPrecondition, NotFound
from controller.placement.layered_set import LayeredSet
from controller.placement.model import Booking
from controller.placement.topology import Topology

Key = tuple[str, str]
BucketKey = tuple[str, int]

CHUNK_BITS = 6
CHUNK = 1 << CHUNK_BITS  # domain states per chunk
_IN_CHUNK = CHUNK - 1


class DomState(NamedTuple):
    """Per-domain overlay state."""

    owners: tuple[str | None, ...]  # booking key per node (job node or spare)
    free: tuple[int, ...]  # local indices: schedulable and not booked
    booked: int  # nodes with an owner
    exclusive: int  # exclusive bookings touching the domain


class Usage:
    """Which nodes are booked, by whom, with indexes for fast placement."""

    __slots__ = (
        "_bookings",
        "_chunks",
        "_mine",
        "_queue_gpus",
        "avail",
        "dom",
        "hist",
        "phist",
        "pristine",
        "topology",
        "whole",
    )

    topology: Topology
    _chunks: list[list[DomState]]  # domain d's state: _chunks[d >> CHUNK_BITS][d & _IN_CHUNK]
    avail: dict[BucketKey, LayeredSet]
    pristine: dict[BucketKey, LayeredSet]
    hist: dict[Key, list[int]]
    phist: dict[Key, list[int]]
    whole: dict[Key, int]
    _bookings: dict[str, Booking]
    _queue_gpus: dict[str, int]
    _mine: set[object]  # ids of index containers this instance may mutate

    def __init__(self, topology: Topology) -> None:
        """An empty overlay: every schedulable node free."""
        t = topology
        self.topology = t
        self._chunks = []
        self.avail = {}
        self.pristine = {}
        self.hist = {k: [0] * (t.max_size + 1) for k in t.static_hist}
        self.phist = {k: [0] * (t.max_size + 1) for k in t.static_hist}
        self.whole = dict.fromkeys(t.static_hist, 0)
        self._bookings = {}
        self._queue_gpus = {}
        self._mine = set()
        for d, nodes in enumerate(t.dom_nodes):
            st = DomState((None,) * len(nodes), t.dom_sched[d], 0, 0)
            if not d & _IN_CHUNK:
                self._chunks.append([])
            self._chunks[-1].append(st)
            self._index(d, st, +1)
        self._mine = set()

    # -- construction --------------------------------------------------------

    @classmethod
    def from_bookings(cls, topology: Topology, bookings: Iterable[Booking]) -> Usage:
        """Overlay holding ``bookings``; raises like :meth:`with_booking`."""
        u = cls(topology)
        for b in bookings:
            u._add(b)
        u._mine = set()
        return u

    def _clone(self) -> Usage:
        u = Usage.__new__(Usage)
        u.topology = self.topology
        u._chunks = list(self._chunks)
        u.avail = dict(self.avail)
        u.pristine = dict(self.pristine)
        u.hist = dict(self.hist)
        u.phist = dict(self.phist)
        u.whole = dict(self.whole)
        u._bookings = dict(self._bookings)
        u._queue_gpus = dict(self._queue_gpus)
        u._mine = set()
        return u

    def with_booking(self, booking: Booking) -> Usage:
        """A new overlay that also holds ``booking``.

        Idempotent: adding an identical booking again returns ``self``.
        Raises ``FailedPrecondition`` if the key is held by a different
        booking or any node is already booked by another key (no double
        booking, ever), ``NotFound`` for a node unknown to the topology.
        """
        if self._bookings.get(booking.key) == booking:
            return self
        u = self._clone()
        u._add(booking)
        u._mine = set()
        return u

    def without(self, key: str) -> Usage:
        """A new overlay with booking ``key`` released; ``self`` if not held."""
        if key not in self._bookings:
            return self
        u = self._clone()
        u._remove(key)
        u._mine = set()
        return u

    def updated(self, topology: Topology, bookings: Iterable[Booking]) -> Usage:
        """A new overlay holding exactly ``bookings`` over ``topology``: this
        one's topology or one ``rescheduled`` from it (else it is built from
        scratch), changed only where they differ from this one, so a
        scheduling pass costs what changed rather than the fleet's size.
        Raises like :meth:`from_bookings`."""
        if topology is not self.topology and (topology.dom_nodes is not self.topology.dom_nodes):
            return Usage.from_bookings(topology, bookings)
        wanted = {b.key: b for b in bookings}
        u = self._clone()
        for key, held in self._bookings.items():
            now = wanted.get(key)
            if now is not held and now != held:
                u._remove(key)
        if topology is not self.topology:
            u.topology = topology
            for d in topology.changed_domains(self.topology):
                old = u.state(d)
                sched = topology.dom_sched[d]
                free = tuple(i for i in sched if old.owners[i] is None)
                u._index(d, old, -1)
                new = DomState(old.owners, free, old.booked, old.exclusive)
                u._put(d, new)
                u._index(d, new, +1)
        for key, booking in wanted.items():
            if key not in u._bookings:
                u._add(booking)
        u._mine = set()
        return u

    def rebase(self, topology: Topology) -> Usage:
        """The same bookings over a newer topology generation."""
        return Usage.from_bookings(topology, self._bookings.values())

    # -- queries ---------------------------------------------------------------

    def state(self, d: int) -> DomState:
        """Domain ``d``'s owners, free nodes and bookings (by domain id)."""
        return self._chunks[d >> CHUNK_BITS][d & _IN_CHUNK]

    def states(self) -> list[DomState]:
        """Every domain's state, in domain id order (a copy)."""
        return [st for chunk in self._chunks for st in chunk]

    def is_free(self, node: str) -> bool:
        """True if ``node`` is schedulable and booked by nobody."""
        d, i = self._loc(node)
        st = self.state(d)
        return st.owners[i] is None and i in self.topology.dom_sched[d] and i in st.free

    def booked_by(self, node: str) -> str | None:
        """Key of the booking holding ``node`` (as job node or spare), or None."""
        d, i = self._loc(node)
        return self.state(d).owners[i]

    def booking(self, key: str) -> Booking | None:
        return self._bookings.get(key)

    def bookings(self) -> tuple[Booking, ...]:
        """All bookings, sorted by key."""
        return tuple(self._bookings[k] for k in sorted(self._bookings))

    def queue_gpus(self, queue: str) -> int:
        """GPUs (job nodes and spares) booked by ``queue``."""
        return self._queue_gpus.get(queue, 0)

    def free_count(self, domain: str) -> int:
        """Free schedulable nodes in NVLink domain ``domain``."""
        try:
            return len(self.state(self.topology.dom_id[domain]).free)
        except KeyError:
            raise NotFound(kind="NVLink domain", name=domain) from None

    def domain_keys(self, domain: str) -> frozenset[str]:
        """Keys of the bookings holding nodes in ``domain``."""
        st = self.state(self.topology.dom_id[domain])
        return frozenset(o for o in st.owners if o is not None)

    def __iter__(self) -> Iterator[Booking]:
        return iter(self.bookings())

    def __len__(self) -> int:
        return len(self._bookings)

    def __repr__(self) -> str:
        return f"Usage(generation={self.topology.generation}, bookings={len(self._bookings)})"

    def _loc(self, node: str) -> tuple[int, int]:
        try:
            return self.topology.loc[node]
        except KeyError:
            raise NotFound(kind="node", name=node) from None

    # -- mutation of a private instance -----------------------------------------

    def _add(self, b: Booking) -> None:
        if b.key in self._bookings:
            if self._bookings[b.key] == b:
                return
            raise FailedPrecondition(f"booking {b.key!r} already exists with other nodes")
        touched: dict[int, list[int]] = {}
        seen: set[str] = set()
        for n in b.all_nodes:
            if n in seen:
                raise FailedPrecondition(f"booking {b.key!r} names node {n!r} twice")
            seen.add(n)
            d, i = self._loc(n)
            owner = self.state(d).owners[i]
            if owner is not None:
                raise FailedPrecondition(
                    f"node {n!r} is already booked by {owner!r}; refusing {b.key!r}"
                )
            touched.setdefault(d, []).append(i)
        for d, idx in touched.items():
            self._set_owner(d, idx, b.key, 1 if b.exclusive else 0)
        self._bookings[b.key] = b
        self._queue_gpus[b.queue] = self._queue_gpus.get(b.queue, 0) + b.gpus

    def _remove(self, key: str) -> None:
        b = self._bookings.pop(key)
        touched: dict[int, list[int]] = {}
        for n in b.all_nodes:
            d, i = self.topology.loc[n]
            touched.setdefault(d, []).append(i)
        for d, idx in touched.items():
            self._set_owner(d, idx, None, -1 if b.exclusive else 0)
        left = self._queue_gpus.get(b.queue, 0) - b.gpus
        if left:
            self._queue_gpus[b.queue] = left
        else:
            self._queue_gpus.pop(b.queue, None)

    def _set_owner(self, d: int, idx: list[int], key: str | None, excl: int) -> None:
        old = self.state(d)
        owners = list(old.owners)
        for i in idx:
            owners[i] = key
        sched = self.topology.dom_sched[d]
        free = tuple(i for i in sched if owners[i] is None)
        booked = old.booked + (len(idx) if key is not None else -len(idx))
        new = DomState(tuple(owners), free, booked, old.exclusive + excl)
        self._index(d, old, -1)
        self._put(d, new)
        self._index(d, new, +1)

    def _put(self, d: int, st: DomState) -> None:
        """Set domain ``d``'s state, copying its chunk first unless this
        instance made that chunk."""
        c = d >> CHUNK_BITS
        chunk = self._chunks[c]
        if id(chunk) not in self._mine:
            chunk = self._chunks[c] = list(chunk)
            self._mine.add(id(chunk))
        chunk[d & _IN_CHUNK] = st

    def _own_bucket(self, buckets: dict[BucketKey, LayeredSet], key: BucketKey) -> LayeredSet:
        """``buckets[key]``, this instance's own to change (copied once)."""
        cur = buckets.get(key)
        if cur is None:
            cur = LayeredSet()
        elif id(cur) not in self._mine:
            cur = cur.copy()
        else:
            return cur
        buckets[key] = cur
        self._mine.add(id(cur))
        return cur

    def _own_hist(self, hists: dict[Key, list[int]], key: Key) -> list[int]:
        """``hists[key]``, this instance's own to change (copied once)."""
        cur = hists[key]  # every (model, rack kind) has its histogram from the start
        if id(cur) not in self._mine:
            cur = hists[key] = list(cur)
            self._mine.add(id(cur))
        return cur

    def _index(self, d: int, st: DomState, sign: int) -> None:
        t = self.topology
        m = t.dom_model[d]
        f = len(st.free)
        avail = st.exclusive == 0 and f > 0
        pristine = st.booked == 0 and f > 0
        whole = pristine and t.dom_is_rack[d] and f == t.dom_cap[d]
        if avail:
            s = self._own_bucket(self.avail, (m, f))
            s.add(d) if sign > 0 else s.discard(d)
        if pristine:
            s = self._own_bucket(self.pristine, (m, f))
            s.add(d) if sign > 0 else s.discard(d)
        for scope in t.dom_scopes[d]:
            k = (m, scope)
            if avail:
                h = self._own_hist(self.hist, k)
                h[f] += sign
            if pristine:
                h = self._own_hist(self.phist, k)
                h[f] += sign
            if whole:
                self.whole[k] += sign
