"""The domain core's front door: what the API layer calls.

Fleet wires inventory, allocations, the lifecycle reconciler, the agent hub
and the event log together. It knows nothing of gRPC or of BMC libraries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from controller.checks import Suite
from controller.core.agents import AgentHub, AgentSession
from controller.core.allocations import Allocations
from controller.core.audit import AuditEntry, AuditLog, CallAudit
from controller.core.checks import CheckRunInfo, CheckRunner
from controller.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    KilnError,
    NotFound,
    PermissionDenied,
)
from controller.core.eventlog import EventLog
from controller.core.health import HealthReport, PackedReport
from controller.core.health_policy import PolicyRunner
from controller.core.identity import SYSTEM, Caller, Role, TokenInfo
from controller.core.job_health import AllocationReport
from controller.core.json_depth import nests_deeper_than
from controller.core.leaks import DEFAULT_LEAK_INTERVAL, LeakWatcher
from controller.core.lifecycle import Lifecycle
from controller.core.live import DEFAULT_FLUSH_INTERVAL, LiveHealth
from controller.core.meter import Meter, NullMeter
from controller.core.model import (
    AgentCommand,
    AllocationInfo,
    AllocationSpec,
    CommandOutcome,
    EnrollSpec,
    EventInfo,
    GpuInfo,
    NodeInfo,
    PowerResult,
    PowerScope,
    ProvisionPhase,
    ProvisionProgress,
    ProvisionScope,
    RackInfo,
)
from controller.core.nodes import BASELINE_GATE, Nodes, validate_gpus
from controller.core.paging import (
    AllocationFilter,
    NodeFilter,
    Page,
    allocation_page,
    node_page,
)
from controller.core.ports import BmcGateway, ImageVerifier, Store
from controller.core.power_block import PowerBlockGate
from controller.core.power_sync import (
    DEFAULT_POWER_SYNC_RATE,
    DEFAULT_POWER_SYNC_SPREAD,
    DEFAULT_POWER_SYNC_VOUCHED_EVERY,
    PowerSync,
)
from controller.core.preparation import Preparer, PrepLimits
from controller.core.profiles import HealthGate, ProfileCatalog
from controller.core.provisioning import (
    FINAL,
    Provisioner,
    ProvisionLimits,
    ResolvedImage,
    progress_lines,
)
from controller.core.rack_bringup import BringUpLine, BringUpRequest, RackBringUp
from controller.core.report_pace import LoopLagProbe, PaceRules, ReportDelays, ReportPace
from controller.core.states import NodeState
from controller.core.tasks import BackgroundTasks
from controller.core.tokens import Tokens
from controller.placement import (
    QueueConfig,
    export_k8s_labels_text,
    export_slurm_topology,
)
from controller.policies import PolicyEngine, RuleSet, load_default_rules
from images.catalog import Catalog

log = logging.getLogger(__name__)

# Health reports a second the controller asks its agents for, at most; more
# agents than that allows are told to report less often (agent_sample_interval).
DEFAULT_MAX_REPORTS_PER_SECOND = 5000.0
MAX_FAULT_DEPTH = 16  # a fault is a flat object; checked before json.loads recurses


def _not_a_number(constant: str) -> object:
    """``json.loads`` takes NaN and Infinity, which JSON itself does not."""
    raise InvalidArgument(f"fault JSON holds {constant}, which is not a number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise InvalidArgument(f"fault JSON holds {text[:64]}, which is not a finite number")
    return value


class TopologyFormat(enum.StrEnum):
    SLURM = "slurm"  # topology.conf for Slurm's topology/block plugin
    K8S_LABELS = "k8s_labels"  # one line of node labels per node


class Fleet:
    def __init__(
        self,
        store: Store,
        bmc: BmcGateway,
        *,
        profiles: ProfileCatalog | None = None,
        queues: Sequence[QueueConfig] = (),
        reconcile_interval: float = 1.0,
        sample_interval: float = 5.0,
        rules: RuleSet | None = None,
        power_sync_interval: float = 60.0,
        power_sync_rate: float = DEFAULT_POWER_SYNC_RATE,
        power_sync_spread: float = DEFAULT_POWER_SYNC_SPREAD,
        power_sync_vouched_every: int = DEFAULT_POWER_SYNC_VOUCHED_EVERY,
        prep_limits: PrepLimits | None = None,
        agent_silent_after: float = 15.0,
        bmc_thermal_interval: float = 10.0,
        health_flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        max_reports_per_second: float = DEFAULT_MAX_REPORTS_PER_SECOND,
        meter: Meter | None = None,
        baseline_gate: HealthGate | None = BASELINE_GATE,
        checks: Suite | None = None,
        leak_interval: float = DEFAULT_LEAK_INTERVAL,
        images: Catalog | None = None,
        image_verifier: ImageVerifier | None = None,
        image_server: str | None = None,
        provision_limits: ProvisionLimits | None = None,
        pace: PaceRules | None = None,
    ) -> None:
        """``checks``: the health-check suite (``controller.checks``); None
        runs no checks, and RunChecks is refused. ``leak_interval``: seconds
        between reads of every node's leak detectors (``core.leaks``).
        ``images``: the OS image catalogue (None: ProvisionNodes is refused),
        ``image_verifier`` checks an image's bytes against its pin first,
        ``image_server`` overrides the catalogue's; see ``core.provisioning``.
        ``pace``: when the measured lag slows the agents' reports down
        (``core.report_pace``)."""
        self.store = store
        self.meter: Meter = meter or NullMeter()
        self.profiles = profiles or ProfileCatalog()
        self.agents = AgentHub()
        self.events = EventLog(store)
        self.live = LiveHealth(store, flush_interval=health_flush_interval)
        self.nodes = Nodes(store, bmc, self.agents, self.live, baseline_gate=baseline_gate)
        # Everything else reaches the BMCs through the gate: no power-on of a
        # node whose power is blocked by a coolant leak, whoever asks.
        self.bmc: BmcGateway = PowerBlockGate(bmc, self.nodes)
        bmc = self.bmc
        # How often the agents are asked to report now (``self.pace``, made
        # below): a paced agent's reports are no gap to the policies or the
        # job health tallies.
        asked_interval = lambda: self.report_interval  # noqa: E731
        self.allocations = Allocations(
            store, self.nodes, queues=queues, meter=self.meter, report_interval=asked_interval
        )
        self.agents.watch(self.allocations.specs.touch)  # connected: schedulable
        self.checks = (
            CheckRunner(store, self.nodes, self.agents, checks, on_done=self._checked)
            if checks is not None
            else None
        )
        self.provisioner = Provisioner(
            store,
            self.nodes,
            self.agents,
            bmc,
            catalog=images,
            verifier=image_verifier,
            limits=provision_limits,
            image_server=image_server,
            on_slot_free=self._slot_free,
        )
        self.lifecycle = Lifecycle(
            store,
            self.nodes,
            self.agents,
            bmc,
            self.profiles,
            self.allocations.schedule_pass,
            self.allocations.node_failed,
            interval=reconcile_interval,
            preparer=Preparer(bmc, prep_limits),
            checks=self.checks,
            provisioner=self.provisioner,
        )
        self.policies = PolicyRunner(
            store,
            self.nodes,
            self.agents,
            bmc,
            PolicyEngine(rules or load_default_rules()),
            self.allocations.node_failed,
            silent_after=agent_silent_after,
            bmc_sample_interval=bmc_thermal_interval,
            meter=self.meter,
            report_interval=asked_interval,
        )
        self.power_sync = PowerSync(
            store,
            self.nodes,
            bmc,
            interval=power_sync_interval,
            rate=power_sync_rate,
            spread=power_sync_spread,
            on_change=self.allocations.schedule_pass,  # a BMC answering again frees a node
            on_node_changed=self.lifecycle.poke,
            meter=self.meter,
            agents=self.agents,
            vouched_every=power_sync_vouched_every,
        )
        self.leaks = LeakWatcher(
            store, self.nodes, bmc, self.allocations.node_failed, interval=leak_interval
        )
        self.tokens = Tokens(store)
        self.racks = RackBringUp(
            store,
            self.nodes,
            bmc,
            self.profiles,
            enroll=self.enroll,
            undrain=self.undrain,
            provision=lambda scope, image, concurrency, by: self.provision_resolved(
                scope, image, concurrency=concurrency, by=by
            ),
            poke=self.lifecycle.poke,
            on_capacity=self.allocations.schedule_pass,
            check_image=lambda image: self.provisioner.resolve(image, ""),
        )
        self.audit = AuditLog(store)
        self.sample_interval = sample_interval
        self.max_reports_per_second = max_reports_per_second
        self._budget_told = sample_interval  # what the budget last allowed
        self.pace = ReportPace(pace or PaceRules(), budget=lambda: self._budget_told)
        self.report_delays = ReportDelays()
        self._lag_probe = LoopLagProbe(self.pace, self.report_delays, self._paced)
        self._loops = BackgroundTasks()
        self._background = BackgroundTasks()
        self._schedule_queued = False
        self.stopping = False  # set by the server before it ends the streams

    async def start(self) -> None:
        await self.nodes.loaded()  # the fleet in memory before the loops read it
        await self.allocations.loaded()
        # Caps count what the rules took down before this controller started.
        await self.policies.restore()
        self.live.start()
        self._loops.spawn(self.lifecycle.run(), name="kiln-lifecycle")
        self._loops.spawn(self.policies.run(), name="kiln-policies")
        self._loops.spawn(self.power_sync.run(), name="kiln-power-sync")
        if self.checks is not None:
            self._loops.spawn(self.checks.run(), name="kiln-periodic-checks")
        self._loops.spawn(self.leaks.run(), name="kiln-leaks")
        self._loops.spawn(self._lag_probe.run(), name="kiln-report-pace")

    async def stop(self) -> None:
        await self._loops.stop()
        await self._background.stop()
        await self.allocations.stop()
        await self.leaks.stop()
        await self.lifecycle.stop()
        if self.checks is not None:
            await self.checks.stop()
        await self.policies.stop()
        await self.live.stop()  # the last samples written

    # -- nodes -----------------------------------------------------------------

    async def enroll(self, spec: EnrollSpec) -> NodeInfo:
        """Enrol a node (idempotent). Everything is checked before anything is
        stored: a bad name or BMC, or an unknown profile, stores nothing.

        Raises:
            InvalidArgument, NotFound (the profile), AlreadyExists.
        """
        self.nodes.validate(spec)
        if spec.profile:
            self.profiles.get(spec.profile)
        node = await self.nodes.enroll(spec)
        self.lifecycle.poke(spec.name)
        return node

    async def get_node(self, name: str) -> NodeInfo:
        return await self.nodes.get(name)

    async def list_nodes(self, *, rack: str = "", state: str = "") -> list[NodeInfo]:
        return await self.nodes.query(rack=rack, state=state)

    async def list_nodes_page(
        self, filters: NodeFilter, *, page_size: int = 0, page_token: str = ""
    ) -> Page[NodeInfo]:
        """One page of nodes by name; see ``controller.core.paging``.

        Raises InvalidArgument: an unknown state, a negative page size, or a
        page token that is garbled or was issued for other filters.
        """
        return await node_page(self.nodes, filters, size=page_size, token=page_token)

    async def list_racks(self) -> list[RackInfo]:
        return await self.nodes.racks()

    async def power(self, name: str, action: str) -> PowerResult:
        return await self.nodes.power(name, action)

    def power_many(
        self, scope: PowerScope, action: str, *, concurrency: int = 64
    ) -> AsyncIterator[tuple[PowerResult, int, int]]:
        """See ``Nodes.power_many``."""
        return self.nodes.power_many(scope, action, concurrency=concurrency)

    async def provision_many(
        self,
        scope: ProvisionScope,
        image: str,
        *,
        image_server: str = "",
        concurrency: int = 0,
        by: Caller | None = None,
    ) -> AsyncIterator[ProvisionProgress]:
        """Provision ``image`` onto the scope's nodes, at most ``concurrency``
        of them in provisioning at once (0: the controller's default); yields
        each node's progress (``core.provisioning.PHASES``) as it happens and
        ends when every node reached inspecting or failed.

        Everything is checked before any node is touched (``Provisioner.resolve``
        and ``targets``). A node already started goes on when the stream ends
        (its state is stored); one not yet started is not started.

        Raises:
            InvalidArgument, NotFound, FailedPrecondition, Unavailable: see
                ``Provisioner.resolve`` and ``Provisioner.targets``.
        """
        if concurrency < 0:
            raise InvalidArgument("concurrency must be 0 or more")
        started = time.monotonic()
        resolved = await self.provisioner.resolve(image, image_server)
        progress = self.provision_resolved(
            scope, resolved, concurrency=concurrency, by=by, started=started
        )
        async for line in progress:
            yield line

    async def provision_resolved(
        self,
        scope: ProvisionScope,
        resolved: ResolvedImage,
        *,
        concurrency: int = 0,
        by: Caller | None = None,
        started: float | None = None,
    ) -> AsyncIterator[ProvisionProgress]:
        """``provision_many`` for an image already resolved and verified
        (``Provisioner.resolve``), so a caller that checked it first does not
        fetch and hash it again; ``started``: when the request began."""
        started = time.monotonic() if started is None else started
        chosen, skipped = await self.provisioner.targets(scope, resolved.url)
        total = len(chosen) + len(skipped)
        for line in progress_lines(chosen, skipped):
            yield dataclasses.replace(line, image=resolved.image, image_url=resolved.url)
        done = len(skipped)
        merged: asyncio.Queue[ProvisionProgress] = asyncio.Queue()
        gate = asyncio.Semaphore(concurrency or self.provisioner.limits.default_concurrency)
        who = by.name if by is not None else ""

        async def one(name: str) -> None:
            async with gate:
                watch = self.provisioner.watch(name)
                try:
                    await self.provisioner.begin(name, resolved, by=who)
                    self.lifecycle.poke(name)
                    while True:
                        try:
                            async with asyncio.timeout(2.0):
                                line = await watch.get()
                        except TimeoutError:
                            left = await self._left_provisioning(name)
                            if left is None:
                                continue
                            line = left
                        await merged.put(line)
                        if line.phase in FINAL:
                            return
                except Exception as e:
                    error = str(e) if isinstance(e, KilnError) else "internal error"
                    if not isinstance(e, KilnError):
                        log.exception("node %s: provisioning request failed", name)
                    await merged.put(
                        ProvisionProgress(node=name, phase="failed", ok=False, error=error)
                    )
                finally:
                    self.provisioner.unwatch(name, watch)

        tasks = [asyncio.create_task(one(n), name=f"provision-{n}") for n in chosen]
        try:
            remaining = len(tasks)
            while remaining:
                line = await merged.get()
                if line.phase in FINAL:
                    done += 1
                    remaining -= 1
                yield dataclasses.replace(
                    line,
                    image=resolved.image,
                    image_url=resolved.url,
                    done=done,
                    total=total,
                    elapsed_s=round(time.monotonic() - started, 3),
                )
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _left_provisioning(self, name: str) -> ProvisionProgress | None:
        """The final line for a node that left provisioning without a word to
        this request (an operator drained it, it was removed), or None."""
        try:
            row = await self.nodes.record(name)
        except NotFound:
            return ProvisionProgress(node=name, phase="failed", ok=False, error="node removed")
        if row.state == NodeState.PROVISIONING:
            return None
        failed = row.state in (NodeState.DRAINING, NodeState.QUARANTINED)
        return ProvisionProgress(
            node=name,
            phase="failed" if failed else "inspecting",
            ok=not failed,
            error=row.state_reason if failed else "",
        )

    def _slot_free(self) -> None:
        """A provisioning slot freed: look at the queued nodes now."""
        view = self.nodes.view
        if not view.ready:
            return
        for node in view.in_states([NodeState.PROVISIONING]):
            if node.provision is not None and node.provision.phase == ProvisionPhase.QUEUED:
                self.lifecycle.poke(node.name)

    async def set_credentials(self, name: str, username: str, password: str) -> NodeInfo:
        """See ``Nodes.set_credentials``; a node held back by a refused login
        is looked at again at once."""
        node = await self.nodes.set_credentials(name, username, password)
        self.leaks.forget(name)  # its leak reads use the new credentials
        self.lifecycle.poke(name)
        return node

    async def drain(self, name: str, reason: str) -> NodeInfo:
        node = await self.nodes.drain(name, reason)
        self.lifecycle.poke(name)
        return node

    async def undrain(self, node: str) -> NodeInfo:
        """Return a node to service; its health episodes start afresh.
        Raises FailedPrecondition while its power is blocked (a coolant leak)."""
        info = await self.nodes.undrain(node)
        self.policies.forget(node)
        self.lifecycle.poke(node)
        return info

    def bring_up_rack(
        self, request: BringUpRequest, by: Caller | None = None
    ) -> AsyncIterator[BringUpLine]:
        """See ``core.rack_bringup`` (docs/bring-up.md)."""
        return self.racks.run(request, by)

    async def remove_node(self, name: str, *, force: bool = False, reason: str = "") -> str:
        """Retire a node; returns the allocation it was taken out of ("" if none).

        Refused (FailedPrecondition, naming the allocation) while the node is
        allocated, unless ``force``: then its allocation loses it as it would
        lose a failed node (a replacement, or ``allocation.degraded``) first.
        Its events stay; its record, GPUs, agent tokens, health episodes,
        lifecycle backoff, BMC breaker and session, and agent stream do not.

        Raises NotFound for an unknown node.
        """
        node = await self.nodes.record(name)
        allocation = node.allocation_id
        if allocation and not force:
            raise FailedPrecondition(
                f"node {name!r} is in allocation {allocation}: release it first, or "
                "remove with force to take the node out of it (the allocation gets a "
                "replacement if one is free)"
            )
        if allocation:
            await self.allocations.node_failed(name, reason or "node removed")
        await self.nodes.remove(name, reason or "removed by operator")
        self.policies.forget(name)
        self.lifecycle.forget(name)
        if self.checks is not None:
            self.checks.forget(name)
        self.leaks.forget(name)
        self.live.forget(name)
        self.agents.drop(name)
        self.tokens.invalidate()  # its agent's tokens are gone: no cached one still works
        await self.allocations.schedule_pass()  # a request may never fit now: say so
        return allocation

    # -- health checks ------------------------------------------------------------

    def _checked(self, node: str) -> None:
        """A run of checks ended and moved the node: step it now."""
        self.lifecycle.poke(node)

    def _check_runner(self) -> CheckRunner:
        if self.checks is None:
            raise FailedPrecondition(
                "this controller runs no health checks (start it with a check suite)"
            )
        return self.checks

    async def run_checks(
        self, nodes: Sequence[str], *, rack: str = "", level: str = ""
    ) -> list[str]:
        """Run a level of the suite now on ready, idle nodes (or every node of
        ``rack``), all together; returns the nodes now testing.

        Raises InvalidArgument, NotFound, FailedPrecondition (no suite, or a
        node not ready and idle).
        """
        runner = self._check_runner()
        names = list(nodes)
        if rack:
            names += [n.name for n in await self.nodes.query(rack=rack)]
            if not names:
                raise NotFound(f"no nodes in rack {rack!r}")
        return await runner.run_now(names, level)

    async def list_checks(self, node: str, *, limit: int = 0) -> list[CheckRunInfo]:
        """The node's check runs, newest last (none when no suite runs)."""
        if self.checks is None:
            await self.nodes.get(node)
            return []
        return await self.checks.history(node, limit)

    async def clear_leak(
        self, name: str, reason: str = "", *, by: Caller | None = None
    ) -> NodeInfo:
        """Lift the node's power block after a coolant leak was repaired
        (``kiln nodes clear-leak``); records ``node.leak_cleared`` with
        ``reason`` and who cleared it. Idempotent: a node with no block is
        returned as it is. The node stays powered off and out of service
        until it is undrained.

        Raises:
            NotFound: unknown node.
            InvalidArgument: a reason with control characters or too long.
            FailedPrecondition: a leak detector of the node still reads Critical.
        """
        await self.leaks.clear(name, reason, by=by.name if by else "")
        self.lifecycle.poke(name)
        return await self.nodes.get(name)

    async def export_topology(self, fmt: TopologyFormat) -> str:
        topology = await self.allocations.topology()
        if fmt == TopologyFormat.K8S_LABELS:
            return export_k8s_labels_text(topology)
        return export_slurm_topology(topology)

    # -- allocations -------------------------------------------------------------

    async def create_allocation(
        self,
        key: str,
        spec: AllocationSpec,
        *,
        by: Caller | None = None,
        audit: CallAudit | None = None,
    ) -> AllocationInfo:
        """Raises NotFound for an unknown profile, before anything is stored.
        ``by`` is kept with the allocation as its creator; ``audit`` (the
        call's entry) is stored with it."""
        if spec.profile:
            self.profiles.get(spec.profile)
        created_by = by.name if by else ""
        return await self.allocations.create(key, spec, created_by=created_by, audit=audit)

    async def get_allocation(self, ident: str) -> AllocationInfo:
        return await self.allocations.get(ident)

    async def list_allocations(self, *, include_released: bool = False) -> list[AllocationInfo]:
        return await self.allocations.query(include_released=include_released)

    async def list_allocations_page(
        self, filters: AllocationFilter, *, page_size: int = 0, page_token: str = ""
    ) -> Page[AllocationInfo]:
        """One page of allocations in queue order; see ``controller.core.paging``.
        Raises InvalidArgument as ``list_nodes_page`` does."""
        return await allocation_page(self.store, filters, size=page_size, token=page_token)

    async def release(
        self, ident: str, *, by: Caller | None = None, audit: CallAudit | None = None
    ) -> AllocationInfo:
        """Raises PermissionDenied when a provisioner releases another's
        allocation. ``audit`` (the call's entry) is stored with the release."""
        if by is not None and by.role is Role.PROVISIONER:
            owner = (await self.allocations.get(ident)).created_by
            if owner != by.name:
                raise PermissionDenied(
                    f"provisioner {by.name!r} may release only its own allocations "
                    f"(this one was created by {owner or 'nobody known'!r}); "
                    "releasing others' needs role operator or admin"
                )
        allocation = await self.allocations.release(ident, audit=audit)
        self.lifecycle.wake()
        return allocation

    async def allocation_report(self, ident: str) -> AllocationReport:
        """A released allocation's health report (``controller/core/job_health.py``).

        Raises NotFound (no such allocation, or released before Kiln wrote
        reports) and FailedPrecondition (still pending or held; refused).
        """
        return await self.allocations.report(ident)

    async def latest_event_seq(self) -> int:
        """The newest event's sequence number (0: none yet)."""
        newest = await self.events.newest(1)
        return newest[-1].seq if newest else 0

    def watch_events(
        self, after_seq: int = 0, *, follow: bool = True, node: str = "", allocation: str = ""
    ) -> AsyncIterator[EventInfo]:
        return self.events.watch(after_seq, follow=follow, node=node, allocation=allocation)

    # -- identity and audit ------------------------------------------------------

    async def authenticate(self, token: str) -> Caller:
        """The caller a bearer token stands for. Raises Unauthenticated."""
        return await self.tokens.authenticate(token)

    async def create_token(
        self, name: str, role: str, *, ttl_s: float = 0.0, by: Caller
    ) -> tuple[TokenInfo, str]:
        """A new operator token and its secret (returned this once)."""
        return await self.tokens.create(name, role, ttl_s=ttl_s, by=by)

    async def list_tokens(self, *, include_revoked: bool = False) -> list[TokenInfo]:
        return await self.tokens.list(include_revoked=include_revoked)

    async def revoke_token(self, name: str, *, by: Caller) -> TokenInfo:
        return await self.tokens.revoke(name, by=by)

    async def issue_agent_token(self, node: str, *, by: Caller) -> str:
        """A token that registers ``node`` only (replacing its last). Raises NotFound."""
        await self.nodes.get(node)
        return await self.tokens.issue_agent_token(node, by=by)

    async def record_audit(self, entry: AuditEntry) -> None:
        await self.audit.record(entry)

    async def list_audit(
        self, *, since: float = 0.0, who: str = "", method: str = "", limit: int = 0
    ) -> list[AuditEntry]:
        return await self.audit.query(since=since, who=who, method=method, limit=limit)

    async def bootstrap_admin(self, keep: Callable[[str, str], Awaitable[None]]) -> str | None:
        """Make the fleet's first admin token, handing its name and secret to
        ``keep`` before it is stored; its name, or None when the fleet has, or
        had, one (see ``Tokens.ensure_admin``)."""
        name = await self.tokens.ensure_admin(keep)
        if name is not None:
            await self.audit.record(
                AuditEntry(
                    who=SYSTEM.name,
                    role=SYSTEM.role,
                    via=SYSTEM.via,
                    method="BootstrapAdminToken",
                    arguments={"name": name, "role": "admin"},
                    code="OK",
                )
            )
        return name

    # -- agents ----------------------------------------------------------------

    async def agent_connected(
        self,
        node: str,
        gpus: Sequence[GpuInfo],
        applied_profile: str,
        *,
        cert_expires_at: float | None = None,
    ) -> AgentSession:
        """Register a node's agent (``cert_expires_at``: when the client
        certificate it connected with expires). Raises NotFound for a node
        never enrolled, InvalidArgument for a malformed GPU inventory (before
        the node's current agent, if any, is replaced)."""
        validate_gpus(gpus)
        session = self.agents.attach(node, cert_expires_at=cert_expires_at)
        try:
            await self.nodes.agent_registered(node, gpus, applied_profile)
        except BaseException:
            self.agents.detach(session)
            raise
        log.info("node %s: agent registered with %d GPUs", node, len(gpus))
        self.lifecycle.poke(node)
        self._schedule_soon()  # the node may be schedulable again
        return session

    @property
    def report_interval(self) -> float:
        """The report interval agents are asked for now."""
        return self.pace.interval()

    def agent_sample_interval(self) -> float:
        """How often a registering agent is told to report (``Registered``):
        the configured sample interval, or longer when the fleet's agents at
        that interval would send more than ``max_reports_per_second``, or
        when the controller's measured lag has slowed every agent down
        (``core/report_pace.py``) — the controller slows its agents down
        rather than buffer without bound."""
        agents = self.agents.count() + 1
        interval = max(self.sample_interval, agents / self.max_reports_per_second)
        if interval > self.sample_interval and self._budget_told <= self.sample_interval:
            log.warning(
                "health reports: %d agents at one per %gs would send %.0f/s, over the "
                "budget of %g/s (--max-health-reports-per-second); agents registering "
                "now report every %.1fs",
                agents,
                self.sample_interval,
                agents / self.sample_interval,
                self.max_reports_per_second,
                interval,
            )
        elif interval <= self.sample_interval < self._budget_told:
            log.info("health reports: back within budget; agents report every %gs", interval)
        self._budget_told = interval
        return self.pace.interval()

    def count_helpers(self, cpu: Callable[[], Mapping[int, float]]) -> None:
        """Judge the report pace by the busiest of the controller's
        processes, the ones that take the agents' reports in before it
        among them (the relay workers; ``cpu``: their CPU seconds so far, by
        process id)."""
        self._lag_probe.helpers = cpu

    def _paced(self, interval: float) -> None:
        """The measured lag calls for a new report interval: tell every agent."""
        asked = self.agents.pace(interval)
        pace = self.pace
        if pace.late > pace.rules.slow_above:
            log.warning(
                "health reports: the controller is behind (event loop %.0f ms late, reports "
                "%.0f ms, medians over %gs, at %.2f cores); %d agents asked to report every "
                "%.1fs",
                pace.lag * 1000,
                pace.report_delay * 1000,
                pace.rules.window,
                pace.busy,
                asked,
                interval,
            )
        else:
            log.info(
                "health reports: the controller keeps up (event loop %.0f ms late, reports "
                "%.0f ms, at %.2f cores); %d agents asked to report every %.1fs",
                pace.lag * 1000,
                pace.report_delay * 1000,
                pace.busy,
                asked,
                interval,
            )

    def _schedule_soon(self) -> None:
        """One scheduling pass soon, however many registrations ask for it
        meanwhile (a reconnect storm asks thousands of times)."""
        if self._schedule_queued:
            return
        self._schedule_queued = True

        async def run() -> None:
            self._schedule_queued = False  # a change from now on asks again
            await self.allocations.schedule_pass()

        self._spawn(run())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    def agent_disconnected(self, session: AgentSession) -> None:
        """Forget the agent's stream now; record its ``node.agent`` event in the
        background (the stream's own task may be cancelled as it ends), unless
        the controller itself is stopping (then every stream ends at once, and
        25,000 events would hold the shutdown up for a minute)."""
        if not self.agents.detach(session):
            return
        self.report_delays.forget(session.node)
        if not self.stopping:
            log.info("node %s: agent disconnected", session.node)
            self._spawn(self.nodes.agent_gone(session.node))

    async def agent_health(
        self, node: str, health: HealthReport, packed: PackedReport | None = None
    ) -> None:
        """An agent's report (``packed``: the same report packed, when the
        caller has it: a relay worker packed it)."""
        self.report_delays.note(node, health.sampled_at, time.time())
        was_unhealthy = self.nodes.judged_unhealthy(node)
        rack = await self.nodes.agent_health(node, health, packed)
        self.meter.health_report()
        if rack is not None:
            if was_unhealthy and not self.nodes.unhealthy_now(node):
                self._schedule_soon()  # it passes the baseline again: it may take work
            await self.policies.observe(node, rack, health)

    def agent_result(self, session: AgentSession, command_id: str, outcome: CommandOutcome) -> None:
        """An agent's answer to a command it was sent."""
        self.agents.resolve(session, command_id, outcome)

    async def inject_fault(self, node: str, fault_json: str) -> CommandOutcome:
        """Forward a fault to a simulated node's fake NVML (simulated fleets only)."""
        if nests_deeper_than(fault_json, MAX_FAULT_DEPTH):
            raise InvalidArgument(f"fault JSON is nested deeper than {MAX_FAULT_DEPTH} levels")
        try:
            fault = json.loads(fault_json, parse_constant=_not_a_number, parse_float=_finite)
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"fault is not valid JSON: {e.msg}") from e
        except RecursionError as e:
            raise InvalidArgument("fault JSON is nested too deeply") from e
        if not isinstance(fault, dict) or "kind" not in fault:
            raise InvalidArgument('a fault is a JSON object with a "kind"')
        await self.nodes.get(node)
        return await self.agents.call(node, AgentCommand("inject_fault", fault_json), 30.0)
