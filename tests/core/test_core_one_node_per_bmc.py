"""One node per BMC: a second node enrolled with a BMC another node already
has is refused, naming that node, and nothing is stored — on both stores."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import spec

from controller.core.errors import AlreadyExists
from controller.core.fleet import Fleet
from controller.core.model import EnrollSpec
from controller.core.ports import Store


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[Fleet]:
    fleet = make_fleet()
    yield fleet
    await fleet.stop()


def on_bmc(name: str, url: str, rack: str = "") -> EnrollSpec:
    return dataclasses.replace(spec(name, rack), bmc_url=url)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "second_url",
    ["fake://bmc-a", "fake://BMC-A", "fake://bmc-a/"],
    ids=["same-url", "other-case", "trailing-slash"],
)
async def test_a_second_node_on_the_same_bmc_is_refused_naming_the_first(
    fleet: Fleet, second_url: str
) -> None:
    await fleet.enroll(on_bmc("n1", "fake://bmc-a", "r1"))
    before = await fleet.events.since(0)
    with pytest.raises(AlreadyExists, match=r"BMC fake://bmc-a is already enrolled as node 'n1'"):
        await fleet.enroll(on_bmc("n2", second_url, "r1"))
    assert [n.name for n in await fleet.list_nodes()] == ["n1"]
    assert await fleet.events.since(0) == before


@pytest.mark.timeout(30)
async def test_the_same_node_again_is_idempotent_and_another_bmc_is_accepted(
    fleet: Fleet,
) -> None:
    first = await fleet.enroll(on_bmc("n1", "fake://bmc-a"))
    again = await fleet.enroll(on_bmc("n1", "fake://BMC-A/"))
    assert again.updated_at == first.updated_at and again.bmc_url == "fake://bmc-a"
    await fleet.enroll(on_bmc("n2", "fake://bmc-b"))
    assert {n.name: n.bmc_url for n in await fleet.list_nodes()} == {
        "n1": "fake://bmc-a",
        "n2": "fake://bmc-b",
    }


@pytest.mark.timeout(30)
async def test_the_repository_finds_nodes_by_bmc_url(store: Store, fleet: Fleet) -> None:
    await fleet.enroll(on_bmc("n1", "fake://bmc-a"))
    await fleet.enroll(on_bmc("n2", "fake://bmc-b"))
    found = await store.read(lambda tx: tx.nodes.find_by_bmc_url("fake://bmc-b"))
    assert [n.name for n in found] == ["n2"]
    assert await store.read(lambda tx: tx.nodes.find_by_bmc_url("fake://nobody")) == []
