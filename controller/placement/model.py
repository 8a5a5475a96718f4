"""Value types of the placement engine: requests, bookings and outcomes.

Everything here is a frozen value. ``NoFit`` is an outcome, not an error: the
engine returns it when a request cannot be placed, with a human reason and
whether waiting could ever help (``permanent``). Only a malformed request
raises (``InvalidArgument`` from :meth:`Request.validate`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from controller.core.errors import InvalidArgument


class Level(enum.Enum):
    """How tight a gang must (or should) be, from tightest to loosest."""

    NVLINK = "nvlink"
    LEAF = "leaf"
    SPINE = "spine"
    ANY = "any"

    @property
    def tier(self) -> int:
        """0 for one NVLink domain, 1 one leaf, 2 one spine, 3 anywhere."""
        return _TIERS[self]


_TIERS = {Level.NVLINK: 0, Level.LEAF: 1, Level.SPINE: 2, Level.ANY: 3}
TIER_NAMES = ("in one NVLink domain", "in one leaf", "in one spine", "in this fleet")


@dataclass(frozen=True)
class NodeSpec:
    """One node as placement sees it.

    ``domain`` is the NVLink domain: for GB200 the fabric clique
    ``<clusterUuid>.<cliqueId>`` shared by a rack's trays, for an HGX box its
    own name. ``schedulable`` is False for nodes not ready, drained or
    unhealthy; such nodes are never placed.
    """

    name: str
    gpu_model: str
    gpus: int
    domain: str
    rack: str
    leaf: str
    spine: str
    schedulable: bool = True


@dataclass(frozen=True)
class Request:
    """A gang request: ``nodes`` whole nodes or ``racks`` whole NVLink racks.

    ``level`` with ``required=True`` must hold or the request waits;
    ``required=False`` prefers the level and falls back one level at a time.
    ``segment`` (M) splits the gang into chunks of M nodes, each chunk inside
    one NVLink domain. ``spares_per_domain`` hot spares are held with the
    allocation in every domain it uses. ``exclusive`` gangs share their
    domains with nobody. ``queue``/``priority``/``submitted`` order the
    request in :func:`controller.placement.schedule`.
    """

    key: str
    nodes: int = 0
    racks: int = 0
    gpu_model: str | None = None
    level: Level = Level.ANY
    required: bool = True
    segment: int = 0
    spares_per_domain: int = 0
    exclusive: bool = False
    queue: str = "default"
    priority: int = 0
    submitted: int = 0

    def validate(self) -> None:
        """Raise ``InvalidArgument`` naming the first thing wrong; else return."""
        if not self.key:
            raise InvalidArgument("request key must not be empty")
        if self.nodes < 0 or self.racks < 0:
            raise InvalidArgument(f"request {self.key!r}: nodes and racks must not be negative")
        if (self.nodes > 0) == (self.racks > 0):
            raise InvalidArgument(
                f"request {self.key!r}: ask for exactly one of nodes or racks "
                f"(got nodes={self.nodes}, racks={self.racks})"
            )
        if self.segment < 0 or self.spares_per_domain < 0:
            raise InvalidArgument(
                f"request {self.key!r}: segment and spares_per_domain must not be negative"
            )
        if self.segment and self.racks:
            raise InvalidArgument(f"request {self.key!r}: segment applies to node requests only")
        if self.segment and self.nodes % self.segment:
            raise InvalidArgument(
                f"request {self.key!r}: nodes={self.nodes} is not a multiple of "
                f"segment={self.segment}"
            )
        if self.gpu_model is not None and not self.gpu_model:
            raise InvalidArgument(f"request {self.key!r}: gpu_model must be None or a name")
        if not isinstance(self.level, Level):
            raise InvalidArgument(f"request {self.key!r}: unknown level {self.level!r}")


@dataclass(frozen=True)
class Booking:
    """An admitted allocation: job nodes plus the hot spares held with it.

    ``gpus`` counts the GPUs of job nodes and spares (both are held, both
    count against the queue's quota).
    """

    key: str
    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    domains: tuple[str, ...]
    exclusive: bool
    queue: str
    gpus: int

    @property
    def all_nodes(self) -> tuple[str, ...]:
        """Job nodes then spares."""
        return self.nodes + self.spares


@dataclass(frozen=True)
class Placement:
    """Where a request would go.

    ``stranded_gpus``: GPUs on nodes left free in the NVLink domains this
    placement touches (for an exclusive placement these can serve nobody
    else). A placement that fills its domains exactly strands nothing.
    """

    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    domains: tuple[str, ...]
    stranded_gpus: int


@dataclass(frozen=True)
class NoFit:
    """A request that cannot be placed now; ``permanent`` if never on this fleet."""

    reason: str
    permanent: bool


@dataclass(frozen=True)
class QueueConfig:
    """A tenant queue: ``gpu_quota`` GPUs (None = unlimited) and how many
    GPUs beyond it the queue may borrow from other queues' unused quota."""

    name: str
    gpu_quota: int | None = None
    borrowing_limit: int = 0
