"""The small interfaces the domain core drives; adapters implement them.

The core never imports a BMC library, a database library or the wire format:
the controller's wiring (``controller.server``) plugs real implementations in —
the store package for storage, the BMC package's gateway for the BMCs.

Storage is a unit of work. The core passes a plain (synchronous) function of a
``Tx`` to ``Store.tx``; it runs in one database transaction off the event loop
and commits when it returns (rolls back when it raises). Inside it the core
reads records from the repositories, changes them, saves them and adds the
events that describe the change, so a transition and its event commit
together or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol, TypeVar

from controller.core.health import HealthReport, HealthSample
from controller.core.identity import TokenRecord
from controller.core.kinds import EventKind
from controller.core.model import BmcTarget, EventInfo, GpuInfo, LeakReading
from controller.core.node_view import NodeChanges
from controller.core.records import AllocationRecord, LeakLook, NewEvent, NodeRecord
from controller.core.states import AllocationState, NodeState

T = TypeVar("T")


class NodeRepository(Protocol):
    def get(self, name: str, *, with_health: bool = True) -> NodeRecord | None:
        """The node as stored; ``with_health=False`` leaves ``health`` None
        (not read: a write that moves the node needs none, the latest report
        lives in memory)."""
        ...

    def find(
        self, *, rack: str = "", state: NodeState | None = None, with_health: bool = True
    ) -> list[NodeRecord]:
        """Nodes ordered by name, optionally of one rack and/or one state;
        ``with_health=False`` leaves ``health`` None (not parsed: a scheduling
        pass over the fleet needs none)."""
        ...

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
        """At most ``limit`` nodes named after ``after`` ("": from the first),
        by name, of the filters given ("" or None: any): one page of a keyset
        listing (``controller.core.paging``), never read at an offset."""
        ...

    def held_by(
        self, allocation: str, *, with_health: bool = True, members: Sequence[str] = ()
    ) -> list[NodeRecord]:
        """The nodes booked to ``allocation`` (``with_health`` as for ``get``).
        ``members``, the allocation's own nodes and spares, lets a store
        that already holds those rows answer without a query: booking sets
        a node's allocation and the allocation's members in one
        transaction, so the holders are always among them."""
        ...

    def find_by_bmc_url(self, url: str) -> list[NodeRecord]:
        """The nodes enrolled with exactly this (canonical) BMC URL, by name.

        At most one, unless the store predates the check at enrolment.
        """
        ...

    def add(self, node: NodeRecord, bmc_password: str) -> None:
        """Store a new node; the password is sealed at rest."""
        ...

    def save(self, node: NodeRecord) -> None:
        """Write back every field of a record read in this transaction, but
        its health: that is written by ``save_health``/``save_health_batch``."""
        ...

    def set_credentials(self, node: NodeRecord, username: str, bmc_password: str) -> None:
        """Replace the node's BMC username and password (sealed at rest)."""
        ...

    def save_health(self, name: str, health: HealthReport, seen_at: float) -> NodeRecord | None:
        """Keep ``health`` as the node's latest report; None for an unknown node."""
        ...

    def save_health_batch(self, samples: Sequence[HealthSample]) -> int:
        """Keep each sample as its node's latest report (a sample without one
        keeps the stored report) and last sighting, in bulk; samples of unknown
        nodes are skipped. Returns how many nodes were written."""
        ...

    def bmc_target(self, node: NodeRecord) -> BmcTarget:
        """How to reach the node's BMC, with its password unsealed.

        Raises FailedPrecondition when the password was sealed with another key.
        """
        ...

    def bmc_targets(self, nodes: Sequence[NodeRecord]) -> list[BmcTarget]:
        """``bmc_target`` of each node, in order, read in bulk (a pass over
        the fleet reads thousands). A node no longer stored gets an empty
        password (its read fails at the BMC, not here).

        Raises FailedPrecondition when a password was sealed with another key.
        """
        ...

    def gpus(self, name: str) -> list[GpuInfo]:
        """The node's GPUs by index."""
        ...

    def gpus_by_node(self) -> dict[str, list[GpuInfo]]: ...

    def gpus_of(self, names: Collection[str]) -> dict[str, list[GpuInfo]]:
        """The GPUs of these nodes only, by index (a node without any: absent)."""
        ...

    def set_gpus(self, name: str, gpus: Sequence[GpuInfo]) -> None:
        """Replace the node's GPU inventory."""
        ...

    def leak_looks(self) -> dict[str, LeakLook]:
        """Every node whose BMC showed no leak detectors at its last reads."""
        ...

    def save_leak_looks(self, looks: Mapping[str, LeakLook | None]) -> None:
        """Keep each node's look (None: forget it); nodes no longer enrolled
        are skipped."""
        ...

    def remove(self, name: str) -> None:
        """Forget the node, its GPUs and its agent's tokens (its events stay)."""
        ...


class AllocationRepository(Protocol):
    def get(self, ident: str) -> AllocationRecord | None: ...

    def by_key(self, key: str) -> AllocationRecord | None: ...

    def find(self, states: Collection[AllocationState] | None = None) -> list[AllocationRecord]:
        """Allocations in queue order (``submitted``), optionally in ``states``."""
        ...

    def page(
        self,
        after: tuple[int, str],
        limit: int,
        *,
        states: Collection[AllocationState] | None = None,
    ) -> list[AllocationRecord]:
        """At most ``limit`` allocations after ``after`` in (``submitted``, id)
        order, optionally in ``states``; ``(0, "")`` starts at the first. One
        page of a keyset listing (``controller.core.paging``)."""
        ...

    def add(self, allocation: AllocationRecord) -> None:
        """Store a new allocation.

        Raises DuplicateKey when another allocation already has its key.
        """
        ...

    def save(self, allocation: AllocationRecord) -> None: ...

    def last_submitted(self) -> int:
        """The highest queue position handed out so far (0: none)."""
        ...


class EventRepository(Protocol):
    def add(self, event: NewEvent) -> None:
        """Record ``event`` in this transaction (it gets the next ``seq``)."""
        ...

    def since(
        self,
        after_seq: int,
        *,
        node: str = "",
        allocation: str = "",
        kinds: Collection[EventKind] = (),
        limit: int = 500,
    ) -> list[EventInfo]:
        """Events after ``after_seq``, oldest first, of the node, allocation
        and kinds given (empty: any)."""
        ...

    def newest(self, limit: int, *, node: str = "") -> list[EventInfo]:
        """The newest ``limit`` events (of ``node``, if given), oldest first."""
        ...

    def recent(self, kind: EventKind, since_at: float) -> list[EventInfo]:
        """Every event of ``kind`` recorded at or after ``since_at``, oldest first."""
        ...

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
        """The newest ``limit`` events of ``kind`` (of ``node`` or
        ``allocation``, if given: in the query, by its index) recorded at or after ``since_at`` that
        ``where`` accepts (all, without it), oldest first.

        Reads newest first and stops at ``limit`` matches.
        """
        ...


class TokenRepository(Protocol):
    """Bearer tokens: operators' (by name) and agents' (one per node)."""

    def get(self, token_id: str) -> TokenRecord | None: ...

    def by_name(self, name: str) -> TokenRecord | None: ...

    def find(self, *, include_revoked: bool = False) -> list[TokenRecord]:
        """Tokens by name."""
        ...

    def add(self, token: TokenRecord) -> None:
        """Store a new token. Raises DuplicateKey when its id or name is taken."""
        ...

    def save(self, token: TokenRecord) -> None:
        """Write back a token read in this transaction."""
        ...

    def delete(self, token_id: str) -> None:
        """Forget a token (a no-op when there is none)."""
        ...


class Tx(Protocol):
    """One transaction's view of the store."""

    @property
    def nodes(self) -> NodeRepository: ...

    @property
    def allocations(self) -> AllocationRepository: ...

    @property
    def events(self) -> EventRepository: ...

    @property
    def tokens(self) -> TokenRepository: ...


class Store(Protocol):
    async def tx(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one transaction and commit when it returns.

        Raises whatever ``fn`` raises, after rolling the transaction back.
        Listeners registered with ``on_commit`` are told when it recorded events.
        """
        ...

    async def read(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a transaction that writes nothing."""
        ...

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the event loop) after every commit that recorded events."""
        ...

    def on_nodes_committed(self, listener: Callable[[NodeChanges], None]) -> None:
        """Call ``listener`` (on the event loop) with what each commit saved
        of nodes, in commit order, before the committing caller resumes."""
        ...

    def on_allocations_committed(
        self, listener: Callable[[Mapping[str, AllocationRecord]], None]
    ) -> None:
        """Call ``listener`` (on the event loop) with each allocation a commit
        added or saved, as of its last save there, by id; in commit order,
        before the committing caller resumes."""
        ...

    def close(self) -> None: ...


class BmcGateway(Protocol):
    def canonical_url(self, url: str) -> str:
        """Validate a BMC URL and return its canonical form.

        Raises:
            InvalidArgument: the URL is malformed or of an unknown scheme.
        """
        ...

    def validate_target(self, url: str, username: str, password: str) -> str:
        """Check a BMC URL and credentials against the protocol's rules (e.g.
        IPMI's 20-byte passwords); returns the canonical URL.

        Raises:
            InvalidArgument: the URL or the credentials cannot work.
        """
        ...

    async def power_state(self, target: BmcTarget) -> str:
        """Return "on", "off" or "unknown". Raises BmcError and its kin."""
        ...

    async def set_power(self, target: BmcTarget, action: str) -> str:
        """Run a power action (on, off, force_off, cycle, restart), poll until it
        lands and return the final state. Idempotent: already there is success."""
        ...

    def health(self, node: str) -> str:
        """ "ok", "degraded", "unreachable" or "unknown" (never contacted)."""
        ...

    async def thermal_c(self, target: BmcTarget) -> list[float]:
        """The BMC's own temperature readings in °C (the agent-silent fallback)."""
        ...

    async def leak_detectors(self, target: BmcTarget) -> list[LeakReading]:
        """Every leak detector of the node's chassis ([] when it has none).

        Raises:
            NotSupported: the node's protocol has no leak detectors (IPMI);
                answered at once, without a BMC call.
            BmcError and its kin: the BMC failed, or sent a broken collection.
        """
        ...

    async def firmware_versions(self, target: BmcTarget) -> dict[str, str]:
        """Firmware component (id and name both as keys) → installed version.
        Raises NotSupported when the BMC has no firmware inventory."""
        ...

    async def firmware_update(self, target: BmcTarget, image_url: str, component: str) -> None:
        """Update one component from ``image_url`` and follow the task to its end."""
        ...

    async def bios_attributes(self, target: BmcTarget) -> dict[str, object]:
        """Current BIOS attributes. Raises NotSupported when the BMC has none."""
        ...

    async def bios_set(self, target: BmcTarget, attributes: dict[str, object]) -> None:
        """Stage BIOS attributes; they apply at the next reboot."""
        ...

    async def poll_power(
        self, targets: list[BmcTarget], concurrency: int, *, spread: float = 0.0
    ) -> dict[str, tuple[str | None, str]]:
        """Read many BMCs' power at once: node → (state or None on failure, health).
        Never raises for one BMC's failure; a broken BMC never slows the rest.
        Past the first few, the reads begin evenly over ``spread`` seconds
        (``core/spread.py``)."""
        ...

    def boot_media(self, url: str) -> str:
        """How a node with this BMC URL boots an image from a URL, answered
        without I/O: "virtual_media" (inserted as a CD, one-time boot from CD).

        Raises:
            NotSupported: the protocol cannot boot an image from a URL (IPMI:
                no virtual media, no HTTP boot device); the message says so.
        """
        ...

    async def insert_media(self, target: BmcTarget, image_url: str) -> None:
        """Insert ``image_url`` as virtual CD (write-protected). Idempotent:
        the same image already inserted is left as it is; another is ejected
        first. Raises NotSupported, BmcError and its kin."""
        ...

    async def media_state(self, target: BmcTarget) -> tuple[bool, str]:
        """(inserted, image URL or "") of the virtual CD. Raises as ``insert_media``."""
        ...

    async def eject_media(self, target: BmcTarget) -> None:
        """Eject the virtual CD; idempotent. Raises as ``insert_media``."""
        ...

    async def boot_once(self, target: BmcTarget, device: str) -> None:
        """Boot from ``device`` ("cd", "pxe", "disk", "uefi_http") at the next
        boot only. Raises NotSupported (device), BmcError and its kin."""
        ...

    async def boot_override(self, target: BmcTarget) -> tuple[str, bool]:
        """The boot override now: (device or "none", persistent)."""
        ...

    def forget(self, node: str) -> None:
        """Drop any cached connection for ``node`` (after re-enrolment)."""
        ...

    async def close(self) -> None: ...


class ImageVerifier(Protocol):
    """Checks an OS image against its pinned digest before a BMC is told about it."""

    async def verify(self, url: str, sha256: str) -> None:
        """Return when the image at ``url`` has this SHA-256 (64 hex digits).

        Raises:
            FailedPrecondition: the image (or its published digest) differs.
            Unavailable: the image cannot be read from here, so it cannot be
                verified (provisioning is refused, never done unverified).
        """
        ...
