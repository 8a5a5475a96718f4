"""What an allocation's GPUs went through while it held them.

Every health report of a node that an allocation holds (``HELD_STATES``:
allocated, or draining while still in the allocation; not while it is being
prepared for it) is folded into that allocation's tally, per node and GPU:

1. **Time.** A report's time is its ``sampled_at`` (the agent's clock, so the
   gaps between one agent's reports are true), else when it arrived. The gap
   since the node's previous report is capped at ``MAX_GAP_S``, or twice the
   interval the agents were asked for if longer (a controller that is behind
   slows its agents down, up to a minute a report): a silent agent does not
   count hours of throttling or energy it never reported, and a paced one
   counts all of its time. The first
   report of a node in an allocation opens its time; it counts no gap.
2. **Maximum temperature**: the highest ``temp_c`` seen.
3. **Throttled seconds by reason**, from ``clock_event_reasons`` (NVML's
   clocks-event-reason bits, ``THROTTLE_REASONS``): a reason set in both
   ends of a gap counts the whole gap, set at one end half of it (the
   trapezoid rule: NVML's reasons are what holds at the instant read).
4. **Energy** in joules: the reports carry power draw, not NVML's energy
   counter, so ``power_w`` is integrated over the gaps (trapezoids; a gap with
   one reading uses it for the whole gap).
5. **Counters as growth**: ECC single- and double-bit errors, rows remapped
   (correctable plus uncorrectable) and NVLink errors count what the counter
   grew by from report to report. A counter that drops (a reset, a driver
   reload) starts again from its new value, so nothing counts twice and no
   reset reads as a huge number. ECC is counted on both the volatile and the
   aggregate counters and the larger growth kept (aggregate survives resets,
   volatile updates at once).
6. **XIDs** in the order seen, up to ``XIDS_KEPT`` per GPU; past that only an
   XID not yet listed is added, so no code is ever missed.

Memory holds only open allocations: a tally is dropped when its allocation is
released (``close``), and a node that leaves an allocation (replaced, removed)
is dropped from the nodes being followed (``left``) while its figures stay
with the allocation. ``observe`` runs for every report of a held node, on the
event loop: it does constant work per GPU and no I/O.

The report itself (``AllocationReport``) is a frozen value; it travels as an
``allocation.health_report`` event's data (``report_data`` /
``report_from_event``), so it survives restarts. What a controller restart
loses is the tally of allocations still held; their reports are ``partial``
(``build_report``: held, not handed over by this controller, and created
before it started), their figures counting from the restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.core.errors import FailedPrecondition, NotFound
from controller.core.eventlog import record
from controller.core.health import GpuHealth, HealthReport
from controller.core.kinds import EventKind
from controller.core.model import EventInfo
from controller.core.ports import Tx
from controller.core.records import AllocationRecord
from controller.core.states import HOLDING, OPEN, AllocationState, NodeState
from controller.policies.engine import GAP_INTERVALS  # ... or that many intervals asked for

# NVML's clocks-event-reason bits that slow a GPU down (nvmlClocksEventReason*;
# Idle 0x1 and ApplicationsClocksSetting 0x2 are choices, not throttling).
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
)
THROTTLE_MASK = sum(bit for _, bit in THROTTLE_REASONS)  # distinct bits: their sum is their OR

MAX_GAP_S = 30.0  # the most one gap between two reports counts (six 5 s reports)
XIDS_KEPT = 64  # XIDs listed per GPU before only new codes are added
COUNT_MAX = 2**64 - 1  # the report's counts are uint64: growth across resets saturates
HELD_STATES = frozenset({NodeState.ALLOCATED, NodeState.DRAINING})
EVENTS_PAGE = 500  # an allocation's events read per query when looking for its report


# -- the report: frozen values ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuJobHealth:
    """One GPU over the time an allocation held its node."""

    node: str
    index: int
    uuid: str = ""
    max_temp_c: float | None = None  # None: no report read a temperature
    throttled_s: Mapping[str, float] = field(default_factory=dict)  # only reasons that were set
    energy_j: float = 0.0
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    xids: tuple[int, ...] = ()
    rows_remapped: int = 0
    nvlink_errors: int = 0


@dataclass(frozen=True, slots=True)
class NodeReplacement:
    failed: str
    replacement: str  # "" when nothing could take its place
    at: float
    reason: str


@dataclass(frozen=True, slots=True)
class AllocationReport:
    """An allocation's health report, written when it is released."""

    allocation: str
    started_at: float  # when its nodes were handed over (or first observed)
    ended_at: float  # its release
    gpus: tuple[GpuJobHealth, ...] = ()
    replacements: tuple[NodeReplacement, ...] = ()
    reports: int = 0  # health reports it was built from
    partial: bool = False  # held across a controller restart: counts from the start


def report_data(report: AllocationReport) -> dict[str, Any]:
    """The report as the ``allocation.health_report`` event's data (JSON;
    the allocation is the event's own field). Every key is present."""
    return {
        "started_at": report.started_at,
        "ended_at": report.ended_at,
        "reports": report.reports,
        "partial": report.partial,
        "gpus": [
            {
                "node": g.node,
                "index": g.index,
                "uuid": g.uuid,
                "max_temp_c": g.max_temp_c,
                "throttled_s": dict(g.throttled_s),
                "energy_j": g.energy_j,
                "ecc_sbe": g.ecc_sbe,
                "ecc_dbe": g.ecc_dbe,
                "xids": list(g.xids),
                "rows_remapped": g.rows_remapped,
                "nvlink_errors": g.nvlink_errors,
            }
            for g in report.gpus
        ],
        "replacements": [
            {"failed": r.failed, "replacement": r.replacement, "at": r.at, "reason": r.reason}
            for r in report.replacements
        ],
    }


def _gpu_from(data: Mapping[str, Any]) -> GpuJobHealth:
    temp = data.get("max_temp_c")
    return GpuJobHealth(
        node=str(data.get("node", "")),
        index=int(data.get("index", 0)),
        uuid=str(data.get("uuid", "")),
        max_temp_c=None if temp is None else float(temp),
        throttled_s={str(k): float(v) for k, v in dict(data.get("throttled_s") or {}).items()},
        energy_j=float(data.get("energy_j", 0.0)),
        ecc_sbe=int(data.get("ecc_sbe", 0)),
        ecc_dbe=int(data.get("ecc_dbe", 0)),
        xids=tuple(int(x) for x in data.get("xids") or ()),
        rows_remapped=int(data.get("rows_remapped", 0)),
        nvlink_errors=int(data.get("nvlink_errors", 0)),
    )


def report_from_event(event: EventInfo) -> AllocationReport:
    """The report an ``allocation.health_report`` event carries."""
    data = event.data
    return AllocationReport(
        allocation=event.allocation,
        started_at=float(data.get("started_at", 0.0)),
        ended_at=float(data.get("ended_at", event.at)),
        gpus=tuple(_gpu_from(g) for g in data.get("gpus") or ()),
        replacements=tuple(
            NodeReplacement(
                failed=str(r.get("failed", "")),
                replacement=str(r.get("replacement", "")),
                at=float(r.get("at", 0.0)),
                reason=str(r.get("reason", "")),
            )
            for r in data.get("replacements") or ()
        ),
        reports=int(data.get("reports", 0)),
        partial=bool(data.get("partial", False)),
    )


def replacements_from(events: Iterable[EventInfo]) -> tuple[NodeReplacement, ...]:
    """The replacements an allocation's ``allocation.node_replaced`` and
    ``allocation.degraded`` events record, oldest first: one per node that
    took a failed node's place, or one with no replacement."""
    found: list[NodeReplacement] = []
    for e in sorted(events, key=lambda e: e.seq):
        failed = str(e.data.get("failed") or e.node)
        names: list[str] = []
        if e.kind == EventKind.ALLOCATION_NODE_REPLACED:
            names = [str(n) for n in e.data.get("replacement") or ()]
        for name in names or [""]:
            found.append(NodeReplacement(failed=failed, replacement=name, at=e.at, reason=e.reason))
    return tuple(found)


# -- the tallies: mutable, in memory, one per held node ---------------------------


class _GpuTally:
    __slots__ = (
        "dbe_a",
        "dbe_v",
        "energy",
        "index",
        "last_dbe_a",
        "last_dbe_v",
        "last_nvlink",
        "last_remap",
        "last_sbe_a",
        "last_sbe_v",
        "max_temp",
        "nvlink",
        "power",
        "reasons",
        "remap",
        "sbe_a",
        "sbe_v",
        "throttled",
        "uuid",
        "xids",
    )

    def __init__(self, g: GpuHealth) -> None:
        self.index = g.index
        self.uuid = g.uuid
        self.max_temp: float | None = None
        self.throttled = [0.0] * len(THROTTLE_REASONS)
        self.energy = 0.0
        self.reasons = g.clock_event_reasons & THROTTLE_MASK
        self.power = g.power_w
        self.xids: list[int] = []
        self.sbe_v = self.dbe_v = self.sbe_a = self.dbe_a = self.remap = self.nvlink = 0
        # The first report is the baseline the counters grow from.
        self.last_sbe_v = g.ecc_sbe_volatile
        self.last_dbe_v = g.ecc_dbe_volatile
        self.last_sbe_a = g.ecc_sbe_aggregate
        self.last_dbe_a = g.ecc_dbe_aggregate
        self.last_remap = _remapped(g)
        self.last_nvlink = g.nvlink_errors

    def add(self, g: GpuHealth, gap: float) -> None:
        """Fold one reading in; ``gap``: seconds since the previous one (capped)."""
        if not self.uuid:
            self.uuid = g.uuid
        temp = g.temp_c
        if temp is not None and (self.max_temp is None or temp > self.max_temp):
            self.max_temp = temp
        reasons = g.clock_event_reasons & THROTTLE_MASK
        power = g.power_w
        if gap > 0.0:
            either = reasons | self.reasons
            if either:
                both = reasons & self.reasons
                half = gap / 2
                for i, (_, bit) in enumerate(THROTTLE_REASONS):
                    if either & bit:
                        self.throttled[i] += gap if both & bit else half
            before = self.power
            if power is not None:
                self.energy += (power if before is None else (power + before) / 2) * gap
            elif before is not None:
                self.energy += before * gap
        self.reasons = reasons
        self.power = power
        if g.xids:
            self._add_xids(g.xids)
        # Counters: what they grew by; one that dropped (reset) restarts from its value.
        n = g.ecc_sbe_volatile
        if n > self.last_sbe_v:
            self.sbe_v += n - self.last_sbe_v
        self.last_sbe_v = n
        n = g.ecc_dbe_volatile
        if n > self.last_dbe_v:
            self.dbe_v += n - self.last_dbe_v
        self.last_dbe_v = n
        n = g.ecc_sbe_aggregate
        if n > self.last_sbe_a:
            self.sbe_a += n - self.last_sbe_a
        self.last_sbe_a = n
        n = g.ecc_dbe_aggregate
        if n > self.last_dbe_a:
            self.dbe_a += n - self.last_dbe_a
        self.last_dbe_a = n
        corr, unc = g.remap_correctable, g.remap_uncorrectable
        if corr is not None or unc is not None:  # not read under MIG
            remap = (corr or 0) + (unc or 0)
            last = self.last_remap
            if last is not None and remap > last:
                self.remap += remap - last
            self.last_remap = remap
        n = g.nvlink_errors
        if n > self.last_nvlink:
            self.nvlink += n - self.last_nvlink
        self.last_nvlink = n

    def _add_xids(self, xids: tuple[int, ...]) -> None:
        for code in xids:
            if len(self.xids) < XIDS_KEPT or code not in self.xids:
                self.xids.append(code)

    def value(self, node: str) -> GpuJobHealth:
        return GpuJobHealth(
            node=node,
            index=self.index,
            uuid=self.uuid,
            max_temp_c=self.max_temp,
            throttled_s={
                name: round(seconds, 1)
                for (name, _), seconds in zip(THROTTLE_REASONS, self.throttled, strict=True)
                if seconds > 0
            },
            energy_j=round(self.energy, 1),
            ecc_sbe=min(max(self.sbe_v, self.sbe_a), COUNT_MAX),
            ecc_dbe=min(max(self.dbe_v, self.dbe_a), COUNT_MAX),
            xids=tuple(self.xids),
            rows_remapped=min(self.remap, COUNT_MAX),
            nvlink_errors=min(self.nvlink, COUNT_MAX),
        )


def _remapped(g: GpuHealth) -> int | None:
    """Rows remapped so far (None: not read, e.g. under MIG)."""
    if g.remap_correctable is None and g.remap_uncorrectable is None:
        return None
    return (g.remap_correctable or 0) + (g.remap_uncorrectable or 0)


class _NodeTally:
    __slots__ = ("allocation", "gpus", "last_at", "node", "reports")

    def __init__(self, allocation: str, node: str) -> None:
        self.allocation = allocation
        self.node = node
        self.last_at: float | None = None  # the previous report's time (None: none yet)
        self.reports = 0
        self.gpus: dict[int, _GpuTally] = {}

    def add(self, health: HealthReport, at: float, longest_gap: float) -> None:
        t = health.sampled_at or at
        last = self.last_at
        gap = 0.0 if last is None else min(max(t - last, 0.0), longest_gap)
        if last is None or t > last:
            self.last_at = t
        self.reports += 1
        gpus = self.gpus
        for g in health.gpus:
            tally = gpus.get(g.index)
            if tally is None:
                tally = gpus[g.index] = _GpuTally(g)
                tally.add(g, 0.0)  # a GPU first seen now: no gap behind it
            else:
                tally.add(g, gap)

    def rejoined(self) -> None:
        """Back in its allocation after leaving it: the time away counts nothing."""
        self.last_at = None


@dataclass(slots=True)
class _JobTally:
    admitted_at: float | None = None  # this controller handed its nodes over
    first_seen: float | None = None  # its first report (controller time)
    nodes: dict[str, _NodeTally] = field(default_factory=dict)
    replacing: bool = False  # this controller replaced (or tried to) one of its nodes


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """An open allocation's figures so far (taken on the event loop, so a
    transaction on the store's thread can build the report from it)."""

    gpus: tuple[GpuJobHealth, ...]
    reports: int
    admitted_at: float | None
    first_seen: float | None
    # Admitted by this controller, which replaced none of its nodes: the
    # store holds no replacement event of it (the release need not look).
    unreplaced: bool = False


class JobHealth:
    """Per-allocation tallies of its held nodes' reports; see the module
    docstring. Not thread-safe: call it on the event loop only."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        report_interval: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """``report_interval``: how often the agents are asked to report now."""
        self.started_at = clock()  # tallies count from here
        self._report_interval = report_interval
        self._held: dict[str, _NodeTally] = {}  # node → its tally in the allocation holding it
        self._open: dict[str, _JobTally] = {}  # allocation → its tally

    def __len__(self) -> int:
        """Allocations with a tally (only open ones)."""
        return len(self._open)

    @property
    def followed(self) -> int:
        """Nodes whose reports are being folded in."""
        return len(self._held)

    def admitted(self, allocation: str, at: float) -> None:
        """This controller handed ``allocation`` its nodes at ``at``."""
        job = self._open.setdefault(allocation, _JobTally())
        if job.admitted_at is None:
            job.admitted_at = at

    def observe(self, allocation: str, node: str, health: HealthReport, at: float) -> None:
        """Fold in a report of ``node``, held by ``allocation``, that arrived at ``at``."""
        tally = self._held.get(node)
        if tally is None or tally.allocation != allocation:
            job = self._open.get(allocation)
            if job is None:
                job = self._open[allocation] = _JobTally()
            if job.first_seen is None:
                job.first_seen = at
            tally = job.nodes.get(node)
            if tally is None:
                tally = job.nodes[node] = _NodeTally(allocation, node)
            else:
                tally.rejoined()
            self._held[node] = tally
        tally.add(health, at, max(MAX_GAP_S, GAP_INTERVALS * self._report_interval()))

    def left(self, node: str) -> None:
        """``node`` is no longer in the allocation it was followed for (its
        figures stay with that allocation)."""
        self._held.pop(node, None)

    def snapshot(self, allocation: str) -> JobSnapshot:
        """The allocation's figures so far (empty when it has none)."""
        job = self._open.get(allocation)
        if job is None:
            return JobSnapshot((), 0, None, None)
        gpus = tuple(
            gpu.value(node.node)
            for node in sorted(job.nodes.values(), key=lambda n: n.node)
            for gpu in sorted(node.gpus.values(), key=lambda g: g.index)
        )
        reports = sum(n.reports for n in job.nodes.values())
        unreplaced = job.admitted_at is not None and not job.replacing
        return JobSnapshot(gpus, reports, job.admitted_at, job.first_seen, unreplaced)

    def replacing(self, allocation: str) -> None:
        """One of ``allocation``'s nodes is about to be replaced (called
        before the write, so a report never misses a replacement)."""
        self._open.setdefault(allocation, _JobTally()).replacing = True

    def close(self, allocation: str) -> None:
        """Drop the allocation's tally (it was released)."""
        job = self._open.pop(allocation, None)
        if job is None:
            return
        for node in job.nodes:
            tally = self._held.get(node)
            if tally is not None and tally.allocation == allocation:
                del self._held[node]


def build_report(
    allocation: str,
    taken: JobSnapshot,
    *,
    ended_at: float,
    held: bool,
    created_at: float,
    tracking_since: float,
    replacements: tuple[NodeReplacement, ...] = (),
) -> AllocationReport:
    """The report of ``allocation``, released at ``ended_at``.

    ``held``: it held nodes when released. It is ``partial`` when it held
    nodes, was not handed them by this controller and was created before this
    controller started following reports (``tracking_since``): it was held
    across a restart, and its figures count from then.
    """
    partial = held and taken.admitted_at is None and created_at < tracking_since
    if taken.admitted_at is not None:
        started = taken.admitted_at
    elif taken.first_seen is not None:
        started = taken.first_seen
    else:
        started = tracking_since if partial else 0.0
    return AllocationReport(
        allocation=allocation,
        started_at=started,
        ended_at=ended_at,
        gpus=taken.gpus,
        replacements=replacements,
        reports=taken.reports,
        partial=partial,
    )


# -- in the store: written with the release, read back by allocation --------------


_REPLACEMENT_KINDS = (EventKind.ALLOCATION_NODE_REPLACED, EventKind.ALLOCATION_DEGRADED)


def record_report(
    tx: Tx, alloc: AllocationRecord, taken: JobSnapshot, *, held: bool, tracking_since: float
) -> AllocationReport:
    """Record the ``allocation.health_report`` of ``alloc``, being released in
    this transaction (``alloc.updated_at`` is its release); returns it.
    Replacements come from the allocation's own replacement events (not read
    when ``taken`` says this controller admitted it and replaced none)."""
    # The allocation's own events, by its index, in one read: a handful.
    replaced = (
        []
        if taken.unreplaced
        else tx.events.since(0, allocation=alloc.id, kinds=_REPLACEMENT_KINDS, limit=100_000)
    )
    report = build_report(
        alloc.id,
        taken,
        ended_at=alloc.updated_at,
        held=held,
        created_at=alloc.created_at,
        tracking_since=tracking_since,
        replacements=replacements_from(replaced),
    )
    partial = "partial " if report.partial else ""
    record(
        tx,
        EventKind.ALLOCATION_HEALTH_REPORT,
        allocation=alloc.id,
        reason=f"{partial}health report: {len(report.gpus)} GPU(s), {report.reports} report(s)",
        **report_data(report),
    )
    return report


def report_event(tx: Tx, allocation: str) -> EventInfo | None:
    """The allocation's ``allocation.health_report`` event (None: none), read
    through its own events: indexed by allocation, so the cost is the
    allocation's size, not how many allocations were released since."""
    after, found = 0, None
    while True:
        page = tx.events.since(
            after,
            allocation=allocation,
            kinds=(EventKind.ALLOCATION_HEALTH_REPORT,),
            limit=EVENTS_PAGE,
        )
        for e in page:
            if e.kind == EventKind.ALLOCATION_HEALTH_REPORT:
                found = e
        if len(page) < EVENTS_PAGE:
            return found
        after = page[-1].seq


def stored_report(tx: Tx, alloc: AllocationRecord) -> AllocationReport:
    """The health report recorded when ``alloc`` was released.

    Raises:
        FailedPrecondition: it is still pending or held (the report is written
            when it is released), or it was refused and never held a node.
        NotFound: it was released before Kiln wrote health reports.
    """
    if alloc.state in OPEN:
        still = "held" if alloc.state in HOLDING else "pending"
        raise FailedPrecondition(
            f"allocation {alloc.id} is still {still}; its report is written when it is released"
        )
    if alloc.state == AllocationState.FAILED:
        raise FailedPrecondition(
            f"allocation {alloc.id} failed ({alloc.reason}) and never held a node: "
            "it has no health report"
        )
    found = report_event(tx, alloc.id)
    if found is None:
        raise NotFound(
            f"allocation {alloc.id} has no health report: it was released before Kiln wrote them"
        )
    return report_from_event(found)
