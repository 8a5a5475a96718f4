"""Node inventory: enrolment, queries, drain, power and agent reports."""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from controller.core.agents import AgentHub
from controller.core.errors import (
    AlreadyExists,
    BmcError,
    FailedPrecondition,
    InvalidArgument,
    KilnError,
    NotFound,
)
from controller.core.eventlog import record
from controller.core.health import HealthReport, PackedReport
from controller.core.kinds import EventKind
from controller.core.live import LiveHealth
from controller.core.model import (
    BmcTarget,
    EnrollSpec,
    GpuInfo,
    NodeInfo,
    PowerResult,
    PowerScope,
    ProvisionPhase,
    RackInfo,
    short_gpu_model,
)
from controller.core.node_view import NodeView
from controller.core.ports import BmcGateway, Store, Tx
from controller.core.preparation import gate_problems
from controller.core.profiles import HealthGate
from controller.core.records import NodeRecord
from controller.core.states import MEMBERS, OUT_OF_SERVICE, NodeKind, NodeState, PowerState
from controller.core.transitions import load_node, move

log = logging.getLogger(__name__)

POWER_ACTIONS = ("status", "on", "off", "force_off", "cycle", "restart")
POWER_ON_ACTIONS = frozenset({"on", "cycle", "restart"})  # refused while a node's power is blocked
BMC_UNREACHABLE = "unreachable"  # ``BmcGateway.health``: the breaker is open
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
NAME_MAX = 63
SHOWN_MAX = 64  # characters of a refused value quoted back in a message
MAX_GPUS_PER_NODE = 64
MAX_GPU_MEMORY_MIB = 2**31 - 1  # 2 PiB: beyond any GPU; a signed 32-bit count
MAX_PCI_DEVICE_ID = 2**31 - 1  # NVIDIA's device ids (the high 16 bits) are below 0x8000


def shown(value: str) -> str:
    """``value`` quoted for a message, cut to its first SHOWN_MAX characters."""
    if len(value) <= SHOWN_MAX:
        return repr(value)
    return f"{value[:SHOWN_MAX]!r}… ({len(value)} characters)"


def validate_name(kind: str, name: str) -> None:
    """Node, rack, leaf, spine, queue and GPU model names: 1-63 letters,
    digits, '-', '_' or '.', not starting with '-' or '.'.

    Raises InvalidArgument quoting at most the first 64 characters of ``name``.
    """
    if not name or len(name) > NAME_MAX or not set(name) <= NAME_CHARS or name[0] in "-.":
        raise InvalidArgument(
            f"{kind} name {shown(name)} is invalid: "
            f"use 1-{NAME_MAX} letters, digits, '-', '_' or '.'"
        )


def validate_gpus(gpus: Sequence[GpuInfo]) -> None:
    """Check the GPU inventory an agent registers, before anything is stored.

    Raises InvalidArgument: more than MAX_GPUS_PER_NODE GPUs, an index out of
    range or twice, a number out of range, a model whose short name is not a
    valid name, or an NVLink clique that is not one.
    """
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise InvalidArgument(f"a node has at most {MAX_GPUS_PER_NODE} GPUs, not {len(gpus)}")
    seen: set[int] = set()
    for g in gpus:
        if not 0 <= g.index < MAX_GPUS_PER_NODE:
            raise InvalidArgument(f"GPU index {g.index} is out of range 0-{MAX_GPUS_PER_NODE - 1}")
        if g.index in seen:
            raise InvalidArgument(f"GPU index {g.index} is registered twice")
        seen.add(g.index)
        if not 0 <= g.memory_mib <= MAX_GPU_MEMORY_MIB:
            raise InvalidArgument(
                f"GPU {g.index}: memory_mib {g.memory_mib} is out of range 0-{MAX_GPU_MEMORY_MIB}"
            )
        if not 0 <= g.pci_device_id <= MAX_PCI_DEVICE_ID:
            raise InvalidArgument(
                f"GPU {g.index}: pci_device_id {g.pci_device_id} is out of range "
                f"0-{MAX_PCI_DEVICE_ID}"
            )
        if not g.model.isprintable():
            raise InvalidArgument(f"GPU {g.index}: model {shown(g.model)} has control characters")
        validate_name(f"GPU {g.index} model", short_gpu_model(g.model))
        if g.clique:
            validate_name(f"GPU {g.index} NVLink clique", g.clique)


def closest_hint(name: str, names: Sequence[str]) -> str:
    """``"; did you mean 'X'?"`` for the enrolled name closest to a mistyped one."""
    close = difflib.get_close_matches(name[:NAME_MAX], names, n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


def power_blocked(name: str, block: str, action: str) -> FailedPrecondition:
    """The refusal of a power-on (``action``: on, cycle, restart) of a node
    whose power is blocked, naming why and how to lift it."""
    return FailedPrecondition(
        f"node {name!r} may not be powered on (power {action} refused): {block}; once the "
        f"tray is repaired, clear it with `kiln nodes clear-leak {name}`"
    )


def _with_hold(reason: str, hold: str) -> str:
    return f"{reason} (takes no new work: {hold})" if hold else reason


def held_back(node: NodeRecord) -> str:
    """Why a node in service takes no new allocation ("" when nothing holds it back).

    Its BMC is unreachable (Kiln could neither power-cycle it nor power it off
    if it overheated), or the BMC says it is off (an agent that has not yet
    noticed would otherwise keep it looking ready).
    """
    if node.rack_hold:
        return node.rack_hold
    if node.bmc_health == BMC_UNREACHABLE:
        return "its BMC is unreachable"
    if node.power == PowerState.OFF:
        return "its BMC reports it powered off"
    return ""


# A node in service must keep passing this between preparations (its latest
# report), or it takes no new work: a GPU off the bus, uncorrectable ECC
# errors, a failed or pending row remap, NVLink links down.
BASELINE_GATE = HealthGate()


class Nodes:
    def __init__(
        self,
        store: Store,
        bmc: BmcGateway,
        agents: AgentHub,
        live: LiveHealth | None = None,
        *,
        baseline_gate: HealthGate | None = BASELINE_GATE,
    ) -> None:
        self._store = store
        self.baseline_gate = baseline_gate
        # The gate's verdict per node, kept with the version of the report it
        # judged (a report is immutable: judged once, however often it is read).
        self._verdicts: dict[str, tuple[int, str]] = {}
        self._bmc = bmc
        self._agents = agents
        self.live = live or LiveHealth(store)
        self._rack_of: dict[str, str] = {}  # nodes whose agents registered since start
        # Reads come from memory once loaded (``controller/core/node_view.py``).
        self.view = NodeView()
        store.on_nodes_committed(self.view.committed)
        self._loading = asyncio.Lock()

    async def loaded(self) -> NodeView:
        """The in-memory view of the fleet, read from the store on first use
        (``Fleet.start`` does it; concurrent first callers share one read).
        Stored health seeds ``live``."""
        if self.view.ready:
            return self.view
        async with self._loading:
            if not self.view.ready:
                await self._load()
        return self.view

    async def _load(self) -> None:
        self.view.begin_load()
        t0 = time.monotonic()

        def query(tx: Tx) -> tuple[list[NodeRecord], dict[str, list[GpuInfo]]]:
            return tx.nodes.find(), tx.nodes.gpus_by_node()

        records, gpus = await self._store.read(query)
        for r in records:
            if r.health is not None or r.agent_last_seen:
                self.live.seed(r.name, r.health, r.agent_last_seen)
            r.health = None
        self.view.install(records, gpus)
        log.info("%d nodes read into memory in %.2fs", len(records), time.monotonic() - t0)

    def latest_health(self, node: NodeRecord) -> HealthReport | None:
        """The node's latest report: in memory if one came since start, else stored."""
        return self.live.health(node.name) or node.health

    def last_seen(self, node: NodeRecord) -> float:
        """When the node's agent was last heard from (in memory, else stored)."""
        return max(node.agent_last_seen, self.live.last_seen(node.name))

    # -- queries -------------------------------------------------------------

    def usable(self, node: NodeRecord) -> bool:
        """Healthy and in service: may hold a job (bookings aside)."""
        return (
            node.state in (NodeState.READY, NodeState.ALLOCATED)
            and node.kind == NodeKind.COMPUTE
            and not node.drained
            and self._agents.is_connected(node.name)
        )

    def placeable(self, node: NodeRecord) -> bool:
        """Usable, and fit to be given new work (bookings aside): what the
        placement engine sees as schedulable. A job that already holds the
        node keeps it either way (see ``docs/placement.md``)."""
        return self.usable(node) and not held_back(node) and not self.unhealthy(node)

    def unhealthy(self, node: NodeRecord) -> str:
        """Why the node's latest report fails the fleet's baseline gate ("" when
        it passes, or when there is no gate or no report with GPUs yet)."""
        version = self.live.version(node.name)
        kept = self._kept_verdict(node.name, version)
        if kept is not None:
            return kept
        health = self.latest_health(node)
        return "" if health is None else self.judge(node.name, health, version)

    def judge(self, name: str, health: HealthReport, version: int = 0) -> str:
        """``unhealthy`` of ``name`` were ``health`` its latest report: judged
        once per report and kept by the report's ``LiveHealth.version``
        (a listener judges a report as it lands, so that only a changed
        verdict reschedules; version 0, a report not held there: judged
        again each time)."""
        kept = self._kept_verdict(name, version)
        if kept is not None:
            return kept
        gate = self.baseline_gate
        verdict = "" if gate is None or not health.gpus else "; ".join(gate_problems(gate, health))
        self._verdicts[name] = (version, verdict)
        return verdict

    def _kept_verdict(self, name: str, version: int) -> str | None:
        """The verdict kept for report ``version`` of ``name`` (None: not
        judged yet, or version 0, which is judged each time)."""
        kept = self._verdicts.get(name)
        return kept[1] if version and kept is not None and kept[0] == version else None

    def verdict(self, name: str) -> str | None:
        """The baseline gate's last verdict on ``name`` (None: none judged yet)."""
        kept = self._verdicts.get(name)
        return None if kept is None else kept[1]

    def judged_unhealthy(self, name: str) -> bool:
        """Whether the node's last judged report failed the baseline (no new judging)."""
        return bool(self.verdict(name))

    def unhealthy_now(self, name: str) -> str:
        """``unhealthy`` for a node by name ("" for an unknown one)."""
        node = self.view.get(name) if self.view.ready else None
        return self.unhealthy(node) if node is not None else ""

    def why_not_schedulable(self, node: NodeRecord) -> str:
        """For a ready node that takes no new work: why ("" otherwise)."""
        if node.state != NodeState.READY or node.drained:
            return ""
        return held_back(node) or self.unhealthy(node)

    def schedulable(self, node: NodeRecord) -> bool:
        """Placeable and free: a new allocation may take it now."""
        return self.placeable(node) and node.state == NodeState.READY and not node.allocation_id

    def _info(self, node: NodeRecord, gpus: Sequence[GpuInfo]) -> NodeInfo:
        return NodeInfo(
            name=node.name,
            rack=node.rack,
            leaf=node.leaf,
            spine=node.spine,
            bmc_url=node.bmc_url,
            bmc_username=node.bmc_username,
            state=node.state,
            state_reason=_with_hold(node.state_reason, self.why_not_schedulable(node)),
            power=node.power,
            bmc_health=node.bmc_health,
            agent_connected=self._agents.is_connected(node.name),
            agent_last_seen=self.last_seen(node),
            gpu_model=node.gpu_model,
            gpu_count=node.gpu_count,
            gpus=tuple(gpus),
            nvlink_domain=node.nvlink_domain,
            allocation=node.allocation_id,
            health=self.latest_health(node),
            health_version=self.live.version(node.name),
            profile=node.profile,
            updated_at=node.updated_at,
            schedulable=self.schedulable(node),
            drained=node.drained,
            agent_cert_expires_at=self._agents.cert_expires_at(node.name) or 0.0,
            power_block=node.power_block,
            kind=node.kind,
            rack_hold=node.rack_hold,
        )

    async def get(self, name: str) -> NodeInfo:
        """Raises NotFound for a node never enrolled (naming the closest one)."""
        view = await self.loaded()
        node = view.get(name)
        if node is None:
            raise NotFound(kind="node", name=name, hint=closest_hint(name, view.names()))
        return self._info(node, view.gpus(name))

    async def record(self, name: str) -> NodeRecord:
        """The node's record as last committed (a copy: the caller may change
        it). Raises NotFound."""
        node = (await self.loaded()).get(name)
        if node is None:
            raise NotFound(kind="node", name=name)
        return dataclasses.replace(node)

    async def query(self, *, rack: str = "", state: str = "") -> list[NodeInfo]:
        if state and state not in {s.value for s in NodeState}:
            raise InvalidArgument(f"unknown node state {state!r}")
        view = await self.loaded()
        found = view.in_states([NodeState(state)]) if state else view.all()
        return [self._info(n, view.gpus(n.name)) for n in found if not rack or n.rack == rack]

    async def page(
        self,
        after: str,
        limit: int,
        *,
        rack: str = "",
        state: NodeState | None = None,
        gpu_model: str = "",
        allocation: str = "",
    ) -> list[NodeInfo]:
        """At most ``limit`` nodes named after ``after``, by name, of the
        filters given (the pages and their tokens: ``controller.core.paging``)."""
        view = await self.loaded()
        found: list[NodeInfo] = []
        for n in view.after(after):
            if len(found) >= limit:
                break
            if (
                (not rack or n.rack == rack)
                and (state is None or n.state == state)
                and (not gpu_model or n.gpu_model == gpu_model)
                and (not allocation or n.allocation_id == allocation)
            ):
                found.append(self._info(n, view.gpus(n.name)))
        return found

    async def records_in(self, states: Sequence[NodeState]) -> list[NodeRecord]:
        """The nodes in any of ``states`` (by the view's state index), by name,
        without health (``latest_health`` has it). Shared with the view: the
        caller must not change them."""
        return (await self.loaded()).in_states(states)

    async def records(self) -> list[NodeRecord]:
        """Every node, by name, without health (``latest_health`` has it).
        Shared with the view: the caller must not change them."""
        return (await self.loaded()).all()

    async def targets(self, nodes: Sequence[NodeRecord]) -> list[BmcTarget]:
        """How to reach each node's BMC (passwords unsealed by the store)."""
        return await self._store.read(lambda tx: tx.nodes.bmc_targets(nodes))

    async def target(self, node: NodeRecord) -> BmcTarget:
        return (await self.targets([node]))[0]

    async def racks(self) -> list[RackInfo]:
        nodes = await self.query()
        by_rack: dict[str, list[NodeInfo]] = defaultdict(list)
        for n in nodes:
            by_rack[n.rack or n.name].append(n)
        racks = []
        for name, everyone in sorted(by_rack.items()):
            members = [n for n in everyone if n.kind == NodeKind.COMPUTE]
            holds = sorted({n.rack_hold for n in members if n.rack_hold})
            if not members:  # only switch trays or power shelves so far
                members = everyone
            domains = {n.nvlink_domain for n in members if n.nvlink_domain}
            models = {n.gpu_model for n in members if n.gpu_model}
            racks.append(
                RackInfo(
                    name=name,
                    nvlink_domain=",".join(sorted(domains)),
                    gpu_model=",".join(sorted(models)),
                    nodes=sum(1 for n in members if n.kind == NodeKind.COMPUTE),
                    gpus=sum(n.gpu_count for n in members),
                    # Ready: free for a new allocation now, as ``schedulable``
                    # says of each node (a ready node whose BMC is unreachable
                    # or reports it off is not).
                    ready=sum(1 for n in members if n.schedulable),
                    allocated=sum(1 for n in members if n.allocation),
                    leaf=members[0].leaf,
                    spine=members[0].spine,
                    members=sum(1 for n in everyone if n.kind in MEMBERS),
                    hold=holds[0] if holds else "",
                )
            )
        return racks

    # -- enrolment and operator actions ---------------------------------------

    def validate(self, spec: EnrollSpec) -> str:
        """Check an enrolment without storing anything; returns the canonical BMC URL.

        Raises:
            InvalidArgument: bad name, BMC URL or credentials.
        """
        validate_name("node", spec.name)
        for kind, label in (("rack", spec.rack), ("leaf", spec.leaf), ("spine", spec.spine)):
            if label:
                validate_name(kind, label)
        if not spec.username:
            raise InvalidArgument("a BMC username is required")
        if spec.kind in MEMBERS and spec.profile:
            raise InvalidArgument(
                f"node {spec.name!r} is a {spec.kind.value.replace('_', ' ')}: "
                "it has no GPUs to prepare, so it takes no profile"
            )
        if spec.kind in MEMBERS and not spec.rack:
            raise InvalidArgument(
                f"node {spec.name!r} is a {spec.kind.value.replace('_', ' ')}: name its rack"
            )
        return self._bmc.validate_target(spec.bmc_url, spec.username, spec.password)

    async def enroll(self, spec: EnrollSpec) -> NodeInfo:
        """Register a node and its BMC. Nothing is stored when validation fails.

        Raises:
            InvalidArgument: bad name, BMC URL or missing credentials.
            AlreadyExists: a node of that name exists with another BMC, or
                another node already has this BMC (the message names it).
        """
        url = self.validate(spec)

        def write(tx: Tx) -> None:
            existing = tx.nodes.get(spec.name)
            if existing is not None:
                if (
                    existing.bmc_url != url
                    or existing.rack != spec.rack
                    or existing.kind != spec.kind
                ):
                    raise AlreadyExists(kind="node", name=spec.name)
                if existing.profile != spec.profile:  # a new baseline profile
                    existing.profile = spec.profile
                    tx.nodes.save(existing)
                    if existing.state == NodeState.READY:
                        move(
                            tx,
                            existing,
                            NodeState.PREPARING,
                            f"baseline profile now {spec.profile or 'defaults'}",
                        )
                return  # otherwise the same enrolment again: idempotent
            # One node per BMC: two nodes on one BMC fight over its power.
            holder = next(iter(tx.nodes.find_by_bmc_url(url)), None)
            if holder is not None:
                raise AlreadyExists(
                    f"BMC {url} is already enrolled as node {holder.name!r}; "
                    f"node {spec.name!r} needs its own BMC"
                )
            now = time.time()
            node = NodeRecord(
                name=spec.name,
                rack=spec.rack,
                leaf=spec.leaf or spec.rack,
                spine=spec.spine,
                bmc_url=url,
                bmc_username=spec.username,
                bmc_insecure=spec.insecure,
                bmc_ca_bundle=spec.ca_bundle,
                profile=spec.profile,
                kind=spec.kind,
                created_at=now,
                updated_at=now,
            )
            tx.nodes.add(node, spec.password)
            record(
                tx,
                EventKind.NODE_ENROLLED,
                node=spec.name,
                reason="enrolled",
                bmc_url=url,
                node_kind=spec.kind.value,
            )

        await self._store.tx(write)
        log.info("node %s: enrolled with BMC %s", spec.name, url)
        return await self.get(spec.name)

    async def set_credentials(self, name: str, username: str, password: str) -> NodeInfo:
        """Replace a node's BMC credentials, checked against its protocol's
        rules first (IPMI's 20-byte passwords); the next BMC call uses them.

        Raises:
            InvalidArgument: no username, or credentials the protocol cannot carry.
            NotFound: unknown node.
        """
        if not username:
            raise InvalidArgument("a BMC username is required")
        if not password:
            raise InvalidArgument("a BMC password is required")

        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            self._bmc.validate_target(node.bmc_url, username, password)
            tx.nodes.set_credentials(node, username, password)
            record(
                tx,
                EventKind.NODE_CREDENTIALS,
                node=name,
                reason=f"BMC credentials replaced (user {username})",
            )

        await self._store.tx(write)
        self._bmc.forget(name)
        log.info("node %s: BMC credentials replaced (user %s)", name, username)
        return await self.get(name)

    async def remove(self, name: str, reason: str) -> None:
        """Forget the node in one transaction with its ``node.removed`` event
        (which records where it was and its BMC, never a password)."""

        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            tx.nodes.remove(name)
            record(
                tx,
                EventKind.NODE_REMOVED,
                node=name,
                reason=reason,
                rack=node.rack,
                state=node.state.value,
                bmc_url=node.bmc_url,
            )

        await self._store.tx(write)
        self._rack_of.pop(name, None)
        self._verdicts.pop(name, None)
        self._bmc.forget(name)
        log.info("node %s: removed (%s)", name, reason)

    async def drain(self, name: str, reason: str) -> NodeInfo:
        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            if node.state in (NodeState.MAINTENANCE, NodeState.DRAINING):
                return
            node.drained = True
            move(tx, node, NodeState.DRAINING, reason or "drained by operator")

        await self._store.tx(write)
        return await self.get(name)

    async def undrain(self, name: str) -> NodeInfo:
        """Return a drained node to service (through inspection when it is out
        of service).

        Raises:
            NotFound: unknown node.
            FailedPrecondition: its power is blocked (a coolant leak): it could
                not be powered on; the message says to clear the leak first.
        """

        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            if node.power_block:
                raise FailedPrecondition(
                    f"node {name!r} may not return to service while its power is blocked: "
                    f"{node.power_block}; once the tray is repaired, run "
                    f"`kiln nodes clear-leak {name}`, then undrain it"
                )
            node.drained = False
            tx.nodes.save(node)
            if node.state == NodeState.DRAINING and node.allocation_id:
                # Drained before it was prepared for its allocation: resume the
                # preparation, or the allocation would never be handed over.
                preparing = node.allocation_profile is not None
                back = NodeState.PREPARING if preparing else NodeState.ALLOCATED
                node.state = back
                node.state_reason = "undrained"
                node.drain_target = None
                tx.nodes.save(node)
                record(
                    tx,
                    EventKind.NODE_TRANSITION,
                    node=name,
                    reason="undrained",
                    from_state="draining",
                    to_state=back.value,
                )
            elif node.state in (NodeState.DRAINING, *OUT_OF_SERVICE):
                if node.state == NodeState.DRAINING:
                    move(tx, node, NodeState.MAINTENANCE, "undrained before drain finished")
                # Back into service through inspection: power on (whoever
                # powered it off), re-check the BMC and the GPUs, prepare again.
                node.drain_target = None
                node.allocation_profile = None
                node.expected_power = None
                move(tx, node, NodeState.INSPECTING, "undrained: re-inspecting")

        await self._store.tx(write)
        return await self.get(name)

    async def power(self, name: str, action: str) -> PowerResult:
        """Run one power action through the node's BMC and record it.

        Raises:
            InvalidArgument: unknown action. NotFound: unknown node.
            FailedPrecondition: on, cycle or restart of a node whose power is
                blocked (a coolant leak), naming the block and
                ``kiln nodes clear-leak``; nothing is sent to the BMC.
            BmcError (and kin): the BMC failed; the node's BMC health says so.
        """
        if action not in POWER_ACTIONS:
            raise InvalidArgument(f"unknown power action {action!r}; use one of {POWER_ACTIONS}")

        def read(tx: Tx) -> BmcTarget:
            node = load_node(tx, name)
            if action in POWER_ON_ACTIONS and node.power_block:
                raise power_blocked(name, node.power_block, action)
            return tx.nodes.bmc_target(node)

        target = await self._store.read(read)
        try:
            if action == "status":
                state = PowerState(await self._bmc.power_state(target))
            else:
                await self._note_expected_power(name, action)
                state = PowerState(await self._bmc.set_power(target, action))
        except BmcError:
            await self._save_power(name, None, action)
            raise
        await self._save_power(name, state, action)
        return PowerResult(node=name, ok=True, power=state, bmc_health=self._bmc.health(name))

    async def _note_expected_power(self, name: str, action: str) -> None:
        expected = PowerState.OFF if action in ("off", "force_off") else PowerState.ON

        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            node.expected_power = expected
            tx.nodes.save(node)

        await self._store.tx(write)

    async def _save_power(self, name: str, state: PowerState | None, action: str) -> None:
        health = self._bmc.health(name)

        def write(tx: Tx) -> None:
            node = load_node(tx, name)
            changed = state is not None and state != node.power
            if state is not None:
                node.power = state
            node.bmc_health = health
            tx.nodes.save(node)
            if action != "status" or changed:
                record(
                    tx,
                    EventKind.NODE_POWER,
                    node=name,
                    allocation=node.allocation_id,
                    reason=f"power {action}" if state else f"power {action} failed",
                    action=action,
                    power=node.power.value,
                    bmc_health=health,
                )

        await self._store.tx(write)

    async def power_many(
        self, scope: PowerScope, action: str, *, concurrency: int = 64
    ) -> AsyncIterator[tuple[PowerResult, int, int]]:
        """Run ``action`` on many nodes at once, at most ``concurrency`` in flight.

        Yields (result, done, total) as each node finishes; a failing BMC is a
        failed result, never an exception, and does not hold up the others.
        """
        if action not in POWER_ACTIONS:
            raise InvalidArgument(f"unknown power action {action!r}; use one of {POWER_ACTIONS}")
        if scope.all_nodes:
            targets = [n.name for n in await self.query()]
        elif scope.rack:
            targets = [n.name for n in await self.query(rack=scope.rack)]
            if not targets:
                raise InvalidArgument(f"rack {scope.rack!r} has no nodes")
        else:
            targets = list(dict.fromkeys(scope.names))
            for name in targets:
                await self.get(name)  # NotFound before anything runs
        if not targets:
            raise InvalidArgument("name nodes, a rack, or --all")
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(name: str) -> PowerResult:
            async with gate:
                try:
                    return await self.power(name, action)
                except KilnError as e:
                    return PowerResult(
                        node=name,
                        ok=False,
                        power=PowerState.UNKNOWN,
                        error=str(e),
                        bmc_health=self._bmc.health(name),
                    )

        tasks = [asyncio.create_task(one(n)) for n in targets]
        try:
            for done, finished in enumerate(asyncio.as_completed(tasks), start=1):
                yield await finished, done, len(tasks)
        finally:
            for t in tasks:
                t.cancel()

    # -- agent reports ---------------------------------------------------------

    async def agent_registered(
        self, name: str, gpus: Sequence[GpuInfo], applied_profile: str
    ) -> None:
        """Record the node's GPU inventory as its agent reported it.

        Raises:
            NotFound: the agent names a node that was never enrolled.
            InvalidArgument: the inventory is malformed (``validate_gpus``);
                nothing is stored.
        """
        validate_gpus(gpus)

        def write(tx: Tx) -> str:
            node = load_node(tx, name)
            tx.nodes.set_gpus(name, gpus)
            cliques = {g.clique for g in gpus}
            node.gpu_model = short_gpu_model(gpus[0].model) if gpus else ""
            node.gpu_count = len(gpus)
            node.nvlink_domain = cliques.pop() if len(cliques) == 1 else ""
            node.agent_last_seen = time.time()
            # A provisioning node's agent registering after the power cycle:
            # the new OS booted (the lifecycle moves it on to inspection).
            back = agent_back(node, node.agent_last_seen)
            tx.nodes.save(node)
            if node.state == NodeState.READY and applied_profile != node.applied_profile:
                move(
                    tx,
                    node,
                    NodeState.PREPARING,
                    "agent restarted with other GPU settings; preparing again",
                )
            record(
                tx,
                EventKind.NODE_AGENT,
                node=name,
                reason="agent connected after provisioning" if back else "agent connected",
                gpus=len(gpus),
                gpu_model=node.gpu_model,
                nvlink_domain=node.nvlink_domain,
            )
            return node.rack

        self._rack_of[name] = await self._store.tx(write)
        self.live.note(name, None)

    async def agent_health(
        self, name: str, health: HealthReport, packed: PackedReport | None = None
    ) -> str | None:
        """Keep the node's latest health report; returns its rack (None: an
        unknown node).

        In memory, written behind (``controller/core/live.py``); a report that
        carries drift also records its ``node.gpu_drift`` event, in a
        transaction of its own.
        """
        rack = self._rack_of.get(name)
        if rack is None:  # no registration seen since start: ask the store once
            node = (await self.loaded()).get(name)
            if node is None:
                return None
            rack = self._rack_of[name] = node.rack
        self.live.note(name, health, packed=packed)
        if health.drift:
            await self._node_event(
                name,
                EventKind.NODE_GPU_DRIFT,
                "GPU settings drifted from the profile; the agent re-applied it",
                lambda node: {"drift": list(health.drift), "profile": node.applied_profile},
            )
        return rack

    async def agent_gone(self, name: str) -> None:
        await self._node_event(name, EventKind.NODE_AGENT, "agent disconnected")

    async def _node_event(
        self,
        name: str,
        kind: EventKind,
        reason: str,
        data: Callable[[NodeRecord], dict[str, Any]] | None = None,
    ) -> None:
        """Record an event of the node (and the allocation that holds it), if
        the node exists; ``data`` gives the event's fields from the node."""

        def write(tx: Tx) -> None:
            node = tx.nodes.get(name)
            if node is not None:
                fields = data(node) if data is not None else {}
                record(tx, kind, node=name, allocation=node.allocation_id, reason=reason, **fields)

        await self._store.tx(write)


def agent_back(node: NodeRecord, now: float) -> bool:
    """In a registration's transaction: mark that a provisioning node's agent
    registered after the power cycle (``controller.core.provisioning``); True
    when it did (the node was booting its new image)."""
    op = node.provision
    if node.state != NodeState.PROVISIONING or op is None or op.phase != ProvisionPhase.BOOTING:
        return False
    node.provision = dataclasses.replace(op, agent_back_at=now)
    return True
