"""Every node's record as last committed, in memory, for reads.

``GetNode``, ``ListNodes`` pages, the scheduler's view of the fleet, the
lifecycle's and the policies' scans all read nodes. Reading them through the
database costs an ORM session and a row-to-record conversion per node per
read, which at fleet size is most of the controller's time. The store tells
this view what each commit saved (``Store.on_nodes_committed``: the saved
records, copied at their last save, and replaced GPU inventories), on the
event loop and before the writer's caller resumes, so a read that follows a
write sees it.

Writes stay transactional where they are: the view is a read path only,
never the source of truth. It is loaded once at start (``begin_load`` then
``install``); a commit that lands while the load reads is applied again after
it, so the load never hides a newer change. Until it is loaded, callers read
the store (``ready`` is False).

Records handed out are shared, not copied: callers must not change them (a
change belongs in a transaction, on a record read there).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from controller.core.model import GpuInfo
from controller.core.records import NodeRecord
from controller.core.states import OUT_OF_SERVICE, NodeState


@dataclass(frozen=True, slots=True)
class NodeChanges:
    """What one commit did to nodes: each saved node's record as of its last
    save in the transaction, and each GPU inventory it replaced."""

    saved: Mapping[str, NodeRecord] = field(default_factory=dict)
    gpus: Mapping[str, tuple[GpuInfo, ...]] = field(default_factory=dict)
    removed: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.saved or self.gpus or self.removed)


def inventory_key(node: NodeRecord) -> tuple[object, ...]:
    """What a node contributes to what the fleet could ever run: where it
    is, its GPUs, and whether it is out of service (no longer hope for a
    request waiting on it) — not its bookings or its passing states."""
    return (
        node.rack,
        node.leaf,
        node.spine,
        node.gpu_model,
        node.gpu_count,
        node.nvlink_domain,
        node.drained,
        node.state in OUT_OF_SERVICE or node.state == NodeState.DRAINING,
    )


class NodeFeed:
    """The names of the nodes saved or removed since the last ``take``, for a
    reader that keeps its own index of the fleet (the lifecycle's due nodes)
    and so needs only what changed. Starts as "everything": the reader's
    first take, and any after a load, is told to look at the whole view."""

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._everything = True

    def saw(self, names: Iterable[str]) -> None:
        self._names.update(names)

    def saw_everything(self) -> None:
        self._everything = True
        self._names = set()

    def take(self) -> tuple[bool, set[str]]:
        """(whether to look at every node, the names changed since the last take)."""
        found = self._everything, self._names
        self._everything, self._names = False, set()
        return found


class NodeView:
    """See the module docstring."""

    def __init__(self) -> None:
        self._records: dict[str, NodeRecord] = {}
        self._gpus: dict[str, tuple[GpuInfo, ...]] = {}
        self._names: list[str] = []  # sorted, for pages
        self._by_state: dict[NodeState, set[str]] = {s: set() for s in NodeState}
        self._during_load: list[NodeChanges] | None = None
        self.ready = False
        # Bumped when a node is added or its inventory (``inventory_key``)
        # changes: what could ever fit the fleet depends on nothing else.
        self.inventory_version = 0
        self._feeds: list[NodeFeed] = []

    def watch(self) -> NodeFeed:
        """A feed of the names each commit saves or removes from now on."""
        feed = NodeFeed()
        self._feeds.append(feed)
        return feed

    # -- keeping it current ----------------------------------------------------

    def committed(self, changes: NodeChanges) -> None:
        """Apply what a commit saved (called by the store, on the event loop)."""
        if self._during_load is not None:
            self._during_load.append(changes)
        if self.ready:
            self._apply(changes)

    def begin_load(self) -> None:
        """Start remembering commits, for ``install`` to apply after the load."""
        self._during_load = []

    def install(self, records: Iterable[NodeRecord], gpus: Mapping[str, Sequence[GpuInfo]]) -> None:
        """Take the loaded fleet, then every commit seen since ``begin_load``."""
        self._records = {r.name: r for r in records}
        self._gpus = {name: tuple(g) for name, g in gpus.items()}
        self._names = sorted(self._records)
        self._by_state = {s: set() for s in NodeState}
        for r in self._records.values():
            self._by_state[r.state].add(r.name)
        late, self._during_load = self._during_load or [], None
        self.ready = True
        self.inventory_version += 1
        for feed in self._feeds:
            feed.saw_everything()
        for changes in late:
            self._apply(changes)

    def _apply(self, changes: NodeChanges) -> None:
        for feed in self._feeds:
            feed.saw(changes.saved)
            feed.saw(changes.removed)
        for name, record in changes.saved.items():
            before = self._records.get(name)
            if before is None:
                bisect.insort(self._names, name)
                self.inventory_version += 1
            else:
                if before.state != record.state:
                    self._by_state[before.state].discard(name)
                if inventory_key(before) != inventory_key(record):
                    self.inventory_version += 1
            self._by_state[record.state].add(name)
            self._records[name] = record
        for name, inventory in changes.gpus.items():
            self._gpus[name] = inventory
        for name in changes.removed:
            gone = self._records.pop(name, None)
            self._gpus.pop(name, None)
            if gone is not None:
                self._by_state[gone.state].discard(name)
                index = bisect.bisect_left(self._names, name)
                if index < len(self._names) and self._names[index] == name:
                    del self._names[index]
                self.inventory_version += 1

    # -- reads -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    def get(self, name: str) -> NodeRecord | None:
        return self._records.get(name)

    def names(self) -> list[str]:
        """Every node's name, sorted."""
        return list(self._names)

    def gpus(self, name: str) -> tuple[GpuInfo, ...]:
        return self._gpus.get(name, ())

    def all(self) -> list[NodeRecord]:
        """Every node, by name."""
        records = self._records
        return [records[n] for n in self._names]

    def in_states(self, states: Iterable[NodeState]) -> list[NodeRecord]:
        """The nodes in any of ``states``, by name (by the state index)."""
        names = sorted(n for s in set(states) for n in self._by_state[s])
        return [self._records[n] for n in names]

    def after(self, after: str) -> Iterator[NodeRecord]:
        """The nodes named after ``after`` ("": all), by name."""
        records = self._records
        for name in self._names[bisect.bisect_right(self._names, after) :]:
            yield records[name]
