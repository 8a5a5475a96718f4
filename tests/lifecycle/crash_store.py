"""What the controller's SQLite file says, read read-only, and what must hold in it.

``read_store`` takes one consistent snapshot (a single read transaction) of
nodes, allocations and events while the controller may still be running.
``store_violations`` lists every broken crash-consistency invariant of such a
snapshot; an empty list means the store is consistent. These functions are
pure (no clock, no network) so a table test can feed them broken snapshots.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ACTIVE = frozenset({"preparing", "ready"})
HELD_STATES = frozenset({"allocated", "preparing", "draining"})


@dataclass(frozen=True)
class StoredNode:
    name: str
    state: str
    allocation: str
    drained: bool
    operation: str = ""
    profile: str = ""
    applied_profile: str = ""


@dataclass(frozen=True)
class StoredAllocation:
    id: str
    key: str
    state: str
    nodes: tuple[str, ...] = ()
    spares: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[str, ...]:
        return self.nodes + self.spares


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    kind: str
    node: str = ""
    allocation: str = ""
    data: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def ident(self) -> tuple[int, str, str, str]:
        return (self.seq, self.kind, self.node, self.allocation)


@dataclass(frozen=True)
class StoreSnapshot:
    nodes: dict[str, StoredNode]
    allocations: dict[str, StoredAllocation]
    events: list[StoredEvent]


def read_store(db_path: Path) -> StoreSnapshot:
    """One consistent read-only snapshot of ``db_path`` (blocking; use a thread)."""
    uri = f"file:{db_path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as conn:
        conn.isolation_level = None  # we issue BEGIN ourselves
        conn.execute("BEGIN")
        try:
            nodes = {
                r[0]: StoredNode(r[0], r[1], r[2], bool(r[3]), r[4] or r[5], r[6], r[7])
                for r in conn.execute(
                    "SELECT name, state, allocation_id, drained, drain_target, "
                    "allocation_profile, profile, applied_profile FROM nodes"
                )
            }
            allocations = {
                r[0]: StoredAllocation(
                    r[0], r[1], r[2], tuple(json.loads(r[3])), tuple(json.loads(r[4]))
                )
                for r in conn.execute(
                    "SELECT id, key, state, nodes_json, spares_json FROM allocations"
                )
            }
            events = [
                StoredEvent(r[0], r[1], r[2], r[3], json.loads(r[4] or "{}"))
                for r in conn.execute(
                    "SELECT seq, kind, node, allocation, data_json FROM events ORDER BY rowid"
                )
            ]
        finally:
            conn.execute("ROLLBACK")
    return StoreSnapshot(nodes, allocations, events)


def booking_violations(snap: StoreSnapshot) -> list[str]:
    """(b): no node in two allocations; node and allocation agree on who holds whom."""
    problems: list[str] = []
    holders: dict[str, list[str]] = defaultdict(list)
    for alloc in snap.allocations.values():
        if alloc.state in ACTIVE:
            for name in alloc.members:
                holders[name].append(alloc.id)
    for name, ids in sorted(holders.items()):
        if len(ids) > 1:
            problems.append(f"node {name} is booked by {len(ids)} allocations: {sorted(ids)}")
        node = snap.nodes.get(name)
        if node is None:
            problems.append(f"allocation {ids[0]} holds unknown node {name}")
        elif node.allocation not in ids:
            problems.append(
                f"node {name} is in allocation {ids[0]} but says allocation={node.allocation!r}"
            )
    for node in snap.nodes.values():
        if node.allocation:
            holder = snap.allocations.get(node.allocation)
            if holder is None or holder.state not in ACTIVE or node.name not in holder.members:
                state = holder.state if holder else "missing"
                problems.append(
                    f"node {node.name} points at allocation {node.allocation} ({state}) "
                    "that does not hold it"
                )
        if node.state == "allocated" and not node.allocation:
            problems.append(f"node {node.name} is allocated to nothing")
        if node.state == "ready" and node.allocation:
            problems.append(f"node {node.name} is ready yet held by {node.allocation}")
    return problems


def event_violations(snap: StoreSnapshot, before: list[StoredEvent]) -> list[str]:
    """(e): strictly increasing seqs, no event lost or rewritten, state matches its log."""
    problems: list[str] = []
    seqs = [e.seq for e in snap.events]
    if any(b <= a for a, b in itertools.pairwise(seqs)):
        problems.append("event seqs are not strictly increasing")
    if len(set(seqs)) != len(seqs):
        problems.append("duplicate event seqs")
    now = {e.seq: e for e in snap.events}
    for old in before:
        new = now.get(old.seq)
        if new is None:
            problems.append(f"event {old.seq} ({old.kind}) was lost")
        elif new.ident != old.ident:
            problems.append(f"event {old.seq} was rewritten: {old.ident} -> {new.ident}")
    if before and snap.events and len(snap.events) > len(before):
        fresh = snap.events[len(before) :]
        if min(e.seq for e in fresh) <= max(e.seq for e in before):
            problems.append("a new event reused or preceded an old sequence number")
    last: dict[str, str] = {}
    for e in snap.events:
        if e.kind == "node.transition":
            last[e.node] = str(e.data.get("to_state", ""))
    for node in snap.nodes.values():
        logged = last.get(node.name, "enrolled")
        if logged != node.state:
            problems.append(
                f"node {node.name} is {node.state} but its last transition event says {logged}"
            )
    return problems


def store_violations(snap: StoreSnapshot, before: list[StoredEvent]) -> list[str]:
    return booking_violations(snap) + event_violations(snap, before)
