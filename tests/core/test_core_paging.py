"""Keyset paging (``controller.core.paging``): page tokens round-trip and are
refused when garbled or reused with other filters; pages list every node and
allocation once, in order, on both stores."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import spec

from controller.core.errors import InvalidArgument
from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec, GpuInfo
from controller.core.paging import (
    ALLOCATIONS,
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    NODES,
    AllocationFilter,
    NodeFilter,
    decode_token,
    encode_token,
    fingerprint,
    page_size,
)
from controller.core.ports import Tx
from controller.core.records import AllocationRecord
from controller.core.states import AllocationState

pytestmark = pytest.mark.timeout(60)

FILTERS = {"rack": "r1", "state": "", "gpu_model": "H200", "allocation": ""}


# -- tokens ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "last", "shape"),
    [
        (NODES, ("gb200-r01-t07",), (str,)),
        (NODES, ("",), (str,)),
        (ALLOCATIONS, (41, "alloc-0123456789"), (int, str)),
    ],
    ids=["node", "empty-name", "allocation"],
)
def test_a_token_round_trips_and_is_url_safe(
    kind: str, last: tuple[str | int, ...], shape: tuple[type, ...]
) -> None:
    token = encode_token(kind, last, FILTERS)
    assert token and set(token) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )
    assert decode_token(token, kind, dict(reversed(FILTERS.items())), shape) == last


def test_no_token_is_the_first_page() -> None:
    assert decode_token("", NODES, FILTERS, (str,)) is None


def test_the_fingerprint_ignores_order_and_sees_every_value() -> None:
    assert fingerprint(FILTERS) == fingerprint(dict(reversed(FILTERS.items())))
    assert fingerprint(FILTERS) != fingerprint({**FILTERS, "rack": "r2"})
    assert fingerprint({"include_released": False}) != fingerprint({"include_released": True})


def _forged(body: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


GOOD = {"v": 1, "k": NODES, "a": ["n1"], "f": fingerprint(FILTERS)}


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("not a token!", "does not decode"),
        ("Zm9v", "does not decode"),  # base64 of "foo": not JSON
        ("é", "does not decode"),
        ("x" * 5000, "longer than"),
        (_forged([1, 2]), "does not decode"),
        (_forged({**GOOD, "v": 2}), "format"),
        (_forged({**GOOD, "k": ALLOCATIONS}), "not nodes"),
        (_forged({**GOOD, "f": fingerprint({**FILTERS, "rack": "r9"})}), "other filters"),
        (_forged({**GOOD, "a": "n1"}), "does not decode"),
        (_forged({**GOOD, "a": [1]}), "does not decode"),
        (_forged({**GOOD, "a": ["n1", "n2"]}), "does not decode"),
        (base64.urlsafe_b64encode(b"[" * 700).decode(), "does not decode"),
    ],
    ids=[
        "not-base64",
        "not-json",
        "not-ascii",
        "too-long",
        "not-an-object",
        "version",
        "other-list",
        "other-filters",
        "key-not-a-list",
        "key-wrong-type",
        "key-wrong-length",
        "nested",
    ],
)
def test_a_bad_token_is_invalid_argument(token: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        decode_token(token, NODES, FILTERS, (str,))


@pytest.mark.parametrize("bad", [True, -1, 1.5, "3"])
def test_an_allocation_token_needs_a_queue_position(bad: object) -> None:
    token = _forged({"v": 1, "k": ALLOCATIONS, "a": [bad, "a"], "f": fingerprint({})})
    with pytest.raises(InvalidArgument, match="does not decode"):
        decode_token(token, ALLOCATIONS, {}, (int, str))


def test_page_sizes_default_clamp_and_refuse_negatives() -> None:
    assert page_size(0) == DEFAULT_PAGE_SIZE == 500
    assert page_size(1) == 1
    assert page_size(MAX_PAGE_SIZE) == MAX_PAGE_SIZE == 5000
    assert page_size(10**9) == MAX_PAGE_SIZE
    with pytest.raises(InvalidArgument, match="page_size"):
        page_size(-1)


# -- pages over both stores ------------------------------------------------------------


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[Fleet]:
    fleet = make_fleet()
    yield fleet
    await fleet.stop()


async def _all_names(fleet: Fleet, filters: NodeFilter, size: int) -> list[str]:
    names: list[str] = []
    token = ""
    while True:
        page = await fleet.list_nodes_page(filters, page_size=size, page_token=token)
        assert len(page.items) <= size
        names += [n.name for n in page.items]
        if not page.next_token:
            return names
        assert len(page.items) == size  # a token only after a full page
        token = page.next_token


async def test_pages_list_every_node_once_in_name_order(fleet: Fleet) -> None:
    names = [f"n{i:03d}" for i in range(23)]
    for name in reversed(names):
        await fleet.enroll(spec(name, rack="r1" if name < "n010" else "r2"))
    assert await _all_names(fleet, NodeFilter(), 5) == names
    assert await _all_names(fleet, NodeFilter(), 23) == names  # exactly one full page
    assert await _all_names(fleet, NodeFilter(rack="r1"), 4) == names[:10]
    assert await _all_names(fleet, NodeFilter(state="enrolled"), 100) == names
    assert await _all_names(fleet, NodeFilter(state="ready"), 100) == []


async def test_nodes_enrolled_between_pages_never_repeat_or_hide_others(fleet: Fleet) -> None:
    for i in range(0, 40, 2):
        await fleet.enroll(spec(f"n{i:03d}"))
    before = {f"n{i:03d}" for i in range(0, 40, 2)}
    seen: list[str] = []
    token = ""
    odd = iter(range(1, 40, 2))
    while True:
        page = await fleet.list_nodes_page(NodeFilter(), page_size=3, page_token=token)
        seen += [n.name for n in page.items]
        for _ in range(2):  # one behind the cursor, one ahead of it
            i = next(odd, None)
            if i is not None:
                await fleet.enroll(spec(f"n{(i * 7) % 40:03d}x"))
        if not page.next_token:
            break
        token = page.next_token
    assert len(seen) == len(set(seen))
    assert before <= set(seen)
    assert seen == sorted(seen)


async def test_filters_by_gpu_model_and_allocation_read_only_the_pages_gpus(
    fleet: Fleet,
) -> None:
    for name in ("a1", "a2", "b1", "b2"):
        await fleet.enroll(spec(name))

    def kit(tx: Tx) -> None:
        for name, model in (("a1", "H200"), ("a2", "GB200"), ("b1", "H200")):
            node = tx.nodes.get(name)
            assert node is not None
            node.gpu_model, node.gpu_count = model, 2
            node.allocation_id = "alloc-x" if name != "a2" else ""
            tx.nodes.save(node)
            tx.nodes.set_gpus(
                name, [GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model=model) for i in (1, 0)]
            )

    await fleet.store.tx(kit)
    h200 = await fleet.list_nodes_page(NodeFilter(gpu_model=" h200 "))
    assert [n.name for n in h200.items] == ["a1", "b1"] and h200.next_token == ""
    assert [g.uuid for g in h200.items[0].gpus] == ["GPU-a1-0", "GPU-a1-1"]
    held = await fleet.list_nodes_page(NodeFilter(allocation="alloc-x"), page_size=1)
    assert [n.name for n in held.items] == ["a1"]
    rest = await fleet.list_nodes_page(
        NodeFilter(allocation="alloc-x"), page_size=1, page_token=held.next_token
    )
    assert [n.name for n in rest.items] == ["b1"]
    # A GPU model is compared in upper case, so its token fits either spelling.
    first = await fleet.list_nodes_page(NodeFilter(gpu_model="h200"), page_size=1)
    second = await fleet.list_nodes_page(
        NodeFilter(gpu_model="H200"), page_size=1, page_token=first.next_token
    )
    assert [n.name for n in second.items] == ["b1"] and second.next_token == ""
    with pytest.raises(InvalidArgument, match="other filters"):
        await fleet.list_nodes_page(
            NodeFilter(allocation="alloc-y"), page_size=1, page_token=held.next_token
        )
    mixed = await fleet.list_nodes_page(NodeFilter(gpu_model="H200", allocation="alloc-x"))
    assert [n.name for n in mixed.items] == ["a1", "b1"]
    assert [n.gpus for n in mixed.items if n.name == "a2"] == []


async def test_an_unknown_state_is_invalid_argument(fleet: Fleet) -> None:
    with pytest.raises(InvalidArgument, match="unknown node state 'sleepy'"):
        await fleet.list_nodes_page(NodeFilter(state="sleepy"))
    with pytest.raises(InvalidArgument, match="unknown allocation state 'releasing'"):
        await fleet.list_allocations_page(AllocationFilter(state="releasing"))


async def test_allocations_page_in_queue_order_and_filter_by_state(fleet: Fleet) -> None:
    states = [AllocationState.PENDING, AllocationState.RELEASED, AllocationState.READY] * 4

    def add(tx: Tx) -> None:
        for i, state in enumerate(states):
            tx.allocations.add(
                AllocationRecord(
                    id=f"alloc-{i:02d}",
                    key=f"k{i}",
                    spec=AllocationSpec(nodes=1),
                    state=state,
                    submitted=i // 2 + 1,  # two share each queue position
                )
            )

    await fleet.store.tx(add)

    async def every(filters: AllocationFilter, size: int) -> list[str]:
        ids: list[str] = []
        token = ""
        while True:
            page = await fleet.list_allocations_page(filters, page_size=size, page_token=token)
            ids += [a.id for a in page.items]
            if not page.next_token:
                return ids
            token = page.next_token

    everything = [f"alloc-{i:02d}" for i in range(12)]
    assert await every(AllocationFilter(include_released=True), 5) == everything
    assert await every(AllocationFilter(include_released=True), 1) == everything
    open_ = [a for a, s in zip(everything, states, strict=True) if s != AllocationState.RELEASED]
    assert await every(AllocationFilter(), 3) == open_
    released = await every(AllocationFilter(state="released"), 2)
    assert released == [a for a in everything if a not in open_]
    first = await fleet.list_allocations_page(AllocationFilter(), page_size=2)
    with pytest.raises(InvalidArgument, match="other filters"):
        await fleet.list_allocations_page(
            AllocationFilter(include_released=True), page_token=first.next_token
        )
    node_token = encode_token(NODES, ("n1",), {})
    with pytest.raises(InvalidArgument, match="not allocations"):
        await fleet.list_allocations_page(AllocationFilter(), page_token=node_token)


async def test_no_nodes_no_allocations_one_empty_page(fleet: Fleet) -> None:
    nodes = await fleet.list_nodes_page(NodeFilter())
    assert nodes.items == () and nodes.next_token == ""
    allocs = await fleet.list_allocations_page(AllocationFilter(include_released=True))
    assert allocs.items == () and allocs.next_token == ""
