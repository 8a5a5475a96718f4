"""Open allocations (and the latest closed ones) as last committed, in memory.

Every ``CreateAllocation`` and ``ReleaseAllocation`` used to read the store
several times: the idempotency key, the queue for the scheduling pass that
follows, and the allocation itself before and after. Each read is an ORM
session on a database thread, queued behind the health write-behind, which
is most of what a create/release cycle cost. This view answers them from
memory, as ``node_view.py`` does for nodes: the store tells it what each
commit saved (``Store.on_allocations_committed``), on the event loop, in
commit order, before the writer's caller resumes, so a read that follows a
write sees it.

It holds every open allocation (pending, preparing, ready: the scheduler's
whole input) and the ``closed_kept`` most recently closed ones (released,
failed), so that the answer to a release, or a client asking again with the
same idempotency key soon after, needs no store read. Older closed ones are
read from the store (``get`` returns None: the caller asks the store).

It is a read path only, never the source of truth: admission and release
re-read what they change inside their transaction. It is loaded once
(``begin_load`` then ``install``), with commits landing during the load
applied again after it. Records handed out are shared: callers must not
change them.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from controller.core.records import AllocationRecord
from controller.core.states import OPEN, AllocationState

CLOSED_KEPT = 10_000


def frozen_copy(alloc: AllocationRecord) -> AllocationRecord:
    """``alloc`` as of now: its lists copied, so a later change to the
    caller's record (without a save) does not reach the view."""
    return dataclasses.replace(
        alloc, nodes=list(alloc.nodes), spares=list(alloc.spares), domains=list(alloc.domains)
    )


class AllocationView:
    """See the module docstring."""

    def __init__(self, *, closed_kept: int = CLOSED_KEPT) -> None:
        self._closed_kept = closed_kept
        self._open: dict[str, AllocationRecord] = {}
        self._closed: OrderedDict[str, AllocationRecord] = OrderedDict()
        self._keys: dict[str, str] = {}  # idempotency key -> id, for what is held here
        self._pending: set[str] = set()
        # ``_open`` is kept in queue order (submitted, then id) as commits
        # arrive, new requests last, so a pass's ``open`` is a copy, not a
        # sort of thousands of running jobs; one that arrives out of order
        # (a load, a commit landing during it) has it sorted at the next read.
        self._in_order = True
        self._last: tuple[int, str] | None = None  # the queue order of ``_open``'s last
        self._during_load: list[Mapping[str, AllocationRecord]] | None = None
        self.ready = False

    # -- keeping it current ----------------------------------------------------

    def committed(self, saved: Mapping[str, AllocationRecord]) -> None:
        """Apply what a commit saved (called by the store, on the event loop)."""
        if self._during_load is not None:
            self._during_load.append(saved)
        if self.ready:
            self._apply(saved)

    def begin_load(self) -> None:
        """Start remembering commits, for ``install`` to apply after the load."""
        self._during_load = []

    def install(self, open_allocations: Iterable[AllocationRecord]) -> None:
        """Take the open allocations as loaded, then every commit seen since
        ``begin_load``."""
        self._open, self._closed, self._keys, self._pending = {}, OrderedDict(), {}, set()
        self._in_order, self._last = True, None
        self._apply({a.id: a for a in open_allocations})
        late, self._during_load = self._during_load or [], None
        self.ready = True
        for saved in late:
            self._apply(saved)

    def _apply(self, saved: Mapping[str, AllocationRecord]) -> None:
        for ident, record in saved.items():
            if record.state in OPEN:
                self._closed.pop(ident, None)
                self._place(ident, record)
            else:
                self._open.pop(ident, None)
                self._closed[ident] = record
                self._closed.move_to_end(ident)
            self._keys[record.key] = ident
            if record.state == AllocationState.PENDING:
                self._pending.add(ident)
            else:
                self._pending.discard(ident)
        while len(self._closed) > self._closed_kept:
            ident, gone = self._closed.popitem(last=False)
            if self._keys.get(gone.key) == ident:
                del self._keys[gone.key]

    def _place(self, ident: str, record: AllocationRecord) -> None:
        """Put the open ``record`` in ``_open``, noting when that breaks the order."""
        order = (record.submitted, record.id)
        was = self._open.get(ident)
        if was is not None:  # keeps its place, if its place is the same
            if (was.submitted, was.id) != order:
                self._in_order = False
        elif self._last is not None and order < self._last:
            self._in_order = False
        else:
            self._last = order
        self._open[ident] = record

    # -- reads -----------------------------------------------------------------

    def get(self, ident: str) -> AllocationRecord | None:
        """By id or idempotency key; None when not held here (closed long
        ago, or never): the store has the answer."""
        found = self._open.get(ident) or self._closed.get(ident)
        if found is not None:
            return found
        by_key = self._keys.get(ident)
        if by_key is None:
            return None
        return self._open.get(by_key) or self._closed.get(by_key)

    def by_key(self, key: str) -> AllocationRecord | None:
        ident = self._keys.get(key)
        if ident is None:
            return None
        return self._open.get(ident) or self._closed.get(ident)

    def open(self) -> list[AllocationRecord]:
        """Every open allocation, in queue order (submitted, then id)."""
        if not self._in_order:
            queue = sorted(self._open.values(), key=lambda a: (a.submitted, a.id))
            self._open = {a.id: a for a in queue}
            self._in_order = True
            self._last = (queue[-1].submitted, queue[-1].id) if queue else None
        return list(self._open.values())

    def pending(self) -> bool:
        """Whether any allocation waits (a scheduling pass has work)."""
        return bool(self._pending)
