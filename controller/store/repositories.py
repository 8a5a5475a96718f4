"""The core's repositories (``controller.core.ports``) on SQLModel tables.

Rows and records meet here and nowhere else: every ``*_json`` column is
parsed and written in this module, states become enums on the way in, and a
node's BMC password is sealed on the way in and opened only for a
``BmcTarget``. Each repository works inside the one ``Link`` of the
transaction it belongs to.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from operator import attrgetter
from typing import Any

import orjson
from sqlalchemy import and_, bindparam, delete, func, insert, or_
from sqlalchemy import select as core_select
from sqlalchemy.engine import Connection
from sqlmodel import col, select, update

from controller.core.allocation_view import frozen_copy
from controller.core.health import (
    GPU_FIELDS,
    GPU_TUPLE_FIELDS,
    REPORT_FIELDS,
    GpuHealth,
    HealthReport,
    HealthSample,
    PackedReport,
    pack_report,
    packed_values,
    report_from_values,
)
from controller.core.identity import Role, TokenRecord
from controller.core.kinds import EventKind
from controller.core.model import AllocationSpec, BmcTarget, EventInfo, GpuInfo, ProvisionOp
from controller.core.node_view import NodeChanges
from controller.core.records import AllocationRecord, LeakLook, NewEvent, NodeRecord
from controller.core.states import AllocationState, NodeKind, NodeState, PowerState
from controller.store.driver_sql import execute_many, insert_rows, update_row
from controller.store.link import Link
from controller.store.models import (
    AllocationRow,
    EventRow,
    GpuRow,
    LeakLookRow,
    NodeRow,
    TokenRow,
)
from controller.store.secrets import SecretBox
from controller.store.writer_rows import TableRows

# -- JSON columns --------------------------------------------------------------

_GPU_HEALTH_FIELDS = {f.name: f for f in dataclasses.fields(GpuHealth)}


# The stored report: the values ``pack_report`` holds, by position, under
# the names of their fields. The write-behind writes every reporting node's
# latest report each flush (at a real fleet's pace, every report), so the
# document is written from the packed report as it is held: 10 us an 8-GPU
# report and 1.1 KB of values, against 26 us and 4.5 KB for the same
# fields as objects (orjson from the dataclasses, after 6-19 us to unpack
# them on the event loop). The names go with it (a constant head, not
# written field by field), so a report stored before a field was added or
# dropped still reads back by name.
_HEALTH_HEAD = (
    orjson.dumps({"report_fields": REPORT_FIELDS, "gpu_fields": GPU_FIELDS})[:-1] + b',"values":'
)

_REPORT_FIELD_LIST, _GPU_FIELD_LIST = list(REPORT_FIELDS), list(GPU_FIELDS)


def packed_to_json(packed: PackedReport | None) -> str:
    """The stored document of a packed report ("" for none)."""
    if packed is None:
        return ""
    return (_HEALTH_HEAD + orjson.dumps(packed_values(packed)) + b"}").decode()


def health_to_json(health: HealthReport | None) -> str:
    """The stored document of a typed report ("" for none)."""
    return packed_to_json(None if health is None else pack_report(health))


def health_from_json(text: str) -> HealthReport | None:
    """A stored report: by position under its fields' names, or (written
    before) as objects, field by field. Fields this Kiln does not know are
    ignored; those the document lacks take their defaults."""
    if not text:
        return None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        data = json.loads(text)  # a row an older Kiln wrote may hold NaN, which orjson refuses
    if "values" in data:
        report_fields, gpu_fields = data["report_fields"], data["gpu_fields"]
        if report_fields == _REPORT_FIELD_LIST and gpu_fields == _GPU_FIELD_LIST:
            return report_from_values(data["values"])  # as this Kiln wrote it: 10x faster
        data = _named(report_fields, gpu_fields, data["values"])
    gpus = []
    for g in data.get("gpus") or []:
        values = {k: v for k, v in g.items() if k in _GPU_HEALTH_FIELDS}
        for name in GPU_TUPLE_FIELDS & values.keys():
            values[name] = tuple(values[name] or ())
        gpus.append(GpuHealth(**values))
    return HealthReport(
        sampled_at=float(data.get("sampled_at") or 0.0),
        source=str(data.get("source") or "agent"),
        gpus=tuple(gpus),
        bmc_temps_c=tuple(data.get("bmc_temps_c") or ()),
        drift=tuple(data.get("drift") or ()),
    )


def _named(
    report_fields: Sequence[str], gpu_fields: Sequence[str], values: Sequence[Any]
) -> dict[str, Any]:
    """A positional document as the objects one would hold."""
    report = dict(zip(report_fields, values, strict=True))
    report["gpus"] = [dict(zip(gpu_fields, g, strict=True)) for g in report.get("gpus") or ()]
    return report


def _names(text: str) -> list[str]:
    return [str(n) for n in json.loads(text or "[]")]


# -- rows ⇄ records -------------------------------------------------------------

_NODE_PLAIN = (
    "name",
    "rack",
    "leaf",
    "spine",
    "bmc_url",
    "bmc_username",
    "bmc_insecure",
    "bmc_ca_bundle",
    "bmc_health",
    "state_reason",
    "drained",
    "gpu_model",
    "gpu_count",
    "nvlink_domain",
    "profile",
    "applied_profile",
    "allocation_id",
    "agent_last_seen",
    "power_block",
    "rack_hold",
    "created_at",
    "updated_at",
)


_POWER_STATES = frozenset(s.value for s in PowerState)

# A record's fields in order: a copy by position (0.6 us) where
# ``dataclasses.replace`` took 3.7 us, on every save.
_NODE_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(NodeRecord))
_NODE_FIELDS = attrgetter(*_NODE_FIELD_NAMES)
_NODE_HEALTH_AT = _NODE_FIELD_NAMES.index("health")


def node_record(row: Mapping[str, Any], *, with_health: bool = True) -> NodeRecord:
    """The record of a node row (a Core row's mapping)."""
    get = row.__getitem__
    return NodeRecord(
        **{name: get(name) for name in _NODE_PLAIN},
        state=NodeState(get("state")),
        power=PowerState(get("power")) if get("power") in _POWER_STATES else PowerState.UNKNOWN,
        expected_power=PowerState(get("expected_power")) if get("expected_power") else None,
        health=health_from_json(get("health_json")) if with_health else None,
        drain_target=NodeState(get("drain_target")) if get("drain_target") else None,
        allocation_profile=get("allocation_profile") or None,
        provision=_provision(get("provision_json")),
        kind=NodeKind(get("kind") or NodeKind.COMPUTE),
    )


def _node_values(node: NodeRecord) -> dict[str, Any]:
    """The node's columns as stored, but its password and health (each
    has a writer of its own)."""
    values = {name: getattr(node, name) for name in _NODE_PLAIN}
    values["state"] = node.state.value
    values["power"] = node.power.value
    values["expected_power"] = node.expected_power.value if node.expected_power else ""
    values["drain_target"] = node.drain_target.value if node.drain_target else ""
    values["allocation_profile"] = node.allocation_profile or ""
    values["kind"] = node.kind.value
    values["provision_json"] = (
        json.dumps(node.provision.to_dict(), sort_keys=True) if node.provision else ""
    )
    return values


def _changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The columns of ``after`` whose value differs from ``before``: a save
    usually changes two or three of a row's thirty columns."""
    return {name: value for name, value in after.items() if before.get(name) != value}


def _provision(text: str) -> ProvisionOp | None:
    """The stored provisioning operation; None when there is none."""
    return ProvisionOp.from_dict(json.loads(text)) if text else None


_GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuInfo))


def _gpu_columns() -> list[Any]:
    """GpuRow's columns in GpuInfo's field order (positional construction)."""
    return [col(getattr(GpuRow, name)) for name in _GPU_FIELDS]


def gpu_info(row: GpuRow) -> GpuInfo:
    return GpuInfo(**{f.name: getattr(row, f.name) for f in dataclasses.fields(GpuInfo)})


class SpecCodec:
    """Allocation specs to and from their stored JSON, each text parsed and
    each spec written once: a spec is immutable and a fleet's jobs repeat a
    few shapes, while every read and save of an allocation row parsed or
    wrote its spec anew (10 us, several times an allocation's cycle).
    Shared by the store's threads: a look-up that misses parses again."""

    KEPT = 4096  # texts, and specs, past which each memo starts over

    def __init__(self) -> None:
        self._specs: dict[str, AllocationSpec] = {}
        self._texts: dict[AllocationSpec, str] = {}

    def load(self, text: str) -> AllocationSpec:
        spec = self._specs.get(text)
        if spec is None:
            spec = AllocationSpec.from_dict(json.loads(text))
            if len(self._specs) >= self.KEPT:
                self._specs.clear()
            self._specs[text] = spec
        return spec

    def dump(self, spec: AllocationSpec) -> str:
        text = self._texts.get(spec)
        if text is None:
            text = json.dumps(spec.to_dict(), sort_keys=True)
            if len(self._texts) >= self.KEPT:
                self._texts.clear()
            self._texts[spec] = text
        return text


def allocation_record(row: Mapping[str, Any], specs: SpecCodec | None = None) -> AllocationRecord:
    """The record of an allocation row (a Core row's mapping)."""
    get = row.__getitem__
    text = get("spec_json")
    return AllocationRecord(
        id=get("id"),
        key=get("key"),
        spec=specs.load(text) if specs else AllocationSpec.from_dict(json.loads(text)),
        state=AllocationState(get("state")),
        reason=get("reason"),
        nodes=_names(get("nodes_json")),
        spares=_names(get("spares_json")),
        domains=_names(get("domains_json")),
        submitted=get("submitted"),
        created_at=get("created_at"),
        updated_at=get("updated_at"),
        created_by=get("created_by"),
    )


def _allocation_values(alloc: AllocationRecord, specs: SpecCodec) -> dict[str, Any]:
    return {
        "id": alloc.id,
        "key": alloc.key,
        "spec_json": specs.dump(alloc.spec),
        "state": alloc.state.value,
        "reason": alloc.reason,
        "nodes_json": json.dumps(alloc.nodes),
        "spares_json": json.dumps(alloc.spares),
        "domains_json": json.dumps(alloc.domains),
        "queue": alloc.spec.queue or "default",
        "priority": alloc.spec.priority,
        "submitted": alloc.submitted,
        "created_at": alloc.created_at,
        "updated_at": alloc.updated_at,
        "created_by": alloc.created_by,
    }


_EVENT_PLAIN = tuple(f.name for f in dataclasses.fields(EventInfo) if f.name not in ("seq", "data"))


# As ``json.dumps(data, sort_keys=True, default=str)`` wrote it, compact: a
# dataclass or a datetime is written by ``str`` too, keys sorted, a non-str
# key as a string.
_EVENT_JSON = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_NON_STR_KEYS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)


def event_data_json(data: Mapping[str, Any]) -> str:
    """An event's data as stored: by orjson (1.6 us less an event, several
    events a unit of work), else by ``json`` for what orjson refuses (an
    integer past 64 bits)."""
    try:
        return orjson.dumps(data, default=str, option=_EVENT_JSON).decode()
    except TypeError:
        return json.dumps(data, sort_keys=True, default=str)


def event_info(row: Any) -> EventInfo:
    """The event of an ORM ``EventRow`` or a Core row."""
    return EventInfo(
        seq=int(row.seq or 0),
        data=json.loads(row.data_json or "{}"),
        **{name: getattr(row, name) for name in _EVENT_PLAIN},
    )


_TOKEN_PLAIN = tuple(f.name for f in dataclasses.fields(TokenRecord) if f.name != "role")


def token_record(row: TokenRow) -> TokenRecord:
    return TokenRecord(role=Role(row.role), **{name: getattr(row, name) for name in _TOKEN_PLAIN})


def _copy_token(token: TokenRecord, row: TokenRow) -> None:
    for name in _TOKEN_PLAIN:
        setattr(row, name, getattr(token, name))
    row.role = token.role.value


# -- repositories -----------------------------------------------------------------

_IN_CHUNK = 900  # names bound in one IN (...): under SQLite's oldest limit of 999


# Nodes and allocations are read and written through SQLAlchemy Core, with
# statements built once: the ORM's identity map and unit of work cost several
# times the statement itself, and every scheduling pass, admission and release
# reads and saves them. Each repository keeps the columns it last read or
# wrote per row (``_stored``), so a save sends only what changed; in a write
# transaction those are the writer's rows (``writer_rows.py``), so a get by
# key of a row the writer already knows needs no SELECT.
_NODES = NodeRow.__table__  # type: ignore[attr-defined]
_ALLOCATIONS = AllocationRow.__table__  # type: ignore[attr-defined]
_NODE_COLUMNS = tuple(c for c in _NODES.c if c.name != "bmc_password")
_NODE_BARE = tuple(c for c in _NODE_COLUMNS if c.name != "health_json")
_NODE_SELECT = {True: core_select(*_NODE_COLUMNS), False: core_select(*_NODE_BARE)}
_NODE_BY_NAME = {
    health: stmt.where(_NODES.c.name == bindparam("b_name"))
    for health, stmt in _NODE_SELECT.items()
}
_NODES_HELD_BY = {
    health: stmt.where(_NODES.c.allocation_id == bindparam("b_allocation")).order_by(_NODES.c.name)
    for health, stmt in _NODE_SELECT.items()
}
_NODE_PASSWORD = core_select(_NODES.c.bmc_password).where(_NODES.c.name == bindparam("b_name"))
_NODE_PASSWORDS = core_select(_NODES.c.name, _NODES.c.bmc_password).where(
    _NODES.c.name.in_(bindparam("b_names", expanding=True))
)
# SET names the columns of the parameters given (the changed ones).
_NODE_UPDATE = update(_NODES).where(_NODES.c.name == bindparam("b_name"))
_NODE_INSERT = insert(_NODES)
# The write-behind's statements (``save_health_batch``), for the driver.
_HEALTH_UPDATE = "UPDATE nodes SET health_json = ?, agent_last_seen = ? WHERE name = ?"
_SIGHTING_UPDATE = "UPDATE nodes SET agent_last_seen = ? WHERE name = ?"
_NODE_DELETE = delete(_NODES).where(_NODES.c.name == bindparam("b_name"))
_NODE_NAMES_IN = core_select(_NODES.c.name).where(
    _NODES.c.name.in_(bindparam("b_names", expanding=True))
)
_LEAK_LOOKS = LeakLookRow.__table__  # type: ignore[attr-defined]
_LEAK_LOOK_SELECT = core_select(
    _LEAK_LOOKS.c.node, _LEAK_LOOKS.c.bmc_url, _LEAK_LOOKS.c.none_at, _LEAK_LOOKS.c.none_streak
)
_LEAK_LOOKS_DELETE = delete(_LEAK_LOOKS).where(
    _LEAK_LOOKS.c.node.in_(bindparam("b_names", expanding=True))
)
_LEAK_LOOK_DELETE = delete(_LEAK_LOOKS).where(_LEAK_LOOKS.c.node == bindparam("b_name"))
_LEAK_LOOK_INSERT = insert(_LEAK_LOOKS)
_ALLOCATION_SELECT = core_select(_ALLOCATIONS)
_ALLOCATION_BY_ID = _ALLOCATION_SELECT.where(_ALLOCATIONS.c.id == bindparam("b_id"))
_ALLOCATION_BY_KEY = _ALLOCATION_SELECT.where(_ALLOCATIONS.c.key == bindparam("b_key"))
_LAST_SUBMITTED = core_select(func.max(_ALLOCATIONS.c.submitted))


class SqlNodes:
    def __init__(self, link: Link, secrets: SecretBox, rows: TableRows | None = None) -> None:
        self._session = link  # the ORM's calls, forwarded; Core's on its connection()
        self._secrets = secrets
        self._connection: Connection | None = None
        # Columns as last read or written (no health, no password).
        self._stored = rows if rows is not None else TableRows()
        # What this transaction saved, for the in-memory view once it commits
        # (``controller.core.node_view``): each record as of its last save.
        self._saved: dict[str, NodeRecord] = {}
        self._gpus_set: dict[str, tuple[GpuInfo, ...]] = {}
        self._removed: set[str] = set()

    def _conn(self) -> Connection:
        """The session's own connection (its transaction), past the ORM."""
        if self._connection is None:
            self._connection = self._session.connection()
        return self._connection

    def _execute(self, statement: Any, params: Any = None) -> Any:
        return self._conn().execute(statement, params)

    def changes(self) -> NodeChanges:
        return NodeChanges(saved=self._saved, gpus=self._gpus_set, removed=frozenset(self._removed))

    def remove(self, name: str) -> None:
        for gpu in self._session.exec(select(GpuRow).where(GpuRow.node == name)):
            self._session.delete(gpu)
        for token in self._session.exec(select(TokenRow).where(TokenRow.node == name)):
            self._session.delete(token)  # its agent's tokens go with it
        self._session.flush()
        self._execute(_LEAK_LOOK_DELETE, {"b_name": name})
        self._execute(_NODE_DELETE, {"b_name": name})
        self._stored.remove(name)
        self._saved.pop(name, None)
        self._gpus_set.pop(name, None)
        self._removed.add(name)

    def _keep(self, node: NodeRecord) -> None:
        # Health is not the view's: the latest lives in memory (core/live.py).
        values = list(_NODE_FIELDS(node))
        values[_NODE_HEALTH_AT] = None
        self._saved[node.name] = NodeRecord(*values)

    def _records(self, rows: Any, *, with_health: bool = True) -> list[NodeRecord]:
        found = []
        for row in rows:
            values = row._asdict()
            found.append(node_record(values, with_health=with_health))
            values.pop("health_json", None)
            self._stored[values["name"]] = values
        return found

    def get(self, name: str, *, with_health: bool = True) -> NodeRecord | None:
        if not with_health:
            known = self._stored.get(name)
            if known is not None:
                return node_record(known, with_health=False)
        rows = self._execute(_NODE_BY_NAME[with_health], {"b_name": name})
        found = self._records(rows, with_health=with_health)
        return found[0] if found else None

    def find(
        self, *, rack: str = "", state: NodeState | None = None, with_health: bool = True
    ) -> list[NodeRecord]:
        stmt = _NODE_SELECT[with_health]
        if rack:
            stmt = stmt.where(_NODES.c.rack == rack)
        if state is not None:
            stmt = stmt.where(_NODES.c.state == state.value)
        rows = self._execute(stmt.order_by(_NODES.c.name))
        return self._records(rows, with_health=with_health)

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
        # Keyset on the primary key: WHERE name > :after ORDER BY name LIMIT :n.
        stmt = _NODE_SELECT[True].where(_NODES.c.name > after)
        if rack:
            stmt = stmt.where(_NODES.c.rack == rack)
        if state is not None:
            stmt = stmt.where(_NODES.c.state == state.value)
        if gpu_model:
            stmt = stmt.where(_NODES.c.gpu_model == gpu_model)
        if allocation:
            stmt = stmt.where(_NODES.c.allocation_id == allocation)
        stmt = stmt.order_by(_NODES.c.name).limit(max(0, limit))
        return self._records(self._execute(stmt))

    def held_by(
        self, allocation: str, *, with_health: bool = True, members: Sequence[str] = ()
    ) -> list[NodeRecord]:
        if members and not with_health:
            # The writer's rows, when it holds every member's (a release
            # reads the nodes its admission wrote): no query.
            known = [self._stored.get(name) for name in members]
            if all(row is not None for row in known):
                return [
                    node_record(row, with_health=False)
                    for row in known
                    if row is not None and row["allocation_id"] == allocation
                ]
        rows = self._execute(_NODES_HELD_BY[with_health], {"b_allocation": allocation})
        return self._records(rows, with_health=with_health)

    def find_by_bmc_url(self, url: str) -> list[NodeRecord]:
        stmt = _NODE_SELECT[True].where(_NODES.c.bmc_url == url).order_by(_NODES.c.name)
        return self._records(self._execute(stmt))

    def add(self, node: NodeRecord, bmc_password: str) -> None:
        values = _node_values(node)
        self._execute(
            _NODE_INSERT,
            {**values, "bmc_password": self._secrets.seal(bmc_password), "health_json": ""},
        )
        self._stored[node.name] = values
        self._keep(node)

    def set_credentials(self, node: NodeRecord, username: str, bmc_password: str) -> None:
        node.bmc_username = username
        self.save(node)
        sealed = self._secrets.seal(bmc_password)
        self._execute(_NODE_UPDATE, {"b_name": node.name, "bmc_password": sealed})

    def save(self, node: NodeRecord) -> None:
        stored = self._stored.get(node.name)
        if stored is None:
            if self.get(node.name, with_health=False) is None:
                raise KeyError(f"node {node.name!r} was never added")
            stored = self._stored[node.name]
        changed = _changed(stored, _node_values(node))
        if changed:
            update_row(self._conn(), "nodes", ("name", node.name), changed)
            stored.update(changed)
        self._keep(node)

    def save_health(self, name: str, health: HealthReport, seen_at: float) -> NodeRecord | None:
        values = {"health_json": health_to_json(health), "agent_last_seen": seen_at}
        if not self._execute(_NODE_UPDATE, {"b_name": name, **values}).rowcount:
            return None
        self._stored.touch(name, agent_last_seen=seen_at)
        return self.get(name)

    def save_health_batch(self, samples: Sequence[HealthSample]) -> int:
        # On the driver's cursor, past SQLAlchemy: at a real fleet's pace
        # every report is a row of the next flush (25,000 agents at 10 s:
        # 2,500 rows a second), and Core's parameter processing cost as much
        # as the row's JSON (15 us a row against 2). Two executemany UPDATEs
        # by name: sightings keep the stored report.
        names = [s.node for s in samples]
        known = set(self._execute(_NODE_NAMES_IN, {"b_names": names}).scalars())
        reports: list[tuple[str, float, str]] = []
        sightings: list[tuple[float, str]] = []
        touch = self._stored.touch
        for s in samples:
            if s.node not in known:
                continue
            if s.packed is None:
                sightings.append((s.seen_at, s.node))
            else:
                reports.append((packed_to_json(s.packed), s.seen_at, s.node))
            touch(s.node, agent_last_seen=s.seen_at)
        if reports:
            self._executemany(_HEALTH_UPDATE, reports)
        if sightings:
            self._executemany(_SIGHTING_UPDATE, sightings)
        return len(reports) + len(sightings)

    def _executemany(self, sql: str, rows: list[Any]) -> None:
        """``sql`` (``?`` for each parameter) once per row, on the driver's
        cursor in this transaction."""
        execute_many(self._conn(), sql, rows)

    def leak_looks(self) -> dict[str, LeakLook]:
        return {
            node: LeakLook(url, at, streak)
            for node, url, at, streak in self._execute(_LEAK_LOOK_SELECT).tuples()
        }

    def save_leak_looks(self, looks: Mapping[str, LeakLook | None]) -> None:
        # Replaced a chunk of names at a time: a DELETE of the chunk's rows,
        # then one executemany INSERT of those still looked at (the same on
        # SQLite and PostgreSQL, no upsert dialect).
        names = list(looks)
        for start in range(0, len(names), _IN_CHUNK):
            chunk = names[start : start + _IN_CHUNK]
            self._execute(_LEAK_LOOKS_DELETE, {"b_names": chunk})
            kept = {n: look for n in chunk if (look := looks[n]) is not None}
            if not kept:
                continue
            known = set(self._execute(_NODE_NAMES_IN, {"b_names": list(kept)}).scalars())
            rows = [
                {
                    "node": n,
                    "bmc_url": look.bmc_url,
                    "none_at": look.none_at,
                    "none_streak": look.none_streak,
                }
                for n, look in kept.items()
                if n in known
            ]
            if rows:
                self._execute(_LEAK_LOOK_INSERT, rows)

    def bmc_target(self, node: NodeRecord) -> BmcTarget:
        sealed = self._execute(_NODE_PASSWORD, {"b_name": node.name}).scalar()
        return self._target(node, sealed or "")

    def bmc_targets(self, nodes: Sequence[NodeRecord]) -> list[BmcTarget]:
        # One SELECT a chunk of names, not one a node: 25,000 one-row reads
        # were 1.1 s of CPU a power sync pass.
        names = [n.name for n in nodes]
        sealed: dict[str, str] = {}
        for start in range(0, len(names), _IN_CHUNK):
            params = {"b_names": names[start : start + _IN_CHUNK]}
            sealed.update(iter(self._execute(_NODE_PASSWORDS, params).tuples()))
        return [self._target(n, sealed.get(n.name) or "") for n in nodes]

    def _target(self, node: NodeRecord, sealed: str) -> BmcTarget:
        return node.bmc_target(self._secrets.open(sealed))

    def gpus(self, name: str) -> list[GpuInfo]:
        stmt = select(GpuRow).where(GpuRow.node == name).order_by(col(GpuRow.index))
        return [gpu_info(g) for g in self._session.exec(stmt)]

    def gpus_by_node(self) -> dict[str, list[GpuInfo]]:
        # Plain column tuples, not ORM rows: 160,000 GPUs (a 25,000-node
        # fleet, read at start) took 4.3 s as ORM rows, 1.0 s as tuples.
        by_node: dict[str, list[GpuInfo]] = defaultdict(list)
        stmt = select(col(GpuRow.node), *_gpu_columns()).order_by(
            col(GpuRow.node), col(GpuRow.index)
        )
        for node, *values in self._session.execute(stmt):
            by_node[node].append(GpuInfo(*values))
        return dict(by_node)

    def gpus_of(self, names: Collection[str]) -> dict[str, list[GpuInfo]]:
        # Plain column tuples, not ORM rows: a page holds thousands of GPUs.
        wanted = sorted(set(names))
        columns = _gpu_columns()
        by_node: dict[str, list[GpuInfo]] = defaultdict(list)
        for start in range(0, len(wanted), _IN_CHUNK):
            stmt = (
                select(col(GpuRow.node), *columns)
                .where(col(GpuRow.node).in_(wanted[start : start + _IN_CHUNK]))
                .order_by(col(GpuRow.node), col(GpuRow.index))
            )
            for node, *values in self._session.execute(stmt):
                by_node[node].append(GpuInfo(*values))
        return dict(by_node)

    def set_gpus(self, name: str, gpus: Sequence[GpuInfo]) -> None:
        old = list(self._session.exec(select(GpuRow).where(GpuRow.node == name)))
        inventory = tuple(sorted(gpus, key=lambda g: g.index))
        self._gpus_set[name] = inventory
        if sorted((gpu_info(r) for r in old), key=lambda g: g.index) == list(inventory):
            return  # the same GPUs again (an agent reconnecting): nothing to write
        for row in old:
            self._session.delete(row)
        self._session.flush()
        for g in inventory:  # GpuInfo and GpuRow share their field names
            self._session.add(GpuRow(node=name, **dataclasses.asdict(g)))


class SqlAllocations:
    def __init__(
        self, link: Link, rows: TableRows | None = None, specs: SpecCodec | None = None
    ) -> None:
        self._session = link
        self._specs = specs or SpecCodec()
        self._connection: Connection | None = None
        self._stored = rows if rows is not None else TableRows()  # as last read or written
        # Each allocation added or saved, as of its last save: what the
        # commit tells the in-memory view (``core/allocation_view.py``).
        self.saved: dict[str, AllocationRecord] = {}

    def _conn(self) -> Connection:
        if self._connection is None:
            self._connection = self._session.connection()
        return self._connection

    def _execute(self, statement: Any, params: Any = None) -> Any:
        return self._conn().execute(statement, params)

    def _records(self, rows: Any) -> list[AllocationRecord]:
        found = []
        for row in rows:
            values = row._asdict()
            self._stored[values["id"]] = values
            found.append(allocation_record(values, self._specs))
        return found

    def get(self, ident: str) -> AllocationRecord | None:
        known = self._stored.get(ident)
        if known is not None:
            return allocation_record(known, self._specs)
        found = self._records(self._execute(_ALLOCATION_BY_ID, {"b_id": ident}))
        return found[0] if found else None

    def by_key(self, key: str) -> AllocationRecord | None:
        found = self._records(self._execute(_ALLOCATION_BY_KEY, {"b_key": key}))
        return found[0] if found else None

    def find(self, states: Collection[AllocationState] | None = None) -> list[AllocationRecord]:
        stmt = _ALLOCATION_SELECT.order_by(_ALLOCATIONS.c.submitted)
        if states is not None:
            stmt = stmt.where(_ALLOCATIONS.c.state.in_([s.value for s in states]))
        return self._records(self._execute(stmt))

    def page(
        self,
        after: tuple[int, str],
        limit: int,
        *,
        states: Collection[AllocationState] | None = None,
    ) -> list[AllocationRecord]:
        # Keyset on (submitted, id): two allocations may share a queue position.
        submitted, ident = after
        table = _ALLOCATIONS.c
        later = table.submitted > submitted
        same = and_(table.submitted == submitted, table.id > ident)
        stmt = _ALLOCATION_SELECT.where(or_(later, same))
        if states is not None:
            stmt = stmt.where(table.state.in_([s.value for s in states]))
        stmt = stmt.order_by(table.submitted, table.id).limit(max(0, limit))
        return self._records(self._execute(stmt))

    def add(self, allocation: AllocationRecord) -> None:
        values = _allocation_values(allocation, self._specs)
        insert_rows(self._conn(), "allocations", tuple(values), [tuple(values.values())])
        self._stored[allocation.id] = values
        self.saved[allocation.id] = frozen_copy(allocation)

    def save(self, allocation: AllocationRecord) -> None:
        stored = self._stored.get(allocation.id)
        if stored is None:
            if self.get(allocation.id) is None:
                raise KeyError(f"allocation {allocation.id!r} was never added")
            stored = self._stored[allocation.id]
        changed = _changed(stored, _allocation_values(allocation, self._specs))
        if changed:
            update_row(self._conn(), "allocations", ("id", allocation.id), changed)
            stored.update(changed)
        self.saved[allocation.id] = frozen_copy(allocation)

    def last_submitted(self) -> int:
        return int(self._execute(_LAST_SUBMITTED).scalar() or 0)


_EVENTS = EventRow.__table__  # type: ignore[attr-defined]
# A new event's columns, in the order ``SqlEvents.flush`` sends them.
_EVENT_COLUMNS = (*_EVENT_PLAIN, "data_json", "published")


def _events_since(node: bool, allocation: bool, kinds: bool) -> Any:
    stmt = core_select(_EVENTS).where(_EVENTS.c.seq > bindparam("b_after"))
    if node:
        stmt = stmt.where(_EVENTS.c.node == bindparam("b_node"))
    if allocation:
        stmt = stmt.where(_EVENTS.c.allocation == bindparam("b_allocation"))
    if kinds:
        stmt = stmt.where(_EVENTS.c.kind.in_(bindparam("b_kinds", expanding=True)))
    return stmt.order_by(_EVENTS.c.seq).limit(bindparam("b_limit"))


# Each filter's statement, built once: (node, allocation, kinds) given.
_EVENTS_SINCE = {
    (n, a, k): _events_since(n, a, k)
    for n in (False, True)
    for a in (False, True)
    for k in (False, True)
}


class SqlEvents:
    """Events are written as plain rows in one INSERT per unit of work (not
    ORM objects: a create/release cycle records five or six), sent before
    any read of events in the same transaction and before it commits."""

    def __init__(self, link: Link, rows: list[dict[str, Any]] | None = None) -> None:
        self._session = link
        # Rows not sent yet. A group commit's units share one list, so the
        # group's events go in one INSERT; the first read of events sends
        # what is waiting, so a unit reads the events of those before it.
        self._rows: list[dict[str, Any]] = [] if rows is None else rows
        self.added = 0

    def add(self, event: NewEvent) -> None:
        row = {name: getattr(event, name) for name in _EVENT_PLAIN}
        row["kind"] = str(event.kind)
        row["data_json"] = event_data_json(event.data)
        row["published"] = False
        self._rows.append(row)
        self.added += 1

    def flush(self) -> None:
        """Send the events added so far (the store calls it before commit)."""
        if self._rows:
            rows = list(self._rows)
            self._rows.clear()  # the list may be shared: emptied, not replaced
            # On the session's connection, past the ORM's bulk machinery
            # and Core's parameter processing.
            insert_rows(
                self._session.connection(),
                "events",
                _EVENT_COLUMNS,
                [[row[c] for c in _EVENT_COLUMNS] for row in rows],
            )

    def _read(self, stmt: Any) -> list[EventInfo]:
        """Plain rows on the session's connection (no ORM objects: a
        release's report reads its allocation's events)."""
        self.flush()
        return [event_info(row) for row in self._session.connection().execute(stmt)]

    def since(
        self,
        after_seq: int,
        *,
        node: str = "",
        allocation: str = "",
        kinds: Collection[EventKind] = (),
        limit: int = 500,
    ) -> list[EventInfo]:
        self.flush()
        stmt = _EVENTS_SINCE[bool(node), bool(allocation), bool(kinds)]
        params = {
            "b_after": after_seq,
            "b_node": node,
            "b_allocation": allocation,
            "b_kinds": [str(k) for k in kinds],
            "b_limit": limit,
        }
        return [event_info(row) for row in self._session.connection().execute(stmt, params)]

    def newest(self, limit: int, *, node: str = "") -> list[EventInfo]:
        stmt = core_select(_EVENTS)
        if node:
            stmt = stmt.where(_EVENTS.c.node == node)
        return list(reversed(self._read(stmt.order_by(_EVENTS.c.seq.desc()).limit(limit))))

    def recent(self, kind: EventKind, since_at: float) -> list[EventInfo]:
        stmt = core_select(_EVENTS).where(_EVENTS.c.kind == str(kind), _EVENTS.c.at >= since_at)
        return self._read(stmt.order_by(_EVENTS.c.seq))

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
        self.flush()
        stmt = core_select(_EVENTS).where(_EVENTS.c.kind == str(kind), _EVENTS.c.at >= since_at)
        if node:
            stmt = stmt.where(_EVENTS.c.node == node)
        if allocation:
            stmt = stmt.where(_EVENTS.c.allocation == allocation)
        stmt = stmt.order_by(_EVENTS.c.seq.desc()).execution_options(yield_per=200)
        found: list[EventInfo] = []
        for row in self._session.connection().execute(stmt):
            event = event_info(row)
            if where is None or where(event):
                found.append(event)
                if len(found) >= limit:
                    break
        found.reverse()
        return found

    def backlog(self) -> tuple[int, float | None]:
        """Unpublished events: how many, and when the oldest was recorded."""
        self.flush()
        pending = col(EventRow.published).is_(False)
        count = self._session.exec(select(func.count()).select_from(EventRow).where(pending)).one()
        oldest = self._session.exec(select(func.min(EventRow.at)).where(pending)).one()
        return int(count or 0), (float(oldest) if oldest is not None else None)

    def unpublished(self, limit: int) -> list[EventRow]:
        self.flush()
        stmt = (
            select(EventRow)
            .where(col(EventRow.published).is_(False))
            .order_by(col(EventRow.seq))
            .limit(limit)
        )
        return list(self._session.exec(stmt))

    def mark_published(self, seqs: Sequence[int]) -> None:
        self._session.exec(  # type: ignore[call-overload]
            update(EventRow).where(col(EventRow.seq).in_(list(seqs))).values(published=True)
        )


class SqlTokens:
    def __init__(self, link: Link) -> None:
        self._session = link

    def get(self, token_id: str) -> TokenRecord | None:
        row = self._session.get(TokenRow, token_id)
        return token_record(row) if row is not None else None

    def by_name(self, name: str) -> TokenRecord | None:
        row = self._session.exec(select(TokenRow).where(TokenRow.name == name)).first()
        return token_record(row) if row is not None else None

    def find(self, *, include_revoked: bool = False) -> list[TokenRecord]:
        stmt = select(TokenRow).order_by(col(TokenRow.name))
        if not include_revoked:
            stmt = stmt.where(TokenRow.revoked_at == 0)
        return [token_record(r) for r in self._session.exec(stmt)]

    def add(self, token: TokenRecord) -> None:
        row = TokenRow(id=token.id, name=token.name, role=token.role.value, secret_hash="")
        _copy_token(token, row)
        self._session.add(row)
        self._session.flush()

    def save(self, token: TokenRecord) -> None:
        row = self._session.get(TokenRow, token.id)
        if row is None:
            raise KeyError(f"token {token.name!r} was never added")
        _copy_token(token, row)
        self._session.add(row)

    def delete(self, token_id: str) -> None:
        row = self._session.get(TokenRow, token_id)
        if row is not None:
            self._session.delete(row)
            self._session.flush()
