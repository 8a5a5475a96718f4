"""Keyset paging for the list calls: page sizes, opaque page tokens, one page.

A list is read a page at a time in the order of a unique key -- a node's
name; an allocation's queue position, then its id -- each page starting
*after* the last key of the page before (``WHERE key > :after ORDER BY key
LIMIT :n``), never at an offset. So a node enrolled while a client pages
lands before or after its cursor: it is listed once or not at all, and every
node that existed when paging began is listed exactly once, however many were
enrolled meanwhile.

A page token is opaque to clients: URL-safe base64 (unpadded) of a small JSON
object holding the token format's version, the list it pages, the last key of
its page and a fingerprint of the filters it was issued for. A token that does
not decode, or comes back for another list or with other filters, is refused
InvalidArgument. Tokens are neither secret nor signed: a forged one only
moves the cursor of a list the caller may read anyway.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from controller.core.allocations import allocation_info
from controller.core.errors import InvalidArgument
from controller.core.json_depth import nests_deeper_than
from controller.core.model import AllocationInfo, NodeInfo
from controller.core.nodes import Nodes
from controller.core.ports import Store, Tx
from controller.core.records import AllocationRecord
from controller.core.states import OPEN, AllocationState, NodeState

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_PAGE_SIZE = 500  # a request's page_size 0
MAX_PAGE_SIZE = 5000  # larger page sizes are taken as this
MAX_TOKEN_CHARS = 1024  # the API's limit on any text field (api/limits.py)
TOKEN_VERSION = 1

NODES = "nodes"
ALLOCATIONS = "allocations"

Key = tuple[str | int, ...]
"""A position in a list: the key of its last item so far, compared in order."""

FilterValue = str | bool


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list; ``next_token`` is "" on the last page."""

    items: tuple[T, ...]
    next_token: str = ""


@dataclass(frozen=True, slots=True)
class NodeFilter:
    """Which nodes ``ListNodes`` lists; an empty field matches any node."""

    rack: str = ""
    state: str = ""  # a NodeState value
    gpu_model: str = ""  # a short model name (H200, GB200), in any case
    allocation: str = ""  # an allocation's id: the nodes booked to it

    def normalized(self) -> NodeFilter:
        return dataclasses.replace(self, gpu_model=self.gpu_model.strip().upper())

    def node_state(self) -> NodeState | None:
        """Raises InvalidArgument for a state the core does not know."""
        if not self.state:
            return None
        if self.state not in {s.value for s in NodeState}:
            raise InvalidArgument(f"unknown node state {self.state!r}")
        return NodeState(self.state)


@dataclass(frozen=True, slots=True)
class AllocationFilter:
    """Which allocations ``ListAllocations`` lists: the open ones (pending,
    preparing, ready), every one with ``include_released``, or only those in
    ``state`` when it is given."""

    include_released: bool = False
    state: str = ""  # an AllocationState value

    def states(self) -> frozenset[AllocationState] | None:
        """The states listed (None: all). Raises InvalidArgument for a state
        the core does not know."""
        if self.state:
            if self.state not in {s.value for s in AllocationState}:
                raise InvalidArgument(f"unknown allocation state {self.state!r}")
            return frozenset({AllocationState(self.state)})
        return None if self.include_released else OPEN


def page_size(requested: int) -> int:
    """The page size to use: 0 is the default, more than MAX_PAGE_SIZE is
    MAX_PAGE_SIZE. Raises InvalidArgument for a negative one."""
    if requested < 0:
        raise InvalidArgument(f"page_size must be 0 (the default, {DEFAULT_PAGE_SIZE}) or more")
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def fingerprint(filters: Mapping[str, FilterValue]) -> str:
    """A short digest of ``filters``: equal for equal filters, in any order."""
    canonical = json.dumps(dict(filters), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def encode_token(kind: str, last: Key, filters: Mapping[str, FilterValue]) -> str:
    """The token of the page after the one that ended at ``last``."""
    body = {"v": TOKEN_VERSION, "k": kind, "a": list(last), "f": fingerprint(filters)}
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


_GARBLED = (
    "page_token is not a token this controller issued (it does not decode); "
    "send the next_page_token of a response unchanged, or none for the first page"
)


def _body(token: str) -> dict[str, object]:
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidArgument(f"page_token is longer than {MAX_TOKEN_CHARS} characters")
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        text = raw.decode("utf-8")
        if nests_deeper_than(text, 8):  # a token is one flat object
            raise InvalidArgument(_GARBLED)
        body = json.loads(text)
    except (binascii.Error, ValueError, RecursionError):  # UnicodeError is a ValueError
        raise InvalidArgument(_GARBLED) from None
    if not isinstance(body, dict):
        raise InvalidArgument(_GARBLED)
    return body


def _key_part(value: object, kind: type) -> str | int:
    # bool is an int to Python, never a key here.
    if kind is int and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if kind is str and isinstance(value, str):
        return value
    raise InvalidArgument(_GARBLED)


def decode_token(
    token: str, kind: str, filters: Mapping[str, FilterValue], shape: Sequence[type]
) -> Key | None:
    """Where the page ``token`` asks for starts (None: "" asks for the first).

    ``shape`` is the type of each part of the list's key (``(str,)`` for
    names). Raises InvalidArgument, saying which, for a token that does not
    decode, is of another version, pages another list, or was issued for
    other filters.
    """
    if not token:
        return None
    body = _body(token)
    if body.get("v") != TOKEN_VERSION:
        raise InvalidArgument(
            "page_token is of a format this controller does not read; start again without one"
        )
    if body.get("k") != kind:
        raise InvalidArgument(
            f"page_token pages {str(body.get('k'))[:32]!r}, not {kind}: "
            "send it to the call that returned it"
        )
    if body.get("f") != fingerprint(filters):
        raise InvalidArgument(
            "page_token was issued for other filters: send the filters of the first "
            "page with every page, or start again without a token"
        )
    last = body.get("a")
    if not isinstance(last, list) or len(last) != len(shape):
        raise InvalidArgument(_GARBLED)
    return tuple(_key_part(v, t) for v, t in zip(last, shape, strict=True))


def cut(
    found: Sequence[R],
    limit: int,
    key_of: Callable[[R], Key],
    kind: str,
    filters: Mapping[str, FilterValue],
) -> tuple[Sequence[R], str]:
    """Up to ``limit`` of ``found`` (read with ``limit + 1``, so that one more
    says whether a page follows) and the token of the next page ("": none)."""
    if len(found) <= limit:
        return found, ""
    kept = found[:limit]
    return kept, encode_token(kind, key_of(kept[-1]), filters)


async def node_page(
    nodes: Nodes, filters: NodeFilter, *, size: int = 0, token: str = ""
) -> Page[NodeInfo]:
    """One page of nodes by name (see the module docstring).

    Raises InvalidArgument: an unknown state, a negative size, a bad token.
    """
    filters = filters.normalized()
    state = filters.node_state()
    limit = page_size(size)
    fields = dataclasses.asdict(filters)
    after = decode_token(token, NODES, fields, (str,))
    found = await nodes.page(
        str(after[0]) if after else "",
        limit + 1,
        rack=filters.rack,
        state=state,
        gpu_model=filters.gpu_model,
        allocation=filters.allocation,
    )
    kept, next_token = cut(found, limit, lambda n: (n.name,), NODES, fields)
    return Page(tuple(kept), next_token)


async def allocation_page(
    store: Store, filters: AllocationFilter, *, size: int = 0, token: str = ""
) -> Page[AllocationInfo]:
    """One page of allocations in queue order (``submitted``, then id).

    Raises InvalidArgument: an unknown state, a negative size, a bad token.
    """
    states: Collection[AllocationState] | None = filters.states()
    limit = page_size(size)
    fields = dataclasses.asdict(filters)
    after = decode_token(token, ALLOCATIONS, fields, (int, str))
    start = (int(after[0]), str(after[1])) if after else (0, "")

    def read(tx: Tx) -> Page[AllocationInfo]:
        found = tx.allocations.page(start, limit + 1, states=states)
        kept, next_token = cut(found, limit, _allocation_key, ALLOCATIONS, fields)
        return Page(tuple(allocation_info(a) for a in kept), next_token)

    return await store.read(read)


def _allocation_key(alloc: AllocationRecord) -> Key:
    return (alloc.submitted, alloc.id)
