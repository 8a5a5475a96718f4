"""Bringing an NVL72 rack into service as one step (``kiln racks bring-up``).

    1. enrol or adopt  — the rack's members as given (compute trays, NVLink
                         switch trays, power shelves), everything checked first;
    2. hold            — every compute tray is held from new work meanwhile
                         (``NodeRecord.rack_hold``, kept across restarts);
    3. power on        — power shelves, then switch trays, then compute trays,
                         each group on before the next starts;
    4. provision or    — with an image, the trays are provisioned together
       inspect           (``core.provisioning``); otherwise inspected as usual;
                         the lifecycle prepares each to the baseline profile
                         (its firmware pins) and health-gates it;
    5. firmware        — every ready tray's firmware inventory must match the
                         baseline's pins, or, without pins, the other trays':
                         no mixed versions inside one NVLink domain;
    6. fabric          — every tray's GPUs in one fabric clique, the rack's,
                         with fabric state completed and healthy;
    7. report          — one line per member; the hold is lifted from every
                         tray only when all passed, so the rack is handed out
                         whole or not at all. A tray that fails is named with
                         its reason and does not stop the others.

Trays settle at their own pace: the rack waits only for the slowest (the goal
is rack ready ≤ 2 × the slowest tray; ``BringUpReport.slowest_tray_s``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from controller.core.errors import FailedPrecondition, InvalidArgument, KilnError, NotSupported
from controller.core.health import HealthReport
from controller.core.identity import Caller
from controller.core.model import (
    EnrollSpec,
    GpuInfo,
    NodeInfo,
    ProvisionProgress,
    ProvisionScope,
)
from controller.core.nodes import Nodes, validate_name
from controller.core.ports import BmcGateway, Store, Tx
from controller.core.profiles import ProfileCatalog
from controller.core.provisioning import ResolvedImage
from controller.core.records import NodeRecord
from controller.core.states import OUT_OF_SERVICE, NodeKind, NodeState, PowerState
from controller.core.transitions import load_node, move

log = logging.getLogger(__name__)

S = NodeState
DEFAULT_TIMEOUT_S = 3600.0
POLL_S = 0.25
# How long one group of members (the power shelves, the switch trays) may take
# to report power on before the next group goes ahead without the laggards.
GROUP_POWER_S = 300.0
FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
POWER_ORDER = (NodeKind.POWER_SHELF, NodeKind.SWITCH_TRAY, NodeKind.COMPUTE)
# Brought back into service by a bring-up (an operator's drain or power-off);
# a quarantine is a verdict, so a quarantined tray stays and is reported.
BROUGHT_BACK = frozenset({S.POWERED_OFF, S.MAINTENANCE})


@dataclass(frozen=True)
class BringUpRequest:
    rack: str
    members: tuple[EnrollSpec, ...] = ()
    image: str = ""
    profile: str = ""
    timeout_s: float = 0.0
    concurrency: int = 0


@dataclass(frozen=True)
class TrayReport:
    node: str
    kind: NodeKind
    state: NodeState
    ok: bool
    reason: str = ""
    firmware: dict[str, str] = field(default_factory=dict)
    clique: str = ""
    ready_s: float = 0.0
    power: PowerState = PowerState.UNKNOWN


@dataclass(frozen=True)
class BringUpReport:
    rack: str
    rack_ready: bool
    trays: tuple[TrayReport, ...]
    elapsed_s: float
    slowest_tray_s: float
    fabric_clique: str
    reason: str = ""


@dataclass(frozen=True)
class BringUpLine:
    """One line of progress (phases: see ``BringUpProgress`` in fleet.proto)."""

    rack: str
    phase: str
    node: str = ""
    ok: bool = True
    message: str = ""
    ready: int = 0
    total: int = 0
    elapsed_s: float = 0.0
    report: BringUpReport | None = None


# (scope, the verified image, concurrency, the caller) → its progress:
# ``Fleet.provision_resolved``.
Provision = Callable[
    [ProvisionScope, ResolvedImage, int, Caller | None], AsyncIterator[ProvisionProgress]
]


def in_progress_hold(rack: str) -> str:
    return f"rack {rack} is being brought up (kiln racks bring-up)"


def failed_hold(rack: str, reason: str) -> str:
    return f"rack {rack} is not brought up: {reason}; fix it and run kiln racks bring-up {rack}"


class RackBringUp:
    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        bmc: BmcGateway,
        profiles: ProfileCatalog,
        *,
        enroll: Callable[[EnrollSpec], Awaitable[NodeInfo]],
        undrain: Callable[[str], Awaitable[NodeInfo]],
        provision: Provision,
        poke: Callable[[str], None],
        on_capacity: Callable[[], Awaitable[None]],
        check_image: Callable[[str], Awaitable[ResolvedImage]],
    ) -> None:
        self._store = store
        self._nodes = nodes
        self._bmc = bmc
        self._profiles = profiles
        self._enroll = enroll
        self._undrain = undrain
        self._provision = provision
        self._poke = poke
        self._on_capacity = on_capacity
        self._check_image = check_image
        self._running: set[str] = set()

    # -- checks before anything is done ------------------------------------

    async def _validate(
        self, request: BringUpRequest
    ) -> tuple[tuple[EnrollSpec, ...], ResolvedImage | None]:
        """The members to enrol and the image, verified once (None: inspect)."""
        validate_name("rack", request.rack)
        if request.timeout_s < 0 or request.concurrency < 0:
            raise InvalidArgument("timeout and concurrency must be 0 or more")
        if request.profile:
            self._profiles.get(request.profile)
        specs = []
        for spec in request.members:
            if spec.rack and spec.rack != request.rack:
                raise InvalidArgument(
                    f"member {spec.name!r} names rack {spec.rack!r}, not {request.rack!r}"
                )
            spec = dataclasses.replace(spec, rack=request.rack)
            if spec.kind == NodeKind.COMPUTE and request.profile and not spec.profile:
                spec = dataclasses.replace(spec, profile=request.profile)
            self._nodes.validate(spec)
            if spec.profile:
                self._profiles.get(spec.profile)
            specs.append(spec)
        names = [s.name for s in specs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidArgument(f"member(s) named twice: {', '.join(twice)}")
        view = await self._nodes.loaded()
        for spec in specs:
            known = view.get(spec.name)
            if known is not None and (known.rack != request.rack or known.kind != spec.kind):
                raise FailedPrecondition(
                    f"node {spec.name!r} is enrolled as a {known.kind.value} in rack "
                    f"{known.rack or '(none)'!r}, not a {spec.kind.value} in {request.rack!r}"
                )
        enrolled = await self._trays(request.rack)
        if not enrolled and not any(s.kind == NodeKind.COMPUTE for s in specs):
            raise InvalidArgument(
                f"rack {request.rack!r} has no compute trays: name them in the members"
            )
        for node in enrolled:
            if node.allocation_id:
                raise FailedPrecondition(
                    f"tray {node.name!r} is held by allocation {node.allocation_id}; "
                    "release it before bringing the rack up"
                )
        image = await self._check_image(request.image) if request.image else None
        return tuple(specs), image

    async def _trays(self, rack: str) -> list[NodeRecord]:
        return await self._members(rack, NodeKind.COMPUTE)

    async def _members(self, rack: str, kind: NodeKind) -> list[NodeRecord]:
        """The rack's nodes of ``kind``, by name (compute trays: ``_trays``)."""
        view = await self._nodes.loaded()
        return sorted(
            (n for n in view.all() if n.rack == rack and n.kind == kind), key=lambda n: n.name
        )

    # -- the run -------------------------------------------------------------

    async def run(
        self, request: BringUpRequest, by: Caller | None = None
    ) -> AsyncIterator[BringUpLine]:
        """Bring ``request.rack`` up; yields progress, the last line with the report.

        Raises (before anything is changed):
            InvalidArgument: a bad rack name, member or option; a rack with no trays.
            NotFound: an unknown profile or image.
            FailedPrecondition: the rack is being brought up already; a member
                enrolled elsewhere or as another kind; a tray held by an allocation.
        """
        rack = request.rack
        if rack in self._running:
            raise FailedPrecondition(f"rack {rack!r} is already being brought up")
        self._running.add(rack)
        try:
            specs, image = await self._validate(request)
            async for line in self._run(request, specs, image, by):
                yield line
        finally:
            self._running.discard(rack)

    async def _run(
        self,
        request: BringUpRequest,
        specs: Sequence[EnrollSpec],
        image: ResolvedImage | None,
        by: Caller | None,
    ) -> AsyncIterator[BringUpLine]:
        rack = request.rack
        started = time.monotonic()
        deadline = started + (request.timeout_s or DEFAULT_TIMEOUT_S)
        finished = False

        def line(phase: str, node: str = "", ok: bool = True, message: str = "") -> BringUpLine:
            return BringUpLine(
                rack=rack,
                phase=phase,
                node=node,
                ok=ok,
                message=message,
                elapsed_s=round(time.monotonic() - started, 3),
            )

        failures: dict[str, str] = {}
        try:
            # Trays already enrolled are held at once; new ones as they enrol.
            held = [n.name for n in await self._trays(rack)]
            await self._hold(rack, in_progress_hold(rack), held)
            for kind in POWER_ORDER:
                group = [s for s in specs if s.kind == kind]
                # Trays to provision are not handed to the lifecycle: powering
                # them on to inspect an OS about to be replaced is a wasted boot.
                quiet = kind == NodeKind.COMPUTE and bool(request.image)
                enroll = self._nodes.enroll if quiet else self._enroll
                await asyncio.gather(*(enroll(spec) for spec in group))
                for spec in group:
                    yield line("enrolled", spec.name, message=f"{kind.value} enrolled or adopted")
                if kind == NodeKind.COMPUTE:
                    await self._hold(rack, in_progress_hold(rack), [s.name for s in group])
                    await self._adopt_trays(rack, request.profile, poke=not request.image)
                    break
                async for out in self._power_group(rack, kind, deadline, failures, line):
                    yield out
            trays = [n.name for n in await self._trays(rack)]
            if image is not None:
                async for out in self._provision_trays(request, image, trays, failures, line, by):
                    yield out
            ready_at: dict[str, float] = {}
            async for out in self._settle(rack, trays, deadline, failures, ready_at, line):
                yield out
            told = set(failures)
            report = await self._judge(rack, trays, failures, ready_at, started)
            for tray in report.trays:
                if not tray.ok and tray.node not in told:
                    yield line("failed", tray.node, ok=False, message=tray.reason)
            if report.rack_ready:
                await self._hold(rack, "", trays)
                await self._on_capacity()
            else:
                await self._hold(rack, failed_hold(rack, report.reason), trays)
            finished = True
            done = line("done", ok=report.rack_ready, message=report.reason or "rack ready")
            ready = sum(1 for t in report.trays if t.ok and t.kind == NodeKind.COMPUTE)
            yield dataclasses.replace(done, report=report, ready=ready, total=len(trays))
        finally:
            if not finished:  # cancelled or failed midway: never leave it looking in progress
                with_hold = [n.name for n in await self._trays(rack)]
                try:
                    await self._hold(
                        rack, failed_hold(rack, "its bring-up was interrupted"), with_hold
                    )
                except Exception:
                    log.exception("rack %s: could not mark the interrupted bring-up", rack)

    async def _hold(self, rack: str, why: str, names: Sequence[str]) -> None:
        if not names:
            return

        def write(tx: Tx) -> None:
            for name in names:
                node = tx.nodes.get(name)
                if node is None or node.rack_hold == why:
                    continue
                node.rack_hold = why
                tx.nodes.save(node)

        await self._store.tx(write)
        if why:
            log.info("rack %s: %d trays held: %s", rack, len(names), why)
        else:
            log.info("rack %s: brought up; %d trays released to work", rack, len(names))

    async def _adopt_trays(self, rack: str, profile: str, *, poke: bool) -> None:
        """Trays enrolled before: the baseline profile set and, unless they
        are to be provisioned (``poke`` False), a powered-off or maintenance
        tray brought back, a ready one that is off powered on."""
        for node in await self._trays(rack):
            if profile and node.profile != profile:
                await self._set_profile(node.name, profile)
            if not poke:
                continue
            if node.state in BROUGHT_BACK:
                await self._undrain(node.name)
            elif node.state == S.READY and node.power == PowerState.OFF:
                await self._nodes.power(node.name, "on")
            self._poke(node.name)

    async def _set_profile(self, name: str, profile: str) -> None:
        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            node.profile = profile
            tx.nodes.save(node)
            if node.state == S.READY:
                move(tx, node, S.PREPARING, f"rack bring-up: baseline profile now {profile}")

        await self._store.tx(write)

    async def _power_group(
        self,
        rack: str,
        kind: NodeKind,
        deadline: float,
        failures: dict[str, str],
        line: Callable[..., BringUpLine],
    ) -> AsyncIterator[BringUpLine]:
        """Every member of ``kind`` on (the lifecycle powers new ones) before
        the next group starts; one that will not come on is named and left."""
        group = await self._members(rack, kind)
        for node in group:
            try:
                if node.state in BROUGHT_BACK:
                    await self._undrain(node.name)  # the lifecycle powers it on again
                elif node.state == S.READY and node.power == PowerState.OFF:
                    await self._nodes.power(node.name, "on")
            except KilnError as e:
                failures[node.name] = f"did not power on: {e}"
            self._poke(node.name)
        waiting = {n.name for n in group} - set(failures)
        deadline = min(deadline, time.monotonic() + GROUP_POWER_S)
        while waiting and time.monotonic() < deadline:
            view = await self._nodes.loaded()
            for name in sorted(waiting):
                now = view.get(name)
                if now is None:
                    failures[name] = "removed during the bring-up"
                elif now.power == PowerState.ON and now.state == S.READY:
                    waiting.discard(name)
                    yield line("powered_on", name, message=f"{kind.value} powered on")
                elif now.state in OUT_OF_SERVICE:
                    failures[name] = f"{now.state.value}: {now.state_reason}"
            waiting -= set(failures)
            if waiting:
                await asyncio.sleep(POLL_S)
        for name in sorted(waiting):
            last = (await self._nodes.loaded()).get(name)
            state = last.state_reason if last is not None else "gone"
            failures[name] = f"not powered on in time ({state})"
        for name in sorted(n.name for n in group if n.name in failures):
            yield line("failed", name, ok=False, message=failures[name])

    async def _provision_trays(
        self,
        request: BringUpRequest,
        image: ResolvedImage,
        trays: Sequence[str],
        failures: dict[str, str],
        line: Callable[..., BringUpLine],
        by: Caller | None,
    ) -> AsyncIterator[BringUpLine]:
        concurrency = request.concurrency or len(trays)
        scope = ProvisionScope(rack=request.rack)
        async for p in self._provision(scope, image, concurrency, by):
            if p.node not in trays:
                continue
            if not p.ok:
                failures[p.node] = f"provisioning {request.image} failed: {p.error}"
                yield line("failed", p.node, ok=False, message=failures[p.node])
            else:
                yield line("provisioning", p.node, message=p.phase)

    async def _settle(
        self,
        rack: str,
        trays: Sequence[str],
        deadline: float,
        failures: dict[str, str],
        ready_at: dict[str, float],
        line: Callable[..., BringUpLine],
    ) -> AsyncIterator[BringUpLine]:
        """Wait until every tray is ready or out of service (or the deadline),
        with a line each time a tray changes state."""
        started = time.monotonic()
        seen: dict[str, NodeState] = {}
        waiting = [t for t in trays if t not in failures]
        while waiting:
            view = await self._nodes.loaded()
            for name in list(waiting):
                node = view.get(name)
                if node is None:
                    failures[name] = "removed during the bring-up"
                    yield line("failed", name, ok=False, message=failures[name])
                    waiting.remove(name)
                    continue
                if seen.get(name) != node.state:
                    seen[name] = node.state
                    if node.state not in OUT_OF_SERVICE:
                        yield line(node.state.value, name, message=node.state_reason)
                if node.state == S.READY and not node.mid_operation:
                    ready_at[name] = time.monotonic()
                    waiting.remove(name)
                elif node.state in OUT_OF_SERVICE:
                    failures[name] = f"{node.state.value}: {node.state_reason}"
                    yield line("failed", name, ok=False, message=failures[name])
                    waiting.remove(name)
            if not waiting:
                break
            if time.monotonic() >= deadline:
                for name in waiting:
                    node = view.get(name)
                    where = f"{node.state.value}: {node.state_reason}" if node else "gone"
                    failures[name] = f"not ready after {time.monotonic() - started:.0f} s ({where})"
                    yield line("failed", name, ok=False, message=failures[name])
                break
            await asyncio.sleep(POLL_S)

    # -- the verdict ---------------------------------------------------------

    async def _judge(
        self,
        rack: str,
        trays: Sequence[str],
        failures: dict[str, str],
        ready_at: dict[str, float],
        started: float,
    ) -> BringUpReport:
        view = await self._nodes.loaded()
        ready = [view.get(t) for t in trays if t not in failures]
        records = [n for n in ready if n is not None]
        firmware = await self._firmware(records)
        profile_pins = self._pins(records)
        for name, why in firmware_mismatches(firmware, profile_pins).items():
            failures.setdefault(name, why)
        cliques = {n.name: tray_cliques(view.gpus(n.name)) for n in records}
        rack_clique = majority([next(iter(c)) for c in cliques.values() if len(c) == 1])
        for n in records:
            why = fabric_problem(
                cliques[n.name], rack_clique, self._nodes.latest_health(n), len(records)
            )
            if why:
                failures.setdefault(n.name, why)
        reports = []
        everyone = [view.get(t) for t in trays]
        for kind in POWER_ORDER[:2]:
            everyone += await self._members(rack, kind)
        for node in everyone:
            if node is None:
                continue
            c = cliques.get(node.name, frozenset())
            at = ready_at.get(node.name)
            reports.append(
                TrayReport(
                    node=node.name,
                    kind=node.kind,
                    state=node.state,
                    ok=node.name not in failures,
                    reason=failures.get(node.name, ""),
                    firmware=firmware.get(node.name, {}),
                    clique=next(iter(c)) if len(c) == 1 else ",".join(sorted(c)),
                    ready_s=round(at - started, 3) if at is not None else 0.0,
                    power=node.power,
                )
            )
        bad = sorted(failures)
        reason = ""
        if bad:
            named = "; ".join(f"{n}: {failures[n]}" for n in bad[:3])
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            reason = f"{len(bad)} member(s) failed: {named}{more}"
        ok_times = [r.ready_s for r in reports if r.ok and r.kind == NodeKind.COMPUTE]
        return BringUpReport(
            rack=rack,
            rack_ready=not bad,
            trays=tuple(reports),
            elapsed_s=round(time.monotonic() - started, 3),
            slowest_tray_s=max(ok_times, default=0.0),
            fabric_clique=rack_clique,
            reason=reason,
        )

    def _pins(self, records: Sequence[NodeRecord]) -> dict[str, str]:
        """The firmware versions the trays' baseline profile pins (component →
        version); empty when none pins any (then the trays must agree)."""
        pins: dict[str, str] = {}
        for node in records:
            if node.profile:
                for pin in self._profiles.get(node.profile).firmware:
                    pins[pin.component] = pin.version
        return pins

    async def _firmware(self, records: Sequence[NodeRecord]) -> dict[str, dict[str, str]]:
        """Each tray's firmware inventory ({} where the BMC keeps none)."""

        async def one(node: NodeRecord) -> tuple[str, dict[str, str]]:
            try:
                return node.name, await self._bmc.firmware_versions(await self._nodes.target(node))
            except NotSupported:
                return node.name, {}

        return dict(await asyncio.gather(*(one(n) for n in records)))


def firmware_mismatches(
    inventories: dict[str, dict[str, str]], pins: dict[str, str]
) -> dict[str, str]:
    """Trays whose firmware differs from the pinned version or, for a
    component nothing pins, from the version most trays run (one NVLink domain
    must not mix versions). Returns tray → why."""
    problems: dict[str, str] = {}
    components = sorted({c for inv in inventories.values() for c in inv})
    for component in components:
        versions = {t: inv[component] for t, inv in inventories.items() if component in inv}
        want = pins.get(component) or majority(list(versions.values()))
        others = sum(1 for v in versions.values() if v == want)
        for tray, version in sorted(versions.items()):
            if version == want or tray in problems:
                continue
            if component in pins:
                problems[tray] = f"firmware {component} at {version}; the baseline pins {want}"
            else:
                problems[tray] = (
                    f"firmware {component} at {version}; {others} other tray(s) run {want} "
                    "(no mixed versions in one NVLink domain)"
                )
    return problems


def tray_cliques(gpus: Sequence[GpuInfo]) -> frozenset[str]:
    return frozenset(g.clique for g in gpus)


def fabric_problem(
    cliques: frozenset[str], rack_clique: str, health: HealthReport | None, trays: int
) -> str:
    """Why a tray's GPUs are not part of the rack's NVLink fabric ("": they are)."""
    if not cliques or cliques == {""}:
        return "its GPUs report no NVLink fabric clique"
    if len(cliques) > 1:
        return f"its GPUs are split over fabric cliques {', '.join(sorted(cliques))}"
    (clique,) = cliques
    if clique != rack_clique:
        return (
            f"fabric clique {clique} differs from the rack's {rack_clique or '(none agreed)'} "
            f"({trays} trays)"
        )
    for g in health.gpus if health is not None else ():
        if g.fabric_state != FABRIC_COMPLETED or not g.fabric_healthy:
            return (
                f"GPU {g.index} NVLink fabric state {g.fabric_state} "
                f"({'healthy' if g.fabric_healthy else 'unhealthy'}; want completed and healthy)"
            )
    return ""


def majority(values: Sequence[str]) -> str:
    """The most common value (ties: the smallest), "" for none."""
    if not values:
        return ""
    counts = Counter(values)
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)
