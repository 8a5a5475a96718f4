"""Node inventory: enrolment, queries, drain, power and agent reports."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlmodel import Session, col, select

from controller.core import convert
from controller.core.agents import AgentHub
from controller.core.errors import AlreadyExists, BmcError, InvalidArgument, KilnError
from controller.core.eventlog import record
from controller.core.model import (
    BmcTarget,
    EnrollSpec,
    GpuInfo,
    NodeInfo,
    PowerResult,
    RackInfo,
    short_gpu_model,
)
from controller.core.ports import BmcGateway
from controller.core.states import FOR_ALLOCATION, OUT_OF_SERVICE, NodeState
from controller.core.transitions import load_node, move
from controller.store.database import Database
from controller.store.models import GpuRow, NodeRow
from controller.store.secrets import SecretBox

log = logging.getLogger(__name__)

POWER_ACTIONS = ("status", "on", "off", "force_off", "cycle", "restart")
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def validate_name(kind: str, name: str) -> None:
    if not name or len(name) > 63 or not set(name) <= NAME_CHARS or name[0] in "-.":
        raise InvalidArgument(
            f"{kind} name {name!r} is invalid: use 1-63 letters, digits, '-', '_' or '.'"
        )


class Nodes:
    def __init__(self, db: Database, bmc: BmcGateway, agents: AgentHub, secrets: SecretBox) -> None:
        self._db = db
        self._bmc = bmc
        self._agents = agents
        self._secrets = secrets

    def target(self, row: NodeRow) -> BmcTarget:
        """How to reach the node's BMC, with its password unsealed."""
        return BmcTarget(
            node=row.name,
            url=row.bmc_url,
            username=row.bmc_username,
            password=self._secrets.open(row.bmc_password),
            insecure=row.bmc_insecure,
            ca_bundle=row.bmc_ca_bundle,
        )

    # -- queries -------------------------------------------------------------

    def usable(self, row: NodeRow) -> bool:
        """Healthy and in service: may hold a job (bookings aside)."""
        return (
            row.state in (NodeState.READY, NodeState.ALLOCATED)
            and not row.drained
            and self._agents.is_connected(row.name)
        )

    def schedulable(self, row: NodeRow) -> bool:
        """Usable and free: a new allocation may take it now."""
        return self.usable(row) and row.state == NodeState.READY and not row.allocation_id

    def _info(self, row: NodeRow, gpus: list[GpuRow]) -> NodeInfo:
        return convert.node_info(
            row,
            gpus,
            agent_connected=self._agents.is_connected(row.name),
            schedulable=self.schedulable(row),
        )

    async def get(self, name: str) -> NodeInfo:
        def query(session: Session) -> NodeInfo:
            row = load_node(session, name)
            gpus = list(session.exec(select(GpuRow).where(GpuRow.node == name)))
            return self._info(row, gpus)

        return await self._db.read(query)

    async def query(self, *, rack: str = "", state: str = "") -> list[NodeInfo]:
        def query(session: Session) -> list[NodeInfo]:
            stmt = select(NodeRow)
            if rack:
                stmt = stmt.where(NodeRow.rack == rack)
            if state:
                stmt = stmt.where(NodeRow.state == state)
            rows = list(session.exec(stmt.order_by(col(NodeRow.name))))
            gpus: dict[str, list[GpuRow]] = defaultdict(list)
            for g in session.exec(select(GpuRow)):
                gpus[g.node].append(g)
            return [self._info(r, gpus[r.name]) for r in rows]

        if state and state not in {s.value for s in NodeState}:
            raise InvalidArgument(f"unknown node state {state!r}")
        return await self._db.read(query)

    async def rows(self) -> list[NodeRow]:
        return await self._db.read(lambda s: list(s.exec(select(NodeRow))))

    async def racks(self) -> list[RackInfo]:
        nodes = await self.query()
        by_rack: dict[str, list[NodeInfo]] = defaultdict(list)
        for n in nodes:
            by_rack[n.rack or n.name].append(n)
        racks = []
        for name, members in sorted(by_rack.items()):
            domains = {n.nvlink_domain for n in members if n.nvlink_domain}
            models = {n.gpu_model for n in members if n.gpu_model}
            racks.append(
                RackInfo(
                    name=name,
                    nvlink_domain=",".join(sorted(domains)),
                    gpu_model=",".join(sorted(models)),
                    nodes=len(members),
                    gpus=sum(n.gpu_count for n in members),
                    ready=sum(1 for n in members if n.state == NodeState.READY),
                    allocated=sum(1 for n in members if n.allocation),
                    leaf=members[0].leaf,
                    spine=members[0].spine,
                )
            )
        return racks

    # -- enrolment and operator actions ---------------------------------------

    async def enroll(self, spec: EnrollSpec) -> NodeInfo:
        """Register a node and its BMC. Nothing is stored when validation fails.

        Raises:
            InvalidArgument: bad name, BMC URL or missing credentials.
            AlreadyExists: a node of that name exists with another BMC.
        """
        validate_name("node", spec.name)
        if spec.rack:
            validate_name("rack", spec.rack)
        url = self._bmc.canonical_url(spec.bmc_url)
        if not spec.username:
            raise InvalidArgument("a BMC username is required")
        if url.startswith("ipmi://") and len(spec.password.encode()) > 20:
            raise InvalidArgument("IPMI 2.0 passwords are at most 20 bytes; this one is longer")

        def write(session: Session) -> None:
            existing = session.get(NodeRow, spec.name)
            if existing is not None:
                if existing.bmc_url != url or existing.rack != spec.rack:
                    raise AlreadyExists(kind="node", name=spec.name)
                if existing.profile != spec.profile:  # a new baseline profile
                    existing.profile = spec.profile
                    session.add(existing)
                    if existing.state == NodeState.READY:
                        move(
                            session,
                            existing,
                            NodeState.PREPARING,
                            f"baseline profile now {spec.profile or 'defaults'}",
                        )
                return  # otherwise the same enrolment again: idempotent
            now = time.time()
            session.add(
                NodeRow(
                    name=spec.name,
                    rack=spec.rack,
                    leaf=spec.leaf or spec.rack,
                    spine=spec.spine,
                    bmc_url=url,
                    bmc_username=spec.username,
                    bmc_password=self._secrets.seal(spec.password),
                    bmc_insecure=spec.insecure,
                    bmc_ca_bundle=spec.ca_bundle,
                    profile=spec.profile,
                    created_at=now,
                    updated_at=now,
                )
            )
            record(session, "node.enrolled", node=spec.name, reason="enrolled", bmc_url=url)

        await self._db.tx(write)
        log.info("node %s: enrolled with BMC %s", spec.name, url)
        return await self.get(spec.name)

    async def drain(self, name: str, reason: str) -> NodeInfo:
        def write(session: Session) -> None:
            row = load_node(session, name)
            if row.state in (NodeState.MAINTENANCE, NodeState.DRAINING):
                return
            row.drained = True
            move(session, row, NodeState.DRAINING, reason or "drained by operator")

        await self._db.tx(write)
        return await self.get(name)

    async def undrain(self, name: str) -> NodeInfo:
        def write(session: Session) -> None:
            row = load_node(session, name)
            row.drained = False
            session.add(row)
            if row.state == NodeState.DRAINING and row.allocation_id:
                # Drained before it was prepared for its allocation: resume the
                # preparation, or the allocation would never be handed over.
                preparing = row.operation.startswith(FOR_ALLOCATION)
                back = NodeState.PREPARING if preparing else NodeState.ALLOCATED
                row.state = back.value
                row.state_reason = "undrained"
                record(
                    session,
                    "node.transition",
                    node=name,
                    reason="undrained",
                    from_state="draining",
                    to_state=back.value,
                )
            elif row.state in (NodeState.DRAINING, *OUT_OF_SERVICE):
                if row.state == NodeState.DRAINING:
                    move(session, row, NodeState.MAINTENANCE, "undrained before drain finished")
                # Back into service through inspection: power on (whoever
                # powered it off), re-check the BMC and the GPUs, prepare again.
                row.operation = ""
                row.expected_power = ""
                move(session, row, NodeState.INSPECTING, "undrained: re-inspecting")

        await self._db.tx(write)
        return await self.get(name)

    async def power(self, name: str, action: str) -> PowerResult:
        """Run one power action through the node's BMC and record it.

        Raises:
            InvalidArgument: unknown action. NotFound: unknown node.
            BmcError (and kin): the BMC failed; the node's BMC health says so.
        """
        if action not in POWER_ACTIONS:
            raise InvalidArgument(f"unknown power action {action!r}; use one of {POWER_ACTIONS}")
        row = await self._db.read(lambda s: load_node(s, name))
        target = self.target(row)
        try:
            if action == "status":
                state = await self._bmc.power_state(target)
            else:
                await self._note_expected_power(name, action)
                state = await self._bmc.set_power(target, action)
        except BmcError:
            await self._save_power(name, None, action)
            raise
        await self._save_power(name, state, action)
        return PowerResult(node=name, ok=True, power=state, bmc_health=self._bmc.health(name))

    async def _note_expected_power(self, name: str, action: str) -> None:
        expected = "off" if action in ("off", "force_off") else "on"

        def write(session: Session) -> None:
            row = load_node(session, name)
            row.expected_power = expected
            session.add(row)

        await self._db.tx(write)

    async def _save_power(self, name: str, state: str | None, action: str) -> None:
        health = self._bmc.health(name)

        def write(session: Session) -> None:
            row = load_node(session, name)
            changed = state is not None and state != row.power
            if state is not None:
                row.power = state
            row.bmc_health = health
            session.add(row)
            if action != "status" or changed:
                record(
                    session,
                    "node.power",
                    node=name,
                    allocation=row.allocation_id,
                    reason=f"power {action}" if state else f"power {action} failed",
                    action=action,
                    power=row.power,
                    bmc_health=health,
                )

        await self._db.tx(write)

    async def power_many(
        self,
        *,
        names: Sequence[str] = (),
        rack: str = "",
        all_nodes: bool = False,
        action: str,
        concurrency: int = 64,
    ) -> AsyncIterator[tuple[PowerResult, int, int]]:
        """Run ``action`` on many nodes at once, at most ``concurrency`` in flight.

        Yields (result, done, total) as each node finishes; a failing BMC is a
        failed result, never an exception, and does not hold up the others.
        """
        if action not in POWER_ACTIONS:
            raise InvalidArgument(f"unknown power action {action!r}; use one of {POWER_ACTIONS}")
        if all_nodes:
            targets = [n.name for n in await self.query()]
        elif rack:
            targets = [n.name for n in await self.query(rack=rack)]
            if not targets:
                raise InvalidArgument(f"rack {rack!r} has no nodes")
        else:
            targets = list(dict.fromkeys(names))
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
                        power="unknown",
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
    ) -> NodeInfo:
        """Record the node's GPU inventory as its agent reported it.

        Raises:
            NotFound: the agent names a node that was never enrolled.
        """

        def write(session: Session) -> None:
            row = load_node(session, name)
            for old in session.exec(select(GpuRow).where(GpuRow.node == name)):
                session.delete(old)
            session.flush()
            for g in gpus:  # GpuInfo and GpuRow share their field names
                session.add(GpuRow(node=name, **dataclasses.asdict(g)))
            cliques = {g.clique for g in gpus}
            row.gpu_model = short_gpu_model(gpus[0].model) if gpus else ""
            row.gpu_count = len(gpus)
            row.nvlink_domain = cliques.pop() if len(cliques) == 1 else ""
            row.agent_last_seen = time.time()
            if row.state == NodeState.READY and applied_profile != row.applied_profile:
                move(
                    session,
                    row,
                    NodeState.PREPARING,
                    "agent restarted with other GPU settings; preparing again",
                )
            session.add(row)
            record(
                session,
                "node.agent",
                node=name,
                reason="agent connected",
                gpus=len(gpus),
                gpu_model=row.gpu_model,
                nvlink_domain=row.nvlink_domain,
            )

        await self._db.tx(write)
        return await self.get(name)

    async def agent_health(self, name: str, health: dict[str, Any]) -> str | None:
        """Store the node's latest health report; returns its rack (None: unknown node)."""

        def write(session: Session) -> str | None:
            row = session.get(NodeRow, name)
            if row is None:
                return None
            row.health_json = json.dumps(health)
            row.agent_last_seen = time.time()
            session.add(row)
            if health.get("drift"):
                record(
                    session,
                    "node.gpu_drift",
                    node=name,
                    allocation=row.allocation_id,
                    reason="GPU settings drifted from the profile; the agent re-applied it",
                    drift=list(health["drift"]),
                    profile=row.applied_profile,
                )
            return row.rack

        return await self._db.read(write)

    async def agent_gone(self, name: str) -> None:
        def write(session: Session) -> None:
            row = session.get(NodeRow, name)
            if row is not None:
                record(
                    session,
                    "node.agent",
                    node=name,
                    allocation=row.allocation_id,
                    reason="agent disconnected",
                )

        await self._db.tx(write)
