"""The core's repositories (``controller.core.ports``) on SQLModel tables.

Rows and records meet here and nowhere else: every ``*_json`` column is
parsed and written in this module, states become enums on the way in, and a
node's BMC password is sealed on the way in and opened only for a
``BmcTarget``. Each repository works inside the one ``Session`` of the
transaction it belongs to.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import and_, func, insert, or_
from sqlmodel import Session, SQLModel, col, select, update

from controller.core.allocation_view import frozen_copy
from controller.core.health import GpuHealth, HealthReport, HealthSample
from controller.core.identity import Role, TokenRecord
from controller.core.kinds import EventKind
from controller.core.model import AllocationSpec, BmcTarget, EventInfo, GpuInfo, ProvisionOp
from controller.core.node_view import NodeChanges
from controller.core.records import AllocationRecord, NewEvent, NodeRecord
from controller.core.states import AllocationState, NodeKind, NodeState, PowerState
from controller.store.models import AllocationRow, EventRow, GpuRow, NodeRow, TokenRow
from controller.store.secrets import SecretBox

# -- JSON columns --------------------------------------------------------------

_GPU_HEALTH_FIELDS = {f.name: f for f in dataclasses.fields(GpuHealth)}
_GPU_HEALTH_LISTS = {n for n, f in _GPU_HEALTH_FIELDS.items() if str(f.type).startswith("tuple")}


_GPU_HEALTH_NAMES = tuple(_GPU_HEALTH_FIELDS)


def health_to_json(health: HealthReport | None) -> str:
    """The same document ``dataclasses.asdict`` gives (tuples as lists), built
    flat: the write-behind serialises every reporting node each flush, and
    ``asdict``'s recursive copy was most of its cost."""
    if health is None:
        return ""
    gpus = [{name: getattr(g, name) for name in _GPU_HEALTH_NAMES} for g in health.gpus]
    return json.dumps(
        {
            "sampled_at": health.sampled_at,
            "source": health.source,
            "gpus": gpus,
            "bmc_temps_c": health.bmc_temps_c,
            "drift": health.drift,
        }
    )


def health_from_json(text: str) -> HealthReport | None:
    if not text:
        return None
    data = json.loads(text)
    gpus = []
    for g in data.get("gpus") or []:
        values = {k: v for k, v in g.items() if k in _GPU_HEALTH_FIELDS}
        for name in _GPU_HEALTH_LISTS & values.keys():
            values[name] = tuple(values[name] or ())
        gpus.append(GpuHealth(**values))
    return HealthReport(
        sampled_at=float(data.get("sampled_at") or 0.0),
        source=str(data.get("source") or "agent"),
        gpus=tuple(gpus),
        bmc_temps_c=tuple(data.get("bmc_temps_c") or ()),
        drift=tuple(data.get("drift") or ()),
    )


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


def node_record(row: NodeRow, *, with_health: bool = True) -> NodeRecord:
    return NodeRecord(
        **{name: getattr(row, name) for name in _NODE_PLAIN},
        state=NodeState(row.state),
        power=PowerState(row.power) if row.power in _POWER_STATES else PowerState.UNKNOWN,
        expected_power=PowerState(row.expected_power) if row.expected_power else None,
        health=health_from_json(row.health_json) if with_health else None,
        drain_target=NodeState(row.drain_target) if row.drain_target else None,
        allocation_profile=row.allocation_profile or None,
        provision=_provision(row.provision_json),
        kind=NodeKind(row.kind or NodeKind.COMPUTE),
    )


def _set_changed(row: SQLModel, values: dict[str, Any]) -> None:
    """Set only the columns whose value differs: SQLModel's attribute setter
    costs microseconds each, and a save usually changes two or three of a
    row's thirty columns (the UPDATE names only those either way)."""
    for name, value in values.items():
        if getattr(row, name) != value:
            setattr(row, name, value)


def _copy_node(node: NodeRecord, row: NodeRow) -> None:
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
    _set_changed(row, values)


def _provision(text: str) -> ProvisionOp | None:
    """The stored provisioning operation; None when there is none."""
    return ProvisionOp.from_dict(json.loads(text)) if text else None


_GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuInfo))


def gpu_info(row: GpuRow) -> GpuInfo:
    return GpuInfo(**{f.name: getattr(row, f.name) for f in dataclasses.fields(GpuInfo)})


def allocation_record(row: AllocationRow) -> AllocationRecord:
    return AllocationRecord(
        id=row.id,
        key=row.key,
        spec=AllocationSpec.from_dict(json.loads(row.spec_json)),
        state=AllocationState(row.state),
        reason=row.reason,
        nodes=_names(row.nodes_json),
        spares=_names(row.spares_json),
        domains=_names(row.domains_json),
        submitted=row.submitted,
        created_at=row.created_at,
        updated_at=row.updated_at,
        created_by=row.created_by,
    )


def _copy_allocation(alloc: AllocationRecord, row: AllocationRow) -> None:
    _set_changed(
        row,
        {
            "key": alloc.key,
            "spec_json": json.dumps(alloc.spec.to_dict(), sort_keys=True),
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
        },
    )


_EVENT_PLAIN = tuple(f.name for f in dataclasses.fields(EventInfo) if f.name not in ("seq", "data"))


def event_info(row: EventRow) -> EventInfo:
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


class SqlNodes:
    def __init__(self, session: Session, secrets: SecretBox) -> None:
        self._session = session
        self._secrets = secrets
        # What this transaction saved, for the in-memory view once it commits
        # (``controller.core.node_view``): each record as of its last save.
        self._saved: dict[str, NodeRecord] = {}
        self._gpus_set: dict[str, tuple[GpuInfo, ...]] = {}
        self._removed: set[str] = set()

    def changes(self) -> NodeChanges:
        return NodeChanges(saved=self._saved, gpus=self._gpus_set, removed=frozenset(self._removed))

    def remove(self, name: str) -> None:
        for gpu in self._session.exec(select(GpuRow).where(GpuRow.node == name)):
            self._session.delete(gpu)
        for token in self._session.exec(select(TokenRow).where(TokenRow.node == name)):
            self._session.delete(token)  # its agent's tokens go with it
        self._session.flush()
        row = self._row(name)
        if row is not None:
            self._session.delete(row)
            self._session.flush()
        self._saved.pop(name, None)
        self._gpus_set.pop(name, None)
        self._removed.add(name)

    def _keep(self, node: NodeRecord) -> None:
        # Health is not the view's: the latest lives in memory (core/live.py).
        self._saved[node.name] = dataclasses.replace(node, health=None)

    def _row(self, name: str) -> NodeRow | None:
        return self._session.get(NodeRow, name)

    def get(self, name: str) -> NodeRecord | None:
        row = self._row(name)
        return node_record(row) if row is not None else None

    def find(
        self, *, rack: str = "", state: NodeState | None = None, with_health: bool = True
    ) -> list[NodeRecord]:
        stmt = select(NodeRow)
        if rack:
            stmt = stmt.where(NodeRow.rack == rack)
        if state is not None:
            stmt = stmt.where(NodeRow.state == state.value)
        rows = self._session.exec(stmt.order_by(col(NodeRow.name)))
        return [node_record(r, with_health=with_health) for r in rows]

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
        stmt = select(NodeRow).where(col(NodeRow.name) > after)
        if rack:
            stmt = stmt.where(NodeRow.rack == rack)
        if state is not None:
            stmt = stmt.where(NodeRow.state == state.value)
        if gpu_model:
            stmt = stmt.where(NodeRow.gpu_model == gpu_model)
        if allocation:
            stmt = stmt.where(NodeRow.allocation_id == allocation)
        stmt = stmt.order_by(col(NodeRow.name)).limit(max(0, limit))
        return [node_record(r) for r in self._session.exec(stmt)]

    def held_by(self, allocation: str) -> list[NodeRecord]:
        stmt = select(NodeRow).where(NodeRow.allocation_id == allocation)
        return [node_record(r) for r in self._session.exec(stmt.order_by(col(NodeRow.name)))]

    def find_by_bmc_url(self, url: str) -> list[NodeRecord]:
        stmt = select(NodeRow).where(NodeRow.bmc_url == url).order_by(col(NodeRow.name))
        return [node_record(r) for r in self._session.exec(stmt)]

    def add(self, node: NodeRecord, bmc_password: str) -> None:
        row = NodeRow(name=node.name, bmc_url=node.bmc_url)
        _copy_node(node, row)
        row.bmc_password = self._secrets.seal(bmc_password)
        self._session.add(row)
        self._session.flush()
        self._keep(node)

    def set_credentials(self, node: NodeRecord, username: str, bmc_password: str) -> None:
        node.bmc_username = username
        self.save(node)
        row = self._row(node.name)
        assert row is not None  # save raised otherwise
        row.bmc_password = self._secrets.seal(bmc_password)

    def save(self, node: NodeRecord) -> None:
        row = self._row(node.name)
        if row is None:
            raise KeyError(f"node {node.name!r} was never added")
        _copy_node(node, row)
        self._session.add(row)
        self._keep(node)

    def save_health(self, name: str, health: HealthReport, seen_at: float) -> NodeRecord | None:
        row = self._row(name)
        if row is None:
            return None
        row.health_json = health_to_json(health)
        row.agent_last_seen = seen_at
        self._session.add(row)
        return node_record(row)

    def save_health_batch(self, samples: Sequence[HealthSample]) -> int:
        names = [s.node for s in samples]
        known = set(self._session.exec(select(NodeRow.name).where(col(NodeRow.name).in_(names))))
        rows: list[dict[str, object]] = []
        for s in samples:
            if s.node in known:
                row: dict[str, object] = {"name": s.node, "agent_last_seen": s.seen_at}
                if s.health is not None:
                    row["health_json"] = health_to_json(s.health)
                rows.append(row)
        if rows:
            # An ORM bulk UPDATE by primary key: one executemany, no row loaded.
            self._session.execute(update(NodeRow), rows)
        return len(rows)

    def bmc_target(self, node: NodeRecord) -> BmcTarget:
        row = self._row(node.name)
        sealed = row.bmc_password if row is not None else ""
        return BmcTarget(
            node=node.name,
            url=node.bmc_url,
            username=node.bmc_username,
            password=self._secrets.open(sealed),
            insecure=node.bmc_insecure,
            ca_bundle=node.bmc_ca_bundle,
        )

    def gpus(self, name: str) -> list[GpuInfo]:
        stmt = select(GpuRow).where(GpuRow.node == name).order_by(col(GpuRow.index))
        return [gpu_info(g) for g in self._session.exec(stmt)]

    def gpus_by_node(self) -> dict[str, list[GpuInfo]]:
        by_node: dict[str, list[GpuInfo]] = defaultdict(list)
        for g in self._session.exec(select(GpuRow).order_by(col(GpuRow.index))):
            by_node[g.node].append(gpu_info(g))
        return dict(by_node)

    def gpus_of(self, names: Collection[str]) -> dict[str, list[GpuInfo]]:
        # Plain column tuples, not ORM rows: a page holds thousands of GPUs.
        wanted = sorted(set(names))
        columns = [col(getattr(GpuRow, name)) for name in _GPU_FIELDS]
        by_node: dict[str, list[GpuInfo]] = defaultdict(list)
        for start in range(0, len(wanted), _IN_CHUNK):
            stmt = (
                select(col(GpuRow.node), *columns)
                .where(col(GpuRow.node).in_(wanted[start : start + _IN_CHUNK]))
                .order_by(col(GpuRow.node), col(GpuRow.index))
            )
            for node, *values in self._session.execute(stmt):
                by_node[node].append(GpuInfo(**dict(zip(_GPU_FIELDS, values, strict=True))))
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
    def __init__(self, session: Session) -> None:
        self._session = session
        # Each allocation added or saved, as of its last save: what the
        # commit tells the in-memory view (``core/allocation_view.py``).
        self.saved: dict[str, AllocationRecord] = {}

    def get(self, ident: str) -> AllocationRecord | None:
        row = self._session.get(AllocationRow, ident)
        return allocation_record(row) if row is not None else None

    def by_key(self, key: str) -> AllocationRecord | None:
        row = self._session.exec(select(AllocationRow).where(AllocationRow.key == key)).first()
        return allocation_record(row) if row is not None else None

    def find(self, states: Collection[AllocationState] | None = None) -> list[AllocationRecord]:
        stmt = select(AllocationRow).order_by(col(AllocationRow.submitted))
        if states is not None:
            stmt = stmt.where(col(AllocationRow.state).in_([s.value for s in states]))
        return [allocation_record(r) for r in self._session.exec(stmt)]

    def page(
        self,
        after: tuple[int, str],
        limit: int,
        *,
        states: Collection[AllocationState] | None = None,
    ) -> list[AllocationRecord]:
        # Keyset on (submitted, id): two allocations may share a queue position.
        submitted, ident = after
        later = col(AllocationRow.submitted) > submitted
        same = and_(col(AllocationRow.submitted) == submitted, col(AllocationRow.id) > ident)
        stmt = select(AllocationRow).where(or_(later, same))
        if states is not None:
            stmt = stmt.where(col(AllocationRow.state).in_([s.value for s in states]))
        stmt = stmt.order_by(col(AllocationRow.submitted), col(AllocationRow.id))
        return [allocation_record(r) for r in self._session.exec(stmt.limit(max(0, limit)))]

    def add(self, allocation: AllocationRecord) -> None:
        row = AllocationRow(id=allocation.id, key=allocation.key, spec_json="{}")
        _copy_allocation(allocation, row)
        self._session.add(row)
        self.saved[allocation.id] = frozen_copy(allocation)

    def save(self, allocation: AllocationRecord) -> None:
        row = self._session.get(AllocationRow, allocation.id)
        if row is None:
            raise KeyError(f"allocation {allocation.id!r} was never added")
        _copy_allocation(allocation, row)
        self._session.add(row)
        self.saved[allocation.id] = frozen_copy(allocation)

    def last_submitted(self) -> int:
        last = self._session.exec(select(func.max(AllocationRow.submitted))).first()
        return int(last or 0)


_EVENTS = EventRow.__table__  # type: ignore[attr-defined]


class SqlEvents:
    """Events are written as plain rows in one INSERT per unit of work (not
    ORM objects: a create/release cycle records five or six), sent before
    any read of events in the same transaction and before it commits."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._rows: list[dict[str, Any]] = []
        self.added = 0

    def add(self, event: NewEvent) -> None:
        row = {name: getattr(event, name) for name in _EVENT_PLAIN}
        row["kind"] = str(event.kind)
        row["data_json"] = json.dumps(event.data, sort_keys=True, default=str)
        row["published"] = False
        self._rows.append(row)
        self.added += 1

    def flush(self) -> None:
        """Send the events added so far (the store calls it before commit)."""
        if self._rows:
            rows, self._rows = self._rows, []
            # On the session's connection, past the ORM's bulk machinery.
            self._session.connection().execute(insert(_EVENTS), rows)

    def since(
        self, after_seq: int, *, node: str = "", allocation: str = "", limit: int = 500
    ) -> list[EventInfo]:
        self.flush()
        stmt = select(EventRow).where(col(EventRow.seq) > after_seq)
        if node:
            stmt = stmt.where(EventRow.node == node)
        if allocation:
            stmt = stmt.where(EventRow.allocation == allocation)
        stmt = stmt.order_by(col(EventRow.seq)).limit(limit)
        return [event_info(r) for r in self._session.exec(stmt)]

    def newest(self, limit: int, *, node: str = "") -> list[EventInfo]:
        self.flush()
        stmt = select(EventRow)
        if node:
            stmt = stmt.where(EventRow.node == node)
        rows = self._session.exec(stmt.order_by(col(EventRow.seq).desc()).limit(limit))
        return [event_info(r) for r in reversed(list(rows))]

    def recent(self, kind: EventKind, since_at: float) -> list[EventInfo]:
        self.flush()
        stmt = (
            select(EventRow)
            .where(EventRow.kind == str(kind), col(EventRow.at) >= since_at)
            .order_by(col(EventRow.seq))
        )
        return [event_info(r) for r in self._session.exec(stmt)]

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
        stmt = select(EventRow).where(EventRow.kind == str(kind), col(EventRow.at) >= since_at)
        if node:
            stmt = stmt.where(EventRow.node == node)
        if allocation:
            stmt = stmt.where(EventRow.allocation == allocation)
        stmt = stmt.order_by(col(EventRow.seq).desc()).execution_options(yield_per=200)
        found: list[EventInfo] = []
        for row in self._session.exec(stmt):
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
    def __init__(self, session: Session) -> None:
        self._session = session

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
