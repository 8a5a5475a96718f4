"""Provisioning an OS image from the catalogue onto nodes, read as a checklist.

    0. request   — the image is looked up in the catalogue (an unknown name,
                   an unpinned sha256 or a BMC protocol that cannot boot a URL
                   is refused), its URL resolved against the image server and
                   its bytes verified against the pinned sha256 (through the
                   ``ImageVerifier`` port); only then is any node touched:
                   each moves to ``provisioning`` (phase ``queued``) with the
                   operation stored on its record;
    1. slot      — a queued node waits for a fleet-wide and a per-rack slot
                   (``ProvisionLimits``), counted from the nodes' persisted
                   phases, so a restart keeps the caps;
    2. media     — insert the image as virtual CD (the same one already
                   inserted is left), set a one-time boot from CD, power-cycle
                   (power on when it was off); then phase ``booting``;
    3. agent     — wait for the node's agent to register *after* the cycle
                   (``agent_back_at``, set by the registration itself); then
                   eject the media (best effort) and move to ``inspecting``,
                   from where the lifecycle inspects the node as usual;
    4. timeout   — no agent within ``agent_timeout_s`` of the cycle (or BMC
                   steps that kept failing that long): quarantined, reason
                   "provisioning IMAGE: no agent after 900 s".

Every step is idempotent and each phase is persisted before its work starts,
so the lifecycle resumes a node found ``provisioning`` after a restart: a node
in ``media`` repeats step 2 (the media check makes the insert a no-op), a
node ``booting`` goes on waiting from its stored ``cycled_at``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from controller.core.agents import AgentHub
from controller.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    KilnError,
    NotFound,
    NotSupported,
)
from controller.core.model import ProvisionOp, ProvisionPhase, ProvisionProgress, ProvisionScope
from controller.core.nodes import Nodes
from controller.core.ports import BmcGateway, ImageVerifier, Store, Tx
from controller.core.records import NodeRecord
from controller.core.states import MEMBERS, PROVISIONABLE, NodeState
from controller.core.transitions import load_node, move
from images.catalog import Catalog, CatalogError, Image

log = logging.getLogger(__name__)

S = NodeState
P = ProvisionPhase

# Progress phases a request's stream reports, in order; the last two end a node.
PHASES = (
    "queued",
    "media_inserted",
    "boot_set",
    "power_cycled",
    "agent_back",
    "inspecting",
    "failed",
)
FINAL = frozenset({"inspecting", "failed"})
DEFAULT_AGENT_TIMEOUT_S = 900.0
# Errors no retry mends: the node is quarantined at once.
PERMANENT = (NotSupported, InvalidArgument, NotFound)


@dataclass(frozen=True)
class ProvisionLimits:
    """How much provisioning runs at once, and how long an agent may take.

    ``fleet`` / ``per_rack``: nodes past ``queued`` (media inserted, booting)
    at once, fleet-wide and per rack: BMCs download the image from the image
    server while they boot, so a rack's boot storm is bounded.
    ``agent_timeout_s``: from the power cycle to the agent's registration.
    """

    fleet: int = 32
    per_rack: int = 4
    agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S
    default_concurrency: int = 64  # a request's nodes in provisioning at once


@dataclass(frozen=True)
class ResolvedImage:
    image: str
    url: str
    sha256: str


def no_agent_reason(image: str, timeout_s: float) -> str:
    return f"provisioning {image}: no agent after {timeout_s:.0f} s"


class Provisioner:
    """Drives provisioning nodes (the lifecycle calls ``step``) and answers
    requests (``resolve``, ``targets``, ``begin``, ``watch``)."""

    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        agents: AgentHub,
        bmc: BmcGateway,
        *,
        catalog: Catalog | None = None,
        verifier: ImageVerifier | None = None,
        limits: ProvisionLimits | None = None,
        image_server: str | None = None,
        clock: Callable[[], float] = time.time,
        on_slot_free: Callable[[], None] | None = None,
    ) -> None:
        """``catalog`` None: provisioning is refused (no catalogue loaded).
        ``verifier`` None: images are not fetched, and refused (never
        provisioned unverified). ``image_server`` overrides the catalogue's."""
        self._store = store
        self._nodes = nodes
        self._agents = agents
        self._bmc = bmc
        self.catalog = catalog
        self._verifier = verifier
        self.limits = limits or ProvisionLimits()
        self._image_server = image_server
        self.clock = clock
        self._on_slot_free = on_slot_free
        self._claim = asyncio.Lock()
        self._watchers: dict[str, list[asyncio.Queue[ProvisionProgress]]] = defaultdict(list)

    # -- the request ------------------------------------------------------------

    async def resolve(self, name: str, image_server: str = "") -> ResolvedImage:
        """The catalogue's image ``name``, its URL and pinned digest, verified.

        Raises:
            FailedPrecondition: no catalogue is loaded; the image is not pinned
                (``operator-supplied``); its bytes differ from the pin.
            InvalidArgument: no such image, or no image server for its URL.
            Unavailable: the image cannot be read to verify it.
        """
        if self.catalog is None:
            raise FailedPrecondition("no image catalogue is loaded (controller --images)")
        if not name:
            raise InvalidArgument("name an image of the catalogue (--image NAME)")
        try:
            image: Image = self.catalog.get(name)
        except CatalogError:
            known = ", ".join(i.name for i in self.catalog.images)
            raise InvalidArgument(
                f"no image named {name[:80]!r} in the catalogue; it has: {known}"
            ) from None
        if image.sha256 is None:
            raise FailedPrecondition(
                f"image {image.name!r} has no pinned sha256 (operator-supplied): mirror it, "
                "put its sha256 in the catalogue (images/README.md) and restart the controller"
            )
        try:
            url = self.catalog.resolve_url(image, image_server or self._image_server)
        except CatalogError as e:
            raise InvalidArgument("; ".join(e.problems)) from None
        if self._verifier is None:
            raise FailedPrecondition(f"image {image.name!r} cannot be verified: no verifier")
        await self._verifier.verify(url, image.sha256)
        return ResolvedImage(image=image.name, url=url, sha256=image.sha256)

    async def targets(
        self, scope: ProvisionScope, url: str = ""
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """(nodes to provision, [(node, why it is skipped)]).

        Named nodes are all or nothing: an unknown one raises NotFound, one
        that cannot be provisioned (allocated, with the allocation's id; a
        state that forbids it; an IPMI BMC) FailedPrecondition. A rack's such
        nodes are skipped and reported instead.
        """
        if bool(scope.names) == bool(scope.rack):
            raise InvalidArgument("name nodes or a rack (one of them)")
        if scope.rack:
            records = [n for n in await self._nodes.records_in(list(S)) if n.rack == scope.rack]
            if not records:
                raise InvalidArgument(f"rack {scope.rack!r} has no nodes")
        else:
            records = [await self._nodes.record(n) for n in dict.fromkeys(scope.names)]
        chosen: list[str] = []
        skipped: list[tuple[str, str]] = []
        for node in sorted(records, key=lambda r: r.name):
            same = node.provision is not None and node.provision.url == url
            why = None if node.state == S.PROVISIONING and same else self.refusal(node)
            if why is None:
                chosen.append(node.name)
            elif scope.rack:
                skipped.append((node.name, why))
            else:
                raise FailedPrecondition(why)
        return chosen, skipped

    def refusal(self, node: NodeRecord) -> str | None:
        """Why ``node`` cannot be provisioned now, or None."""
        if node.allocation_id:
            return (
                f"node {node.name!r} is held by allocation {node.allocation_id}; release it first"
            )
        if node.kind in MEMBERS:
            what = node.kind.value.replace("_", " ")
            return f"node {node.name!r} is a {what}: it runs no OS image"
        if node.state == S.PROVISIONING:
            image = node.provision.image if node.provision else "an image"
            return f"node {node.name!r} is already provisioning {image}; wait for it, or drain it"
        if node.state not in PROVISIONABLE:
            allowed = ", ".join(sorted(s.value for s in PROVISIONABLE))
            return f"node {node.name!r} is {node.state.value}; provisioning starts from {allowed}"
        if node.power_block:
            return f"node {node.name!r} may not be powered on: {node.power_block}"
        try:
            self._bmc.boot_media(node.bmc_url)
        except NotSupported as e:
            return f"node {node.name!r}: {e}"
        return None

    async def begin(self, name: str, image: ResolvedImage, by: str = "") -> bool:
        """Move the node to provisioning (phase queued) with the operation
        stored; False when it was already provisioning this very image (the
        operation in flight goes on). Raises FailedPrecondition as ``refusal``."""
        now = self.clock()

        def write(tx: Tx) -> bool:
            node = load_node(tx, name)
            op = node.provision
            if node.state == S.PROVISIONING and op is not None and op.url == image.url:
                return False
            why = self.refusal(node)
            if why is not None:
                raise FailedPrecondition(why)
            node.provision = ProvisionOp(
                image=image.image, url=image.url, sha256=image.sha256, started_at=now, by=by
            )
            node.drain_target = None
            move(
                tx,
                node,
                S.PROVISIONING,
                f"provisioning {image.image}: queued",
                image=image.image,
                image_url=image.url,
                sha256=image.sha256,
            )
            return True

        started = await self._store.tx(write)
        self._emit(name, "queued", image=image.image, url=image.url)
        return started

    def watch(self, name: str) -> asyncio.Queue[ProvisionProgress]:
        """A queue of the node's progress (``PHASES``) until ``unwatch``."""
        queue: asyncio.Queue[ProvisionProgress] = asyncio.Queue()
        self._watchers[name].append(queue)
        return queue

    def unwatch(self, name: str, queue: asyncio.Queue[ProvisionProgress]) -> None:
        queues = self._watchers.get(name, [])
        with contextlib.suppress(ValueError):
            queues.remove(queue)
        if not queues:
            self._watchers.pop(name, None)

    def _emit(
        self,
        name: str,
        phase: str,
        *,
        ok: bool = True,
        error: str = "",
        image: str = "",
        url: str = "",
    ) -> None:
        progress = ProvisionProgress(
            node=name, phase=phase, ok=ok, error=error, image=image, image_url=url
        )
        for queue in self._watchers.get(name, []):
            queue.put_nowait(progress)

    # -- the lifecycle's step ---------------------------------------------------

    async def step(self, row: NodeRecord) -> bool | None:
        """One step of a provisioning node. True: it moved on to inspecting
        (the lifecycle inspects it next); False: it moved elsewhere
        (quarantined); None: it waits (the lifecycle backs off; a
        registration pokes it).

        Raises the BMC's transient errors (the lifecycle retries them with
        its backoff, until ``agent_timeout_s`` after the slot was taken).
        """
        op = row.provision
        if op is None:  # written by hand, or by a controller from before 0007
            await self._move(row.name, S.INSPECTING, "provisioning: no operation stored")
            return True
        if op.phase == P.QUEUED:
            claimed = await self._take_slot(row, op)
            if claimed is None:
                await self._note(
                    row.name,
                    f"provisioning {op.image}: waiting for a "
                    f"slot (at most {self.limits.per_rack} per rack, "
                    f"{self.limits.fleet} fleet-wide)",
                )
                return None
            op = claimed
        if op.phase == P.MEDIA:
            try:
                op = await self._media(row, op)
            except KilnError as e:
                waited = self.clock() - (op.cycled_at or op.started_at)
                if isinstance(e, PERMANENT) or waited > self.limits.agent_timeout_s:
                    await self._fail(row.name, op, f"provisioning {op.image}: {e}")
                    return False
                raise
        return await self._await_agent(row.name, op)

    async def _take_slot(self, row: NodeRecord, op: ProvisionOp) -> ProvisionOp | None:
        """Claim a fleet and a rack slot (phase media, persisted), or None."""
        async with self._claim:  # count and claim as one, across concurrent steps
            busy = [
                n
                for n in await self._nodes.records_in([S.PROVISIONING])
                if n.provision is not None and n.provision.phase != P.QUEUED
            ]
            racks = Counter(n.rack or n.name for n in busy)
            rack_full = racks[row.rack or row.name] >= self.limits.per_rack
            if len(busy) >= self.limits.fleet or rack_full:
                return None
            claimed = replace(op, phase=P.MEDIA, started_at=self.clock())
            if not await self._save_op(
                row.name, claimed, f"provisioning {op.image}: inserting the image"
            ):
                return None
            return claimed

    async def _media(self, row: NodeRecord, op: ProvisionOp) -> ProvisionOp:
        """Insert the image, set the one-time boot from CD, power-cycle; phase booting."""
        target = await self._nodes.target(row)
        inserted, url = await self._bmc.media_state(target)
        if not (inserted and url == op.url):
            await self._bmc.insert_media(target, op.url)
        self._emit(row.name, "media_inserted", image=op.image, url=op.url)
        await self._bmc.boot_once(target, "cd")
        self._emit(row.name, "boot_set", image=op.image, url=op.url)
        power = await self._bmc.power_state(target)
        requested = self.clock()
        await self._nodes.power(row.name, "cycle" if power == "on" else "on")
        booting = replace(op, phase=P.BOOTING, cycled_at=self.clock(), agent_back_at=0.0)
        # A node that boots fast registers its agent before this phase is
        # saved, when the registration cannot yet mark it: count that one.
        attached = self._agents.attached_at(row.name)
        if attached is not None and attached >= requested:
            booting = replace(booting, agent_back_at=attached)
        await self._save_op(
            row.name,
            booting,
            f"provisioning {op.image}: booting from virtual CD; waiting for the node's agent",
        )
        self._emit(row.name, "power_cycled", image=op.image, url=op.url)
        log.info("node %s: provisioning %s: media inserted, booting from CD", row.name, op.image)
        return booting

    async def _await_agent(self, name: str, op: ProvisionOp) -> bool | None:
        row = await self._nodes.record(name)
        current = row.provision or op
        if current.agent_back_at and self._agents.is_connected(name) and row.gpu_count:
            self._emit(name, "agent_back", image=op.image, url=op.url)
            try:
                await self._bmc.eject_media(await self._nodes.target(row))
            except KilnError as e:  # the boot was one-time: a CD left inside does no harm
                log.warning("node %s: could not eject the provisioned image: %s", name, e)
            took = max(0.0, current.agent_back_at - current.cycled_at)
            reason = f"provisioned {op.image}: agent back after {took:.0f} s; inspecting"
            if not await self._finish(name, op, S.INSPECTING, reason, agent_back_s=round(took, 3)):
                return False
            self._emit(name, "inspecting", image=op.image, url=op.url)
            log.info("node %s: %s", name, reason)
            return True
        waited = self.clock() - current.cycled_at
        if waited > self.limits.agent_timeout_s:
            await self._fail(name, op, no_agent_reason(op.image, self.limits.agent_timeout_s))
            return False
        return None

    async def _fail(self, name: str, op: ProvisionOp, reason: str) -> None:
        """Quarantine the node (through draining), the operation cleared."""

        def write(tx: Tx) -> bool:
            node = load_node(tx, name)
            if node.state != S.PROVISIONING:
                return False
            node.provision = None
            node.drain_target = S.QUARANTINED
            move(tx, node, S.DRAINING, reason, image=op.image)
            move(tx, node, S.QUARANTINED, reason, image=op.image)
            return True

        if await self._store.tx(write):
            log.warning("node %s: quarantined: %s", name, reason)
        self._slot_freed()
        self._emit(name, "failed", ok=False, error=reason, image=op.image, url=op.url)

    async def _finish(
        self, name: str, op: ProvisionOp, target: NodeState, reason: str, **data: float
    ) -> bool:
        def write(tx: Tx) -> bool:
            node = load_node(tx, name)
            if node.state != S.PROVISIONING or node.provision is None:
                return False
            if node.provision.url != op.url:
                return False  # asked for another image meanwhile
            node.provision = None
            move(tx, node, target, reason, image=op.image, image_url=op.url, **data)
            return True

        finished = await self._store.tx(write)
        self._slot_freed()
        return finished

    def _slot_freed(self) -> None:
        if self._on_slot_free is not None:
            self._on_slot_free()

    async def _save_op(self, name: str, op: ProvisionOp, reason: str) -> bool:
        """Persist the node's new phase; False when it left provisioning meanwhile."""

        def write(tx: Tx) -> bool:
            node = load_node(tx, name)
            if node.state != S.PROVISIONING or node.provision is None:
                return False
            if node.provision.url != op.url:
                return False
            node.provision = op
            node.state_reason = reason
            tx.nodes.save(node)
            return True

        return await self._store.tx(write)

    async def _note(self, name: str, reason: str) -> None:
        def write(tx: Tx) -> None:
            node = tx.nodes.get(name)
            if node is not None and node.state_reason != reason:
                node.state_reason = reason
                tx.nodes.save(node)

        await self._store.tx(write)

    async def _move(self, name: str, target: NodeState, reason: str) -> None:
        await self._store.tx(lambda tx: move(tx, load_node(tx, name), target, reason))


def progress_lines(
    chosen: Sequence[str], skipped: Sequence[tuple[str, str]]
) -> list[ProvisionProgress]:
    """The failed lines a request reports at once for the rack's skipped nodes."""
    total = len(chosen) + len(skipped)
    return [
        ProvisionProgress(node=n, phase="failed", ok=False, error=why, done=i, total=total)
        for i, (n, why) in enumerate(skipped, start=1)
    ]
