"""Allocations: gang requests, the queue, and hand-off of whole nodes.

A request is validated, checked against the whole fleet (one that could never
fit is refused and nothing is stored), persisted as pending, and then every
scheduling pass asks the pure placement engine what to admit. Admission books
the chosen nodes in the same transaction that marks the allocation ready, so a
node is never in two allocations, even across a controller restart.

While an allocation holds nodes, their health reports are tallied
(``controller/core/job_health.py``); its release writes the tally as an
``allocation.health_report`` event in the release's own transaction, and
``report`` reads it back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

from controller.core.admission import awaiting_inspection, might_fit_once_inspected, never_admitted
from controller.core.allocation_view import AllocationView, frozen_copy
from controller.core.audit import CallAudit
from controller.core.errors import (
    AlreadyExists,
    DuplicateKey,
    FailedPrecondition,
    InvalidArgument,
    KilnError,
    NotFound,
)
from controller.core.eventlog import record
from controller.core.health import HealthReport
from controller.core.job_health import (
    HELD_STATES,
    AllocationReport,
    JobHealth,
    record_report,
    stored_report,
)
from controller.core.kinds import EventKind
from controller.core.meter import Meter, NullMeter
from controller.core.model import AllocationInfo, AllocationSpec
from controller.core.node_specs import NodeSpecs, node_spec
from controller.core.nodes import Nodes, held_back, validate_name
from controller.core.ports import Store, Tx
from controller.core.records import AllocationRecord, NodeRecord
from controller.core.states import HOLDING, OPEN, AllocationState, NodeKind, NodeState
from controller.core.tasks import BackgroundTasks
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

log = logging.getLogger(__name__)

A = AllocationState
LEVELS = {level.value for level in Level}
FITS_KEPT = 1024  # specs whose could-it-ever-fit verdict is kept per inventory


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
    if spec.gpu_model:
        validate_name("GPU model", spec.gpu_model)


def computes(nodes: Iterable[NodeRecord]) -> list[NodeRecord]:
    """The compute nodes: the only ones placement ever sees (a rack's switch
    trays and power shelves are never allocated)."""
    return [n for n in nodes if n.kind == NodeKind.COMPUTE]


def book(tx: Tx, node: NodeRecord, ident: str, profile: str, why: str) -> bool:
    """Give ``node`` to allocation ``ident``; True when it must be prepared first."""
    node.allocation_id = ident
    if profile and node.applied_profile != profile:
        node.allocation_profile = profile
        move(tx, node, NodeState.PREPARING, f"{why}; preparing to profile {profile}")
        return True
    move(tx, node, NodeState.ALLOCATED, why)
    return False


def mark_ready_if_prepared(tx: Tx, ident: str) -> None:
    """Hand the allocation over once every one of its nodes is prepared."""
    alloc = tx.allocations.get(ident)
    if alloc is None or alloc.state != A.PREPARING:
        return
    for name in alloc.members:
        node = tx.nodes.get(name)
        if node is None or node.state != NodeState.ALLOCATED or node.allocation_id != ident:
            return
    alloc.state = A.READY
    alloc.reason = f"{len(alloc.nodes)} nodes prepared and handed over"
    alloc.updated_at = time.time()
    tx.allocations.save(alloc)
    record(
        tx,
        EventKind.ALLOCATION_READY,
        allocation=ident,
        reason=alloc.reason,
        nodes=alloc.nodes,
        spares=alloc.spares,
        domains=alloc.domains,
    )


def plainly_fits(spec: AllocationSpec, nodes: Iterable[NodeRecord]) -> bool:
    """Whether an empty fleet of ``nodes`` holds ``spec`` without asking
    placement: N nodes of one GPU model anywhere (no racks, segments,
    spares or exclusive domains), and the fleet has that many. What
    ``place`` answers for such a request, without building the whole
    fleet's topology for it (0.5-1 s at 25,000 nodes, on the event loop,
    for the first request after any inventory change)."""
    if spec.topology != "any" or spec.racks or spec.segment:
        return False
    if spec.spares_per_domain or spec.exclusive:
        return False
    counts = Tally(n.gpu_model or "unknown" for n in nodes if n.gpu_count > 0)
    if spec.gpu_model:
        return counts[spec.gpu_model] >= spec.nodes
    return any(count >= spec.nodes for count in counts.values())


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


def to_request(alloc: AllocationRecord) -> Request:
    return request_for(alloc.id, alloc.spec, alloc.submitted)


def to_booking(alloc: AllocationRecord, gpus_of: Callable[[str], int]) -> Booking:
    return Booking(
        key=alloc.id,
        nodes=tuple(alloc.nodes),
        spares=tuple(alloc.spares),
        domains=tuple(alloc.domains),
        exclusive=alloc.spec.exclusive,
        queue=alloc.spec.queue or "default",
        gpus=sum(gpus_of(n) for n in alloc.nodes),
    )


INFO_FIELDS = tuple(f.name for f in dataclasses.fields(AllocationInfo))


def allocation_info(alloc: AllocationRecord) -> AllocationInfo:
    """The record as the frozen value the API layer sees (lists become tuples)."""
    values: dict[str, Any] = {}
    for name in INFO_FIELDS:
        value = getattr(alloc, name)
        values[name] = tuple(value) if isinstance(value, list) else value
    return AllocationInfo(**values)


@dataclasses.dataclass(slots=True)
class _InFlight:
    """A pass decided, its transaction not back yet: what the next pass
    counts as booked (``booked``) and as still waiting (``waiting``: the
    requests it stores as pending), and the ids it settled (admitted or
    refused), which the next pass does not decide again."""

    booked: dict[str, Booking]
    waiting: list[AllocationRecord]
    settled: frozenset[str]


@dataclasses.dataclass(frozen=True, slots=True)
class _Arrival:
    """A request on its way into the store, and its caller's answer (its id)."""

    record: AllocationRecord
    stored: asyncio.Future[str]
    audit: CallAudit | None = None  # its call's entry, stored with it


def _fail(arriving: Iterable[_Arrival], error: BaseException) -> None:
    """Each request its pass did not store hears ``error``."""
    for arrival in arriving:
        if not arrival.stored.done():
            arrival.stored.set_exception(error)


def record_created(tx: Tx, alloc: AllocationRecord) -> None:
    record(
        tx,
        EventKind.ALLOCATION_CREATED,
        allocation=alloc.id,
        reason="requested",
        key=alloc.key,
        spec=alloc.spec.to_dict(),
    )


class Allocations:
    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        *,
        queues: Sequence[QueueConfig] = (),
        meter: Meter | None = None,
        report_interval: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """``report_interval``: how often the agents are asked to report now
        (the held nodes' tallies count a paced agent's whole gaps)."""
        self._store = store
        self._meter: Meter = meter or NullMeter()
        self._nodes = nodes
        self._queues = tuple(queues)
        self._lock = asyncio.Lock()
        self._topology: Topology | None = None
        self._topology_key: tuple[NodeSpec, ...] = ()
        self._usage: Usage | None = None  # the last pass's bookings, over its topology
        # The last pass's booking of each holding allocation, with the record
        # it was made from (the view replaces a record when a commit saves
        # it), over the nodes of the topology it was made for.
        self._booked: dict[str, tuple[AllocationRecord, Booking]] = {}
        self._booked_over: object = None
        self._generation = 0
        # Whether a spec could ever fit, while the fleet's inventory is as it was.
        self._fits: dict[AllocationSpec, KilnError | None] = {}
        self._fits_inventory = -1
        self._asked = 0  # schedule passes asked for, covered by a decided pass,
        self._decided = 0  # and by a committed one
        self._passed = 0
        # The last pass decided: its commit, which its callers wait for.
        self._last: asyncio.Future[None] | None = None
        # Passes decided whose transactions are not back, oldest first;
        # set while there is none.
        self._in_flight: list[_InFlight] = []
        self._landed = asyncio.Event()
        self._landed.set()
        self._background = BackgroundTasks()  # passes asked for by releases
        # What held nodes went through, per allocation (``report``).
        self.job_health = JobHealth(report_interval=report_interval)
        # Each compute node's spec, recomputed only where something changed
        # (``node_specs.py``; ``Fleet`` also touches a node whose agent
        # attaches or leaves).
        self.specs = NodeSpecs(nodes.view, nodes.placeable)
        store.on_nodes_committed(self.specs.touch_changes)
        nodes.live.listen(self._observe)
        # Open allocations in memory (``allocation_view.py``): the queue and
        # the answers to create/release/get, without a store read.
        self.view = AllocationView()
        store.on_allocations_committed(self.view.committed)
        self._loading = asyncio.Lock()
        # Requests not stored yet: the next scheduling pass stores them in
        # the transaction that decides them (``create``).
        self._arriving: list[_Arrival] = []
        self._submitted = 0  # the highest queue position handed out
        # Allocation ids and default keys: unique, not secret. ``uuid4``
        # asks the kernel for each (a system call, across which the
        # database thread takes the interpreter and the event loop then
        # waits to get it back); this generator is seeded from it once.
        self._ids = random.Random()

    async def loaded(self) -> AllocationView:
        """The in-memory view, read from the store on first use (``Fleet.start``
        does it; concurrent first callers share one read)."""
        if self.view.ready:
            return self.view
        async with self._loading:
            if not self.view.ready:
                self.view.begin_load()
                found, last = await self._store.read(
                    lambda tx: (tx.allocations.find(OPEN), tx.allocations.last_submitted())
                )
                self._submitted = max(self._submitted, last)
                self.view.install(found)
        return self.view

    def _observe(self, node: str, health: HealthReport, at: float) -> None:
        """A node's report landed: tally it if an allocation holds the node.
        On every agent's every report: the baseline gate judges it, and the
        node's spec is looked at again only when the verdict changed (a
        report moves nothing else the scheduler sees: at 2,500 reports a
        second, recomputing every reporting node's spec was half of each
        scheduling pass). Then a dict lookup unless the node is held."""
        before = self._nodes.verdict(node)
        if self._nodes.judge(node, health, self._nodes.live.version(node)) != before:
            self.specs.touch(node)
        held = self._nodes.view.get(node)
        if held is not None and held.allocation_id and held.state in HELD_STATES:
            self.job_health.observe(held.allocation_id, node, health, at)

    async def get(self, ident: str) -> AllocationInfo:
        """By id or idempotency key. Raises NotFound."""
        held = (await self.loaded()).get(ident)
        if held is not None:
            return allocation_info(held)

        def query(tx: Tx) -> AllocationInfo:
            alloc = tx.allocations.get(ident) or tx.allocations.by_key(ident)
            if alloc is None:
                raise NotFound(kind="allocation", name=ident)
            return allocation_info(alloc)

        return await self._store.read(query)

    async def query(self, *, include_released: bool = False) -> list[AllocationInfo]:
        if not include_released:
            return [allocation_info(a) for a in (await self.loaded()).open()]
        return await self._store.read(
            lambda tx: [allocation_info(a) for a in tx.allocations.find()]
        )

    def _current(self) -> Topology:
        """The topology of the fleet now (the view must be loaded): the last
        one while no spec changed, the last one with a few nodes'
        schedulability changed, else a new build."""
        changed = self.specs.refresh()
        specs = self.specs.specs
        if self._topology is not None and changed is not None:
            if not changed:
                return self._topology
            if all(name in specs for name in changed):
                generation = self._generation + 1
                moved = self._topology.with_specs((specs[n] for n in changed), generation)
                if moved is not None:
                    self._generation, self._topology = generation, moved
                    self._topology_key = ()  # stale: the next full refresh compares anew
                    return moved
        return self._snapshot(specs.values())

    def _snapshot(self, specs: Iterable[NodeSpec]) -> Topology:
        """The topology for ``specs``: the cached snapshot while the inventory
        is unchanged, a new generation when anything about a node changed."""
        key = tuple(sorted(specs, key=lambda n: n.name))
        if self._topology is None or key != self._topology_key:
            self._generation += 1
            # Under a stream of allocations only which nodes are free to
            # schedule moves (a released node is releasing, then ready):
            # the same topology with those flags changed, not a new build.
            moved = self._topology and self._topology.rescheduled(key, self._generation)
            self._topology = moved or Topology.build(key, generation=self._generation)
            self._topology_key = key
        return self._topology

    def _gpus_of(self, name: str) -> int:
        spec = self.specs.specs.get(name)
        return spec.gpus if spec is not None else 0

    def _bookings_of(self, topology: Topology, active: list[AllocationRecord]) -> list[Booking]:
        """The bookings of the holding allocations, each made again only when
        its record changed: a pass walks thousands of running jobs, and
        building every booking anew was most of its time. A topology built
        anew (a node's GPUs may have changed) makes them all again."""
        if self._booked_over is not topology.dom_nodes:
            self._booked, self._booked_over = {}, topology.dom_nodes
        before, now = self._booked, {}
        for alloc in active:
            hit = before.get(alloc.id)
            if hit is None or hit[0] is not alloc:
                hit = (alloc, to_booking(alloc, self._gpus_of))
            now[alloc.id] = hit
        self._booked = now
        return [booking for _, booking in now.values()]

    def _usage_of(self, topology: Topology, bookings: list[Booking]) -> Usage:
        """The bookings over ``topology``, from the last pass's overlay
        where the topology is the same or only rescheduled."""
        before = self._usage
        usage = (
            before.updated(topology, bookings)
            if before is not None
            else Usage.from_bookings(topology, bookings)
        )
        self._usage = usage
        return usage

    async def topology(self) -> Topology:
        """The current snapshot of the fleet's topology (for exports)."""
        await self._nodes.loaded()
        return self._current()

    async def create(
        self,
        key: str,
        spec: AllocationSpec,
        *,
        created_by: str = "",
        audit: CallAudit | None = None,
    ) -> AllocationInfo:
        """Queue a gang request and try to place it at once.

        The request is stored by the next scheduling pass, in the same
        transaction that admits it (or notes why it waits), so a request that
        fits costs one write; it is durable before this returns.

        Idempotent on ``key``: the same key and spec return the same allocation.
        ``created_by`` is the caller's identity, kept with the allocation.
        ``audit``, the call's entry, is written in the transaction that
        stores the request (not when an earlier request with the key is
        returned).

        Raises:
            InvalidArgument: the spec is malformed, or names a queue that is
                not configured.
            AlreadyExists: ``key`` was used for a different request.
            FailedPrecondition: the request can never fit this fleet, or
                needs more GPUs than its queue may ever hold.
        """
        validate_spec(spec)
        key = key or f"{self._ids.getrandbits(128):032x}"
        if len(key) > 128:
            raise InvalidArgument("idempotency key longer than 128 characters")
        # The view holds every open and recently closed allocation; an older
        # one with this key is caught by the store's unique key below.
        held = (await self.loaded()).by_key(key)
        if held is not None:
            return self._same_or_conflict(allocation_info(held), key, spec)
        try:
            await self._refuse_if_never_fits(spec)
        except FailedPrecondition:
            existing = await self._by_key(key)  # an old request that fit then
            if existing is None:
                raise
            return self._same_or_conflict(existing, key, spec)

        now = time.time()
        alloc = AllocationRecord(
            id=f"alloc-{self._ids.getrandbits(40):010x}",
            key=key,
            spec=spec,
            reason="queued",
            created_at=now,
            updated_at=now,
            created_by=created_by,
        )
        stored: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stored.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._arriving.append(_Arrival(alloc, stored, audit))
        # The pass runs to its end even if this caller goes away: it may
        # hold other callers' requests too.
        await asyncio.shield(self.schedule_pass())
        try:
            # Stored by a pass that began after it arrived (``schedule_pass``
            # returns once that pass and every one before it committed).
            ident = await asyncio.shield(stored)
        except DuplicateKey:
            existing = await self._by_key(key)  # a race for the same key, or an old key
            if existing is None:
                raise
            return self._same_or_conflict(existing, key, spec)
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
        def query(tx: Tx) -> AllocationInfo | None:
            alloc = tx.allocations.by_key(key)
            return allocation_info(alloc) if alloc else None

        return await self._store.read(query)

    async def _refuse_if_never_fits(self, spec: AllocationSpec) -> None:
        """Refuse a request that no use of the known fleet could ever satisfy.

        While some nodes' GPUs are still unknown (enrolled, being inspected)
        the fleet may be bigger than it looks, so the request is queued instead
        — unless its queue could never admit it, or those nodes are drained or
        out of service.

        Raises:
            InvalidArgument: its queue is not configured.
            FailedPrecondition: it needs more than its queue may ever hold, or
                can never fit the fleet.
        """
        view = await self._nodes.loaded()
        if view.inventory_version != self._fits_inventory:
            self._fits, self._fits_inventory = {}, view.inventory_version
        if spec in self._fits:
            refusal = self._fits[spec]
        else:
            refusal = self._never_fits(spec, view.all())
            if len(self._fits) < FITS_KEPT:
                self._fits[spec] = refusal
        if refusal is not None:
            raise refusal

    def _never_fits(self, spec: AllocationSpec, nodes: Sequence[NodeRecord]) -> KilnError | None:
        nodes = computes(nodes)
        refusal = never_admitted(spec, nodes, self._queues)
        if refusal is not None:
            return refusal
        request = request_for("check", spec, submitted=0)
        request.validate()
        if plainly_fits(spec, nodes):
            return None
        whole_fleet = Topology.build(node_spec(n, n.gpu_count > 0) for n in nodes)
        verdict = place(whole_fleet, Usage.from_bookings(whole_fleet, ()), request)
        if isinstance(verdict, NoFit) and not might_fit_once_inspected(spec, nodes):
            return FailedPrecondition(f"this request can never fit the fleet: {verdict.reason}")
        return None

    async def release(self, ident: str, *, audit: CallAudit | None = None) -> AllocationInfo:
        """Give the allocation's nodes back (or cancel it while pending).

        Idempotent: releasing a released allocation returns it unchanged.
        Its health report (``report``) is recorded in the same transaction,
        from the tally taken just before it (a report landing in between
        is not counted), and so is ``audit``, the call's entry.
        """
        info = await self.get(ident)
        taken = self.job_health.snapshot(info.id)

        def write(tx: Tx) -> bool:
            if audit is not None:
                audit.write(tx)
            alloc = tx.allocations.get(info.id)
            if alloc is None or alloc.state in (A.RELEASED, A.FAILED):
                return False
            held = alloc.state in HOLDING
            for node in tx.nodes.held_by(alloc.id, with_health=False, members=alloc.members):
                node.allocation_id = ""
                # Still preparing for the allocation: go to the node's own baseline.
                node.allocation_profile = None
                # One write: the move saves the node with the fields above.
                if node.state != NodeState.ALLOCATED or not move(
                    tx, node, NodeState.RELEASING, f"released by {alloc.id}"
                ):
                    tx.nodes.save(node)
            alloc.state = A.RELEASED
            alloc.reason = "released"
            alloc.updated_at = time.time()
            tx.allocations.save(alloc)
            record(
                tx,
                EventKind.ALLOCATION_RELEASED,
                allocation=alloc.id,
                reason="released",
                nodes=alloc.nodes,
            )
            record_report(tx, alloc, taken, held=held, tracking_since=self.job_health.started_at)
            return True

        released = await self._store.tx(write)
        if audit is not None:
            audit.committed()
        if released:
            self.job_health.close(info.id)
        # The nodes it freed may admit what waits: a pass, which the release
        # does not wait for (it holds nothing of its caller's).
        self._background.spawn(self._pass_after_release(), name="kiln-pass-after-release")
        return await self.get(info.id)

    async def settle(self) -> None:
        """Wait for the passes releases asked for."""
        await self._background.settle()

    async def stop(self) -> None:
        await self._background.stop()

    async def _pass_after_release(self) -> None:
        try:
            await self.schedule_pass()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the scheduling pass after a release failed")

    async def report(self, ident: str) -> AllocationReport:
        """The health report of a released allocation (by id or idempotency key).

        Raises:
            NotFound: no such allocation, or it was released before Kiln wrote
                health reports.
            FailedPrecondition: it is still pending or held (the report is
                written when it is released), or it was refused and never held
                a node.
        """

        def query(tx: Tx) -> AllocationReport:
            alloc = tx.allocations.get(ident) or tx.allocations.by_key(ident)
            if alloc is None:
                raise NotFound(kind="allocation", name=ident)
            return stored_report(tx, alloc)

        return await self._store.read(query)

    async def schedule_pass(self) -> None:
        """Admit what fits now, in queue order; note why the rest waits.

        Passes coalesce: a caller returns once a pass that began after it
        asked has committed, so many concurrent requests share one pass
        instead of queueing one pass each. Passes overlap: one decides
        (under the scheduling lock) while the one before it commits, counting
        that one's placements as booked and its waiting requests as
        waiting; each pass's transaction checks again that its nodes are
        free (``_apply``), so a pass before it that failed costs a wait,
        never a node booked twice.
        """
        self._asked += 1
        ticket = self._asked
        async with self._lock:
            if self._decided < ticket or self._last is None:
                began = self._asked
                self._last = await self._schedule(began)
                self._decided = began
            commit = self._last
        # Shared by every caller it covers: one caller cancelled leaves it be.
        await asyncio.shield(commit)

    async def _schedule(self, began: int) -> asyncio.Future[None]:
        """Decide a pass; its commit, running (a done future when it had
        nothing to decide)."""
        # Taken before the first await: a pass stores every request that
        # arrived before it began (``schedule_pass``'s promise).
        arriving, self._arriving = self._arriving, []
        try:
            commit = await self._decide(arriving, began)
        except BaseException as e:
            _fail(arriving, e)
            raise
        before = self._last
        if commit is None:
            if before is not None and not before.done():
                return before  # its callers wait for the passes still committing
            self._passed = max(self._passed, began)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        task = asyncio.create_task(self._after(before, commit), name="kiln-pass-commit")
        # Its callers may all be gone: its failure is theirs, not asyncio's to log.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    @staticmethod
    async def _after(before: asyncio.Future[None] | None, commit: Awaitable[None]) -> None:
        """``commit``, ending once the pass before it has ended too: a
        caller waiting for a pass waits for every one before it."""
        try:
            await commit
        finally:
            if before is not None and not before.done():
                await asyncio.wait([before])

    def _in_flight_view(self) -> tuple[dict[str, Booking], list[AllocationRecord], set[str]]:
        """What the passes not committed yet decided: their bookings, the
        requests they store as waiting, and every id they settled."""
        booked: dict[str, Booking] = {}
        waiting: list[AllocationRecord] = []
        settled: set[str] = set()
        for flight in self._in_flight:
            booked.update(flight.booked)
            waiting += flight.waiting
            settled |= flight.settled
        return booked, waiting, settled

    async def _decide(
        self, arriving: list[_Arrival], began: int
    ) -> Coroutine[Any, Any, None] | None:
        """Decide a pass; what commits it, or None when there was nothing
        to decide."""
        started = time.monotonic()
        view = await self.loaded()
        for arrival in arriving:
            self._submitted += 1
            arrival.record.submitted = self._submitted
        flying, flying_waiting, flying_settled = self._in_flight_view()
        if not view.pending() and not arriving and not flying_waiting:
            return None
        active, pending = self._open_allocations(view.open())
        holding = {a.id for a in active}
        pending = [p for p in pending if p.id not in flying_settled]
        known = {p.id for p in pending}
        # Stored as waiting by a pass not committed yet (in queue order,
        # after those in the view, before the new ones).
        pending += [p for p in flying_waiting if p.id not in known and p.id not in holding]
        fresh = {a.record.id: a.record for a in arriving}
        pending += fresh.values()
        await self._nodes.loaded()
        topology = self._current()
        bookings = self._bookings_of(topology, active)
        bookings += [b for ident, b in flying.items() if ident not in holding]
        usage = self._usage_of(topology, bookings)
        result = schedule(topology, usage, [to_request(p) for p in pending], self._queues)
        waiting, rejected = result.waiting, result.rejected
        if waiting or rejected:  # why they wait, from the whole fleet
            specs = {p.id: p.spec for p in pending}
            nodes = await self._nodes.records()
            waiting, rejected = self._verdicts(waiting, rejected, specs, nodes)
        by_id = {p.id: p for p in pending}
        flight = _InFlight(
            booked={
                ident: self._booking(by_id[ident], placement)
                for ident, placement in result.admitted.items()
            },
            waiting=[r for ident, r in fresh.items() if ident in waiting],
            settled=frozenset(result.admitted) | frozenset(rejected),
        )
        self._in_flight.append(flight)
        self._landed.clear()
        audits = [a.audit for a in arriving if a.audit is not None]
        return self._commit(
            flight,
            began,
            arriving,
            lambda tx: self._apply(tx, result.admitted, waiting, rejected, fresh, audits),
            started,
        )

    async def _decide_the_rest(self) -> None:
        """A pass of what is stored, committed before this returns: not
        one that later passes wait for (``_after``), as it runs inside the
        commit of the pass whose requests it decides."""
        async with self._lock:
            commit = await self._decide([], self._asked)
        if commit is not None:
            await commit

    def _booking(self, alloc: AllocationRecord, placement: Placement) -> Booking:
        """The booking ``placement`` makes for ``alloc`` (as ``to_booking``
        makes it once the admission is stored)."""
        admitted = dataclasses.replace(
            alloc,
            nodes=list(placement.nodes),
            spares=list(placement.spares),
            domains=list(placement.domains),
        )
        return to_booking(admitted, self._gpus_of)

    async def _commit(
        self,
        flight: _InFlight,
        began: int,
        arriving: list[_Arrival],
        apply: Callable[[Tx], dict[str, float]],
        started: float,
    ) -> None:
        try:
            try:
                waits = await self._store.tx(apply)
            finally:
                self._in_flight.remove(flight)
                if not self._in_flight:
                    self._landed.set()
        except DuplicateKey:
            if not arriving:
                raise
            # A key reused from an allocation closed long ago, or two requests
            # with one key: stored one by one, each caller hears its own
            # outcome, and a pass without them decides the rest.
            await self._store_each(arriving)
            await self._decide_the_rest()
            return
        except BaseException as e:
            _fail(arriving, e)
            raise
        for arrival in arriving:
            if arrival.audit is not None:
                arrival.audit.committed()
            arrival.stored.set_result(arrival.record.id)
        self._passed = max(self._passed, began)
        admitted_at = time.time()
        for ident in waits:
            self.job_health.admitted(ident, admitted_at)
            # Said once committed (a unit of work may run twice, or roll
            # back), and on the event loop, not the database thread.
            admitted = self.view.get(ident)
            if admitted is not None:
                log.info("allocation %s: %s on %s", ident, admitted.state, ",".join(admitted.nodes))
        self._meter.placement(time.monotonic() - started)
        for waited in waits.values():
            self._meter.admitted(waited)

    async def _store_each(self, arriving: list[_Arrival]) -> None:
        def write(tx: Tx, arrival: _Arrival) -> None:
            tx.allocations.add(arrival.record)
            record_created(tx, arrival.record)
            if arrival.audit is not None:
                arrival.audit.write(tx)

        for arrival in arriving:
            try:
                await self._store.tx(lambda tx, a=arrival: write(tx, a))  # type: ignore[misc]
            except DuplicateKey as e:
                arrival.stored.set_exception(e)
            else:
                if arrival.audit is not None:
                    arrival.audit.committed()
                arrival.stored.set_result(arrival.record.id)

    def _verdicts(
        self,
        waiting: dict[str, str],
        rejected: dict[str, str],
        specs: dict[str, AllocationSpec],
        nodes: Sequence[NodeRecord],
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The scheduler's verdicts, with a refusal turned into a wait while
        nodes awaiting inspection might still make it fit (never when its
        queue could not admit it), and the waiting told of held-back nodes."""
        waiting, rejected = dict(waiting), dict(rejected)
        uninspected = rejected and sum(1 for n in nodes if awaiting_inspection(n))
        for ident, reason in list(rejected.items()):
            spec = specs[ident]
            if never_admitted(spec, nodes, self._queues) is None and might_fit_once_inspected(
                spec, nodes
            ):
                waiting[ident] = f"{reason} (yet: {uninspected} node(s) still being inspected)"
                del rejected[ident]
        held = waiting and sum(
            1 for n in nodes if self._nodes.usable(n) and self._nodes.why_not_schedulable(n)
        )
        if held:  # say why ready-looking nodes are not taken
            note = (
                f" ({held} node(s) held back: BMC unreachable or powered off, or failing "
                "the health baseline)"
            )
            waiting = {ident: reason + note for ident, reason in waiting.items()}
        return waiting, rejected

    @staticmethod
    def _open_allocations(
        allocs: Sequence[AllocationRecord],
    ) -> tuple[list[AllocationRecord], list[AllocationRecord]]:
        """The allocations holding nodes, and those waiting, in queue order."""
        holding = [a for a in allocs if a.state in HOLDING]
        return holding, [a for a in allocs if a.state == A.PENDING]

    def _apply(
        self,
        tx: Tx,
        admitted: dict[str, Placement],
        waiting: dict[str, str],
        rejected: dict[str, str],
        arriving: dict[str, AllocationRecord],
        audits: Sequence[CallAudit] = (),
    ) -> dict[str, float]:
        """Store the ``arriving`` requests (and their calls' ``audits``),
        book what was admitted and note the verdicts; returns how long each
        admitted allocation waited, by id.

        The arriving records are copied, not changed: a unit of work may run
        twice (``Store.tx``)."""
        now = time.time()
        fresh = {ident: frozen_copy(alloc) for ident, alloc in arriving.items()}
        for arrived in fresh.values():
            record_created(tx, arrived)

        def get(ident: str) -> AllocationRecord | None:
            return fresh.get(ident) or tx.allocations.get(ident)

        def save(alloc: AllocationRecord) -> None:
            if alloc.id not in fresh:
                tx.allocations.save(alloc)

        waits: dict[str, float] = {}
        for ident, placement in admitted.items():
            alloc = get(ident)
            if alloc is None or alloc.state != A.PENDING:
                continue
            names = placement.nodes + placement.spares
            members = [tx.nodes.get(n, with_health=False) for n in names]
            free = [
                m
                for m in members
                if m is not None
                and not m.allocation_id
                and m.state == NodeState.READY
                and not m.drained
                and not held_back(m)
            ]
            if len(free) != len(members):
                continue  # inventory moved under us; the next pass decides again
            profile = alloc.spec.profile
            preparing = False
            for m in free:
                why = f"{'hot spare for' if m.name in placement.spares else 'allocated to'} {ident}"
                preparing |= book(tx, m, ident, profile, why)
            alloc.nodes = list(placement.nodes)
            alloc.spares = list(placement.spares)
            alloc.domains = list(placement.domains)
            alloc.updated_at = now
            where = f"{len(placement.nodes)} nodes in {len(placement.domains)} NVLink domain(s)"
            extra = {"profile": profile} if preparing else {}
            alloc.state = A.PREPARING if preparing else A.READY
            alloc.reason = f"{where}; preparing to profile {profile}" if preparing else where
            kind = EventKind.ALLOCATION_PREPARING if preparing else EventKind.ALLOCATION_READY
            record(
                tx,
                kind,
                allocation=ident,
                reason=alloc.reason,
                nodes=list(placement.nodes),
                spares=list(placement.spares),
                domains=list(placement.domains),
                **extra,
            )
            save(alloc)
            waits[ident] = max(0.0, now - alloc.created_at)
        for ident, reason in waiting.items():
            alloc = get(ident)
            if alloc is not None and alloc.state == A.PENDING and alloc.reason != reason:
                alloc.reason = reason
                alloc.updated_at = now
                save(alloc)
                record(tx, EventKind.ALLOCATION_WAITING, allocation=ident, reason=reason)
        for ident, reason in rejected.items():
            alloc = get(ident)
            if alloc is not None and alloc.state == A.PENDING:
                alloc.state = A.FAILED
                alloc.reason = reason
                alloc.updated_at = now
                save(alloc)
                record(tx, EventKind.ALLOCATION_FAILED, allocation=ident, reason=reason)
        for arrived in fresh.values():  # as decided: one INSERT, no UPDATE after it
            tx.allocations.add(arrived)
        for audit in audits:
            audit.write(tx)
        return waits

    async def node_failed(self, node: str, reason: str) -> None:
        """Take a failed node out of its allocation and replace it.

        The replacement comes from the allocation's hot spares, else from a
        free node in the same NVLink domain; the job is told through an
        ``allocation.node_replaced`` (or ``allocation.degraded``) event. A
        node is never booked twice: the replacement is chosen against every
        other booking, under the scheduling lock.
        """
        async with self._lock:
            await self._landed.wait()  # every pass's bookings stored first
            active, _ = self._open_allocations((await self.loaded()).open())
            nodes = await self._nodes.records()
            holder = next((a for a in active if node in a.members), None)
            if holder is None:
                return
            topology = Topology.build(
                node_spec(n, self._nodes.placeable(n) and n.name != node) for n in computes(nodes)
            )
            gpus = {n.name: n.gpu_count for n in nodes}
            bookings = [to_booking(a, lambda n: gpus.get(n, 0)) for a in active]
            usage = Usage.from_bookings(topology, bookings)
            booking = next(b for b in bookings if b.key == holder.id)
            outcome = replace_failed(topology, usage, booking, node)
            self.job_health.replacing(holder.id)
            await self._store.tx(
                lambda tx: self._apply_replacement(tx, holder.id, booking, node, outcome, reason)
            )
            self.job_health.left(node)  # its figures so far stay with the allocation

    def _apply_replacement(
        self,
        tx: Tx,
        ident: str,
        before: Booking,
        failed: str,
        outcome: Booking | NoFit,
        reason: str,
    ) -> None:
        alloc = tx.allocations.get(ident)
        failed_node = tx.nodes.get(failed, with_health=False)
        if alloc is None or failed_node is None:
            return
        failed_node.allocation_id = ""
        failed_node.allocation_profile = None
        tx.nodes.save(failed_node)
        if isinstance(outcome, NoFit):
            nodes = [n for n in before.nodes if n != failed]
            spares = [n for n in before.spares if n != failed]
            alloc.reason = f"degraded: {failed} failed ({reason}); no replacement: {outcome.reason}"
            kind = EventKind.ALLOCATION_DEGRADED
            data: dict[str, Any] = {"failed": failed}
        else:
            nodes, spares = list(outcome.nodes), list(outcome.spares)
            added = (set(nodes) | set(spares)) - (set(before.nodes) | set(before.spares))
            for name in added:
                fresh = tx.nodes.get(name, with_health=False)
                if (
                    fresh is None
                    or fresh.allocation_id
                    or fresh.state != NodeState.READY
                    or held_back(fresh)
                ):
                    raise FailedPrecondition(f"replacement {name} is no longer free")
                book(tx, fresh, ident, alloc.spec.profile, f"replacement in {ident}")
            replacement = [n for n in nodes if n not in before.nodes]
            alloc.reason = (
                f"{failed} failed ({reason}); replaced by {', '.join(replacement) or '-'}"
            )
            kind = EventKind.ALLOCATION_NODE_REPLACED
            data = {"failed": failed, "replacement": replacement, "spares_left": spares}
        alloc.nodes = nodes
        alloc.spares = spares
        alloc.updated_at = time.time()
        tx.allocations.save(alloc)
        record(tx, kind, allocation=ident, node=failed, reason=alloc.reason, **data)
