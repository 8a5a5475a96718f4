"""An in-memory store that implements the core's repository Protocols.

Each transaction works on a copy of the whole state and replaces it only when
the function returns, so a unit of work that raises leaves nothing behind —
as a database transaction does. Records go in and out as copies: changing a
record without saving it changes nothing, as with the SQL store.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from controller.core.errors import DuplicateKey
from controller.core.health import HealthReport, HealthSample
from controller.core.identity import TokenRecord
from controller.core.kinds import EventKind
from controller.core.model import BmcTarget, EventInfo, GpuInfo
from controller.core.node_view import NodeChanges
from controller.core.records import AllocationRecord, LeakLook, NewEvent, NodeRecord
from controller.core.states import AllocationState, NodeState

T = TypeVar("T")


@dataclass
class _State:
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, list[GpuInfo]] = field(default_factory=dict)
    allocations: dict[str, AllocationRecord] = field(default_factory=dict)
    events: list[EventInfo] = field(default_factory=list)
    tokens: dict[str, TokenRecord] = field(default_factory=dict)
    leak_looks: dict[str, LeakLook] = field(default_factory=dict)


class MemoryNodes:
    def __init__(self, state: _State) -> None:
        self._s = state
        self.saved: dict[str, NodeRecord] = {}  # for the view, as the SQL store tells it
        self.gpus_set: dict[str, tuple[GpuInfo, ...]] = {}
        self.removed: set[str] = set()

    def remove(self, name: str) -> None:
        self._s.nodes.pop(name, None)
        self._s.passwords.pop(name, None)
        self._s.gpus.pop(name, None)
        self._s.leak_looks.pop(name, None)
        for ident in [i for i, t in self._s.tokens.items() if t.node == name]:
            del self._s.tokens[ident]
        self.saved.pop(name, None)
        self.gpus_set.pop(name, None)
        self.removed.add(name)

    def leak_looks(self) -> dict[str, LeakLook]:
        return dict(self._s.leak_looks)

    def save_leak_looks(self, looks: Mapping[str, LeakLook | None]) -> None:
        for name, look in looks.items():
            if look is None:
                self._s.leak_looks.pop(name, None)
            elif name in self._s.nodes:
                self._s.leak_looks[name] = look

    def _keep(self, node: NodeRecord) -> None:
        self.saved[node.name] = replace(copy.deepcopy(node), health=None)

    def get(self, name: str, *, with_health: bool = True) -> NodeRecord | None:
        node = self._s.nodes.get(name)
        if node is None:
            return None
        found = copy.deepcopy(node)
        if not with_health:
            found.health = None
        return found

    def find(
        self, *, rack: str = "", state: NodeState | None = None, with_health: bool = True
    ) -> list[NodeRecord]:
        found = [
            copy.deepcopy(n)
            for _, n in sorted(self._s.nodes.items())
            if (not rack or n.rack == rack) and (state is None or n.state == state)
        ]
        if not with_health:
            for n in found:
                n.health = None
        return found

    def page(
        self,
        after: str,
        limit: int,
        *,
        rack: str = "",
        state: NodeState | None = None,
        gpu_model: str = "",
        allocation: str = "",
    ) -> list[NodeRecord]:
        found = [
            n
            for n in self.find(rack=rack, state=state)
            if n.name > after
            and (not gpu_model or n.gpu_model == gpu_model)
            and (not allocation or n.allocation_id == allocation)
        ]
        return found[: max(0, limit)]

    def held_by(
        self, allocation: str, *, with_health: bool = True, members: Sequence[str] = ()
    ) -> list[NodeRecord]:
        return [n for n in self.find(with_health=with_health) if n.allocation_id == allocation]

    def find_by_bmc_url(self, url: str) -> list[NodeRecord]:
        return [n for n in self.find() if n.bmc_url == url]

    def add(self, node: NodeRecord, bmc_password: str) -> None:
        if node.name in self._s.nodes:
            raise DuplicateKey(f"node {node.name} exists")
        self._s.nodes[node.name] = copy.deepcopy(node)
        self._s.passwords[node.name] = bmc_password
        self._keep(node)

    def save(self, node: NodeRecord) -> None:
        if node.name not in self._s.nodes:
            raise KeyError(node.name)
        saved = copy.deepcopy(node)
        saved.health = self._s.nodes[node.name].health  # health has writers of its own
        self._s.nodes[node.name] = saved
        self._keep(node)

    def set_credentials(self, node: NodeRecord, username: str, bmc_password: str) -> None:
        node.bmc_username = username
        self.save(node)
        self._s.passwords[node.name] = bmc_password

    def save_health(self, name: str, health: HealthReport, seen_at: float) -> NodeRecord | None:
        node = self._s.nodes.get(name)
        if node is None:
            return None
        node.health = health
        node.agent_last_seen = seen_at
        return copy.deepcopy(node)

    def save_health_batch(self, samples: Sequence[HealthSample]) -> int:
        written = 0
        for sample in samples:
            node = self._s.nodes.get(sample.node)
            if node is not None:
                node.agent_last_seen = sample.seen_at
                if sample.health is not None:
                    node.health = sample.health
                written += 1
        return written

    def bmc_target(self, node: NodeRecord) -> BmcTarget:
        return node.bmc_target(self._s.passwords.get(node.name, ""))

    def bmc_targets(self, nodes: Sequence[NodeRecord]) -> list[BmcTarget]:
        return [self.bmc_target(n) for n in nodes]

    def gpus(self, name: str) -> list[GpuInfo]:
        return list(self._s.gpus.get(name, []))

    def gpus_by_node(self) -> dict[str, list[GpuInfo]]:
        return {k: list(v) for k, v in self._s.gpus.items()}

    def gpus_of(self, names: Collection[str]) -> dict[str, list[GpuInfo]]:
        return {n: list(self._s.gpus[n]) for n in names if self._s.gpus.get(n)}

    def set_gpus(self, name: str, gpus: Sequence[GpuInfo]) -> None:
        self._s.gpus[name] = sorted(gpus, key=lambda g: g.index)
        self.gpus_set[name] = tuple(self._s.gpus[name])


class MemoryAllocations:
    def __init__(self, state: _State) -> None:
        self._s = state
        self.saved: dict[str, AllocationRecord] = {}  # for the view, as the SQL store tells it

    def get(self, ident: str) -> AllocationRecord | None:
        alloc = self._s.allocations.get(ident)
        return copy.deepcopy(alloc) if alloc is not None else None

    def by_key(self, key: str) -> AllocationRecord | None:
        found = [a for a in self._s.allocations.values() if a.key == key]
        return copy.deepcopy(found[0]) if found else None

    def find(self, states: Collection[AllocationState] | None = None) -> list[AllocationRecord]:
        allocs = sorted(self._s.allocations.values(), key=lambda a: a.submitted)
        return [copy.deepcopy(a) for a in allocs if states is None or a.state in states]

    def page(
        self,
        after: tuple[int, str],
        limit: int,
        *,
        states: Collection[AllocationState] | None = None,
    ) -> list[AllocationRecord]:
        allocs = sorted(self._s.allocations.values(), key=lambda a: (a.submitted, a.id))
        found = [
            copy.deepcopy(a)
            for a in allocs
            if (a.submitted, a.id) > after and (states is None or a.state in states)
        ]
        return found[: max(0, limit)]

    def add(self, allocation: AllocationRecord) -> None:
        if self.by_key(allocation.key) is not None or allocation.id in self._s.allocations:
            raise DuplicateKey(f"allocation key {allocation.key} exists")
        self._s.allocations[allocation.id] = copy.deepcopy(allocation)
        self.saved[allocation.id] = copy.deepcopy(allocation)

    def save(self, allocation: AllocationRecord) -> None:
        if allocation.id not in self._s.allocations:
            raise KeyError(allocation.id)
        self._s.allocations[allocation.id] = copy.deepcopy(allocation)
        self.saved[allocation.id] = copy.deepcopy(allocation)

    def last_submitted(self) -> int:
        return max((a.submitted for a in self._s.allocations.values()), default=0)


class MemoryEvents:
    def __init__(self, state: _State) -> None:
        self._s = state
        self.added = 0

    def add(self, event: NewEvent) -> None:
        seq = (self._s.events[-1].seq if self._s.events else 0) + 1
        self._s.events.append(
            EventInfo(
                seq=seq,
                at=event.at,
                kind=str(event.kind),
                node=event.node,
                allocation=event.allocation,
                rule=event.rule,
                reason=event.reason,
                data=copy.deepcopy(event.data),
            )
        )
        self.added += 1

    def since(
        self,
        after_seq: int,
        *,
        node: str = "",
        allocation: str = "",
        kinds: Collection[EventKind] = (),
        limit: int = 500,
    ) -> list[EventInfo]:
        wanted = {str(k) for k in kinds}
        found = [
            e
            for e in self._s.events
            if e.seq > after_seq
            and (not node or e.node == node)
            and (not allocation or e.allocation == allocation)
            and (not wanted or str(e.kind) in wanted)
        ]
        return [replace(e) for e in found[:limit]]

    def newest(self, limit: int, *, node: str = "") -> list[EventInfo]:
        found = [e for e in self._s.events if not node or e.node == node]
        return [replace(e) for e in found[-limit:]] if limit > 0 else []

    def recent(self, kind: EventKind, since_at: float) -> list[EventInfo]:
        return [replace(e) for e in self._s.events if e.kind == kind and e.at >= since_at]

    def latest(
        self,
        kind: EventKind,
        *,
        since_at: float = 0.0,
        limit: int = 500,
        node: str = "",
        allocation: str = "",
        where: Callable[[EventInfo], bool] | None = None,
    ) -> list[EventInfo]:
        found = [
            replace(e)
            for e in self.recent(kind, since_at)
            if (not node or e.node == node)
            and (not allocation or e.allocation == allocation)
            and (where is None or where(e))
        ]
        return found[-limit:] if limit > 0 else []


class MemoryTokens:
    def __init__(self, state: _State) -> None:
        self._s = state

    def get(self, token_id: str) -> TokenRecord | None:
        token = self._s.tokens.get(token_id)
        return copy.deepcopy(token) if token is not None else None

    def by_name(self, name: str) -> TokenRecord | None:
        found = [t for t in self._s.tokens.values() if t.name == name]
        return copy.deepcopy(found[0]) if found else None

    def find(self, *, include_revoked: bool = False) -> list[TokenRecord]:
        tokens = sorted(self._s.tokens.values(), key=lambda t: t.name)
        return [copy.deepcopy(t) for t in tokens if include_revoked or not t.revoked]

    def add(self, token: TokenRecord) -> None:
        if token.id in self._s.tokens or self.by_name(token.name) is not None:
            raise DuplicateKey(f"token {token.name} exists")
        self._s.tokens[token.id] = copy.deepcopy(token)

    def save(self, token: TokenRecord) -> None:
        if token.id not in self._s.tokens:
            raise KeyError(token.id)
        self._s.tokens[token.id] = copy.deepcopy(token)

    def delete(self, token_id: str) -> None:
        self._s.tokens.pop(token_id, None)


class MemoryTx:
    def __init__(self, state: _State) -> None:
        self.nodes = MemoryNodes(state)
        self.allocations = MemoryAllocations(state)
        self.events = MemoryEvents(state)
        self.tokens = MemoryTokens(state)


class MemoryStore:
    def __init__(self) -> None:
        self._state = _State()
        self._lock = asyncio.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._node_listeners: list[Callable[[NodeChanges], None]] = []
        self._allocation_listeners: list[Callable[[Mapping[str, AllocationRecord]], None]] = []
        self.transactions = 0

    def on_nodes_committed(self, listener: Callable[[NodeChanges], None]) -> None:
        self._node_listeners.append(listener)

    def on_allocations_committed(
        self, listener: Callable[[Mapping[str, AllocationRecord]], None]
    ) -> None:
        self._allocation_listeners.append(listener)

    def on_commit(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    async def tx(self, fn: Callable[[MemoryTx], T]) -> T:
        async with self._lock:
            work = copy.deepcopy(self._state)
            tx = MemoryTx(work)
            result = fn(tx)
            self._state = work
            self.transactions += 1
            changes = NodeChanges(
                saved=tx.nodes.saved, gpus=tx.nodes.gpus_set, removed=frozenset(tx.nodes.removed)
            )
            if changes:
                for node_listener in self._node_listeners:
                    node_listener(changes)
            if tx.allocations.saved:
                for allocation_listener in self._allocation_listeners:
                    allocation_listener(tx.allocations.saved)
        if tx.events.added:
            for listener in self._listeners:
                listener()
        return result

    async def read(self, fn: Callable[[MemoryTx], T]) -> T:
        async with self._lock:
            return fn(MemoryTx(copy.deepcopy(self._state)))

    def close(self) -> None:
        pass
