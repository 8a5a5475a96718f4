"""Allocations: gang requests, the queue, and hand-off of whole nodes.

A request is validated, checked against the whole fleet (one that could never
fit is refused and nothing is stored), persisted as pending, and then every
scheduling pass asks the pure placement engine what to admit. Admission books
the chosen nodes in the same transaction that marks the allocation ready, so a
node is never in two allocations, even across a controller restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from controller.core import convert
from controller.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from controller.core.eventlog import record
from controller.core.model import AllocationInfo, AllocationSpec
from controller.core.nodes import Nodes, validate_name
from controller.core.states import FOR_ALLOCATION, NodeState
from controller.core.transitions import move
from controller.placement import (
    Booking,
    Level,
    NodeSpec,
    NoFit,
    Placement,
    QueueConfig,
    Request,
    Topology,
    Usage,
    place,
    replace_failed,
    schedule,
)
from controller.store.database import Database
from controller.store.models import AllocationRow, NodeRow

log = logging.getLogger(__name__)

ACTIVE = ("preparing", "ready")
LEVELS = {level.value for level in Level}


def validate_spec(spec: AllocationSpec) -> None:
    """Raises InvalidArgument with the first thing wrong with ``spec``."""
    if (spec.nodes > 0) == (spec.racks > 0):
        raise InvalidArgument("ask for either a number of nodes or a number of racks")
    if spec.topology not in LEVELS:
        raise InvalidArgument(f"unknown topology {spec.topology!r}; use one of {sorted(LEVELS)}")
    if spec.segment < 0 or spec.spares_per_domain < 0:
        raise InvalidArgument("segment and spares must not be negative")
    if spec.segment and spec.nodes % spec.segment:
        raise InvalidArgument(f"{spec.nodes} nodes cannot be split into segments of {spec.segment}")
    if spec.queue:
        validate_name("queue", spec.queue)


def node_spec(row: NodeRow, schedulable: bool) -> NodeSpec:
    rack = row.rack or row.name
    return NodeSpec(
        name=row.name,
        gpu_model=row.gpu_model or "unknown",
        gpus=row.gpu_count,
        domain=row.nvlink_domain or row.name,
        rack=rack,
        leaf=row.leaf or rack,
        spine=row.spine or "spine-0",
        schedulable=schedulable,
    )


def book(session: Session, node: NodeRow, ident: str, profile: str, why: str) -> bool:
    """Give ``node`` to allocation ``ident``; True when it must be prepared first."""
    node.allocation_id = ident
    if profile and node.applied_profile != profile:
        node.operation = FOR_ALLOCATION + profile
        move(session, node, NodeState.PREPARING, f"{why}; preparing to profile {profile}")
        return True
    move(session, node, NodeState.ALLOCATED, why)
    return False


def mark_ready_if_prepared(session: Session, ident: str) -> None:
    """Hand the allocation over once every one of its nodes is prepared."""
    row = session.get(AllocationRow, ident)
    if row is None or row.state != "preparing":
        return
    members = json.loads(row.nodes_json) + json.loads(row.spares_json)
    for name in members:
        node = session.get(NodeRow, name)
        if node is None or node.state != NodeState.ALLOCATED or node.allocation_id != ident:
            return
    row.state = "ready"
    row.reason = f"{len(json.loads(row.nodes_json))} nodes prepared and handed over"
    row.updated_at = time.time()
    session.add(row)
    record(
        session,
        "allocation.ready",
        allocation=ident,
        reason=row.reason,
        nodes=json.loads(row.nodes_json),
        spares=json.loads(row.spares_json),
        domains=json.loads(row.domains_json),
    )


def might_fit_once_inspected(spec: AllocationSpec, rows: Sequence[NodeRow]) -> bool:
    """Whether nodes whose GPUs are not known yet could still make ``spec`` fit.

    Their GPUs could be anything, but their number and racks are known: a
    request for more nodes (or racks) than are enrolled never fits.
    """
    if all(r.gpu_count > 0 for r in rows):
        return False
    if spec.nodes > len(rows):
        return False
    return spec.racks <= len({r.rack or r.name for r in rows})


def request_for(key: str, spec: AllocationSpec, submitted: int) -> Request:
    return Request(
        key=key,
        nodes=spec.nodes,
        racks=spec.racks,
        gpu_model=spec.gpu_model or None,
        level=Level(spec.topology),
        required=not spec.preferred,
        segment=spec.segment,
        spares_per_domain=spec.spares_per_domain,
        exclusive=spec.exclusive,
        queue=spec.queue or "default",
        priority=spec.priority,
        submitted=submitted,
    )


def to_request(row: AllocationRow) -> Request:
    spec = AllocationSpec.from_dict(json.loads(row.spec_json))
    return request_for(row.id, spec, row.submitted)


def to_booking(row: AllocationRow, gpus_per_node: dict[str, int]) -> Booking:
    spec = AllocationSpec.from_dict(json.loads(row.spec_json))
    nodes = tuple(json.loads(row.nodes_json))
    return Booking(
        key=row.id,
        nodes=nodes,
        spares=tuple(json.loads(row.spares_json)),
        domains=tuple(json.loads(row.domains_json)),
        exclusive=spec.exclusive,
        queue=spec.queue or "default",
        gpus=sum(gpus_per_node.get(n, 0) for n in nodes),
    )


class Allocations:
    def __init__(self, db: Database, nodes: Nodes, *, queues: Sequence[QueueConfig] = ()) -> None:
        self._db = db
        self._nodes = nodes
        self._queues = tuple(queues)
        self._lock = asyncio.Lock()
        self._topology: Topology | None = None
        self._topology_key: tuple[NodeSpec, ...] = ()
        self._generation = 0

    async def get(self, ident: str) -> AllocationInfo:
        def query(session: Session) -> AllocationInfo:
            row = (
                session.get(AllocationRow, ident)
                or session.exec(select(AllocationRow).where(AllocationRow.key == ident)).first()
            )
            if row is None:
                raise NotFound(kind="allocation", name=ident)
            return convert.allocation_info(row)

        return await self._db.read(query)

    async def query(self, *, include_released: bool = False) -> list[AllocationInfo]:
        def query(session: Session) -> list[AllocationInfo]:
            stmt = select(AllocationRow).order_by(col(AllocationRow.submitted))
            if not include_released:
                stmt = stmt.where(col(AllocationRow.state).in_(("pending", *ACTIVE)))
            return [convert.allocation_info(r) for r in session.exec(stmt)]

        return await self._db.read(query)

    def _snapshot(self, specs: Iterable[NodeSpec]) -> Topology:
        """The topology for ``specs``: the cached snapshot while the inventory
        is unchanged, a new generation when anything about a node changed."""
        key = tuple(sorted(specs, key=lambda n: n.name))
        if self._topology is None or key != self._topology_key:
            self._generation += 1
            self._topology = Topology.build(key, generation=self._generation)
            self._topology_key = key
        return self._topology

    async def topology(self) -> Topology:
        """The current snapshot of the fleet's topology (for exports)."""
        rows = await self._nodes.rows()
        return self._snapshot(node_spec(r, self._nodes.usable(r)) for r in rows)

    async def create(self, key: str, spec: AllocationSpec) -> AllocationInfo:
        """Queue a gang request and try to place it at once.

        Idempotent on ``key``: the same key and spec return the same allocation.

        Raises:
            InvalidArgument: the spec is malformed.
            AlreadyExists: ``key`` was used for a different request.
            FailedPrecondition: the request can never fit this fleet.
        """
        validate_spec(spec)
        key = key or uuid.uuid4().hex
        if len(key) > 128:
            raise InvalidArgument("idempotency key longer than 128 characters")
        existing = await self._by_key(key)
        if existing is not None:
            return self._same_or_conflict(existing, key, spec)
        await self._refuse_if_never_fits(spec)

        def write(session: Session) -> str:
            now = time.time()
            last = session.exec(
                select(AllocationRow.submitted).order_by(col(AllocationRow.submitted).desc())
            ).first()
            row = AllocationRow(
                id=f"alloc-{uuid.uuid4().hex[:10]}",
                key=key,
                spec_json=json.dumps(spec.to_dict(), sort_keys=True),
                queue=spec.queue or "default",
                priority=spec.priority,
                submitted=(last or 0) + 1,
                reason="queued",
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            record(
                session,
                "allocation.created",
                allocation=row.id,
                reason="requested",
                key=key,
                spec=spec.to_dict(),
            )
            return row.id

        try:
            ident = await self._db.tx(write)
        except IntegrityError:
            existing = await self._by_key(key)  # lost a race for the same key
            if existing is None:
                raise
            return self._same_or_conflict(existing, key, spec)
        await self.schedule_pass()
        return await self.get(ident)

    def _same_or_conflict(
        self, existing: AllocationInfo, key: str, spec: AllocationSpec
    ) -> AllocationInfo:
        if existing.spec != spec:
            raise AlreadyExists(
                f"idempotency key {key!r} was already used for a different request "
                f"(allocation {existing.id})"
            )
        return existing

    async def _by_key(self, key: str) -> AllocationInfo | None:
        def query(session: Session) -> AllocationInfo | None:
            row = session.exec(select(AllocationRow).where(AllocationRow.key == key)).first()
            return convert.allocation_info(row) if row else None

        return await self._db.read(query)

    async def _refuse_if_never_fits(self, spec: AllocationSpec) -> None:
        """Refuse a request that no use of the known fleet could ever satisfy.

        While some nodes' GPUs are still unknown (enrolled, not yet inspected)
        the fleet may be bigger than it looks, so the request is queued instead.
        """
        rows = await self._nodes.rows()
        whole_fleet = Topology.build(node_spec(r, r.gpu_count > 0) for r in rows)
        request = request_for("check", spec, submitted=0)
        request.validate()
        verdict = place(whole_fleet, Usage.from_bookings(whole_fleet, ()), request)
        if isinstance(verdict, NoFit) and not might_fit_once_inspected(spec, rows):
            raise FailedPrecondition(f"this request can never fit the fleet: {verdict.reason}")

    async def release(self, ident: str) -> AllocationInfo:
        """Give the allocation's nodes back (or cancel it while pending).

        Idempotent: releasing a released allocation returns it unchanged.
        """
        info = await self.get(ident)

        def write(session: Session) -> None:
            row = session.get(AllocationRow, info.id)
            if row is None or row.state in ("released", "failed"):
                return
            for node in session.exec(select(NodeRow).where(NodeRow.allocation_id == row.id)):
                node.allocation_id = ""
                if node.operation.startswith(FOR_ALLOCATION):
                    node.operation = ""  # still preparing: go to the node's own baseline
                session.add(node)
                if node.state == NodeState.ALLOCATED:
                    move(session, node, NodeState.RELEASING, f"released by {row.id}")
            row.state = "released"
            row.reason = "released"
            row.updated_at = time.time()
            session.add(row)
            record(
                session,
                "allocation.released",
                allocation=row.id,
                reason="released",
                nodes=json.loads(row.nodes_json),
            )

        await self._db.tx(write)
        await self.schedule_pass()
        return await self.get(info.id)

    async def schedule_pass(self) -> None:
        """Admit what fits now, in queue order; note why the rest waits."""
        async with self._lock:
            rows, active, pending = await self._db.read(self._load)
            if not pending:
                return
            topology = self._snapshot(node_spec(r, self._nodes.usable(r)) for r in rows)
            gpus = {r.name: r.gpu_count for r in rows}
            usage = Usage.from_bookings(topology, (to_booking(a, gpus) for a in active))
            result = schedule(topology, usage, [to_request(p) for p in pending], self._queues)
            waiting, rejected = dict(result.waiting), dict(result.rejected)
            specs = {p.id: AllocationSpec.from_dict(json.loads(p.spec_json)) for p in pending}
            uninspected = sum(1 for r in rows if r.gpu_count == 0)
            for ident, reason in list(rejected.items()):
                if might_fit_once_inspected(specs[ident], rows):  # wait, don't refuse yet
                    waiting[ident] = f"{reason} (yet: {uninspected} node(s) still being inspected)"
                    del rejected[ident]
            await self._db.tx(lambda s: self._apply(s, result.admitted, waiting, rejected))

    @staticmethod
    def _load(
        session: Session,
    ) -> tuple[list[NodeRow], list[AllocationRow], list[AllocationRow]]:
        rows = list(session.exec(select(NodeRow)))
        allocs = list(
            session.exec(
                select(AllocationRow)
                .where(col(AllocationRow.state).in_(("pending", *ACTIVE)))
                .order_by(col(AllocationRow.submitted))
            )
        )
        return (
            rows,
            [a for a in allocs if a.state != "pending"],
            [a for a in allocs if a.state == "pending"],
        )

    def _apply(
        self,
        session: Session,
        admitted: dict[str, Placement],
        waiting: dict[str, str],
        rejected: dict[str, str],
    ) -> None:
        now = time.time()
        for ident, placement in admitted.items():
            row = session.get(AllocationRow, ident)
            if row is None or row.state != "pending":
                continue
            members = [session.get(NodeRow, n) for n in placement.nodes + placement.spares]
            if any(
                m is None or m.allocation_id or m.state != NodeState.READY or m.drained
                for m in members
            ):
                continue  # inventory moved under us; the next pass decides again
            spec = AllocationSpec.from_dict(json.loads(row.spec_json))
            preparing = False
            for m in members:
                assert m is not None
                why = f"{'hot spare for' if m.name in placement.spares else 'allocated to'} {ident}"
                preparing |= book(session, m, ident, spec.profile, why)
            row.nodes_json = json.dumps(list(placement.nodes))
            row.spares_json = json.dumps(list(placement.spares))
            row.domains_json = json.dumps(list(placement.domains))
            row.updated_at = now
            where = f"{len(placement.nodes)} nodes in {len(placement.domains)} NVLink domain(s)"
            extra = {"profile": spec.profile} if preparing else {}
            row.state = "preparing" if preparing else "ready"
            row.reason = f"{where}; preparing to profile {spec.profile}" if preparing else where
            record(
                session,
                f"allocation.{row.state}",
                allocation=ident,
                reason=row.reason,
                nodes=list(placement.nodes),
                spares=list(placement.spares),
                domains=list(placement.domains),
                **extra,
            )
            session.add(row)
            log.info("allocation %s: %s on %s", ident, row.state, ",".join(placement.nodes))
        for ident, reason in waiting.items():
            row = session.get(AllocationRow, ident)
            if row is not None and row.state == "pending" and row.reason != reason:
                row.reason = reason
                row.updated_at = now
                session.add(row)
                record(session, "allocation.waiting", allocation=ident, reason=reason)
        for ident, reason in rejected.items():
            row = session.get(AllocationRow, ident)
            if row is not None and row.state == "pending":
                row.state = "failed"
                row.reason = reason
                row.updated_at = now
                session.add(row)
                record(session, "allocation.failed", allocation=ident, reason=reason)

    async def node_failed(self, node: str, reason: str) -> None:
        """Take a failed node out of its allocation and replace it.

        The replacement comes from the allocation's hot spares, else from a
        free node in the same NVLink domain; the job is told through an
        ``allocation.node_replaced`` (or ``allocation.degraded``) event. A
        node is never booked twice: the replacement is chosen against every
        other booking, under the scheduling lock.
        """
        async with self._lock:
            rows, active, _ = await self._db.read(self._load)
            holder = next(
                (
                    a
                    for a in active
                    if node in json.loads(a.nodes_json) or node in json.loads(a.spares_json)
                ),
                None,
            )
            if holder is None:
                return
            topology = Topology.build(
                node_spec(r, self._nodes.usable(r) and r.name != node) for r in rows
            )
            gpus = {r.name: r.gpu_count for r in rows}
            bookings = [to_booking(a, gpus) for a in active]
            usage = Usage.from_bookings(topology, bookings)
            booking = next(b for b in bookings if b.key == holder.id)
            outcome = replace_failed(topology, usage, booking, node)
            await self._db.tx(
                lambda s: self._apply_replacement(s, holder.id, booking, node, outcome, reason)
            )

    def _apply_replacement(
        self,
        session: Session,
        ident: str,
        before: Booking,
        failed: str,
        outcome: Booking | NoFit,
        reason: str,
    ) -> None:
        row = session.get(AllocationRow, ident)
        failed_row = session.get(NodeRow, failed)
        if row is None or failed_row is None:
            return
        failed_row.allocation_id = ""
        session.add(failed_row)
        if isinstance(outcome, NoFit):
            nodes = [n for n in before.nodes if n != failed]
            spares = [n for n in before.spares if n != failed]
            row.reason = f"degraded: {failed} failed ({reason}); no replacement: {outcome.reason}"
            kind = "allocation.degraded"
            data: dict[str, Any] = {"failed": failed}
        else:
            nodes, spares = list(outcome.nodes), list(outcome.spares)
            added = (set(nodes) | set(spares)) - (set(before.nodes) | set(before.spares))
            for name in added:
                fresh = session.get(NodeRow, name)
                if fresh is None or fresh.allocation_id or fresh.state != NodeState.READY:
                    raise FailedPrecondition(f"replacement {name} is no longer free")
                spec = AllocationSpec.from_dict(json.loads(row.spec_json))
                book(session, fresh, ident, spec.profile, f"replacement in {ident}")
            replacement = [n for n in nodes if n not in before.nodes]
            row.reason = f"{failed} failed ({reason}); replaced by {', '.join(replacement) or '-'}"
            kind = "allocation.node_replaced"
            data = {"failed": failed, "replacement": replacement, "spares_left": spares}
        row.nodes_json = json.dumps(nodes)
        row.spares_json = json.dumps(spares)
        row.updated_at = time.time()
        session.add(row)
        record(session, kind, allocation=ident, node=failed, reason=row.reason, **data)
