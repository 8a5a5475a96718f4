"""``KeptNames``: the names a test holds for, kept from the view's commits and
the agents' comings and goings, and taken afresh when the view is loaded anew."""

from __future__ import annotations

import dataclasses

import pytest

from controller.core.agents import AgentHub
from controller.core.kept_names import KeptNames
from controller.core.node_view import NodeChanges, NodeView
from controller.core.records import NodeRecord
from controller.core.states import PowerState

pytestmark = pytest.mark.timeout(30)


def node(name: str, power: PowerState = PowerState.ON) -> NodeRecord:
    return NodeRecord(name=name, bmc_url=f"redfish+http://127.0.0.1:9/{name}", power=power)


def on_without_agent(record: NodeRecord, connected: bool) -> bool:
    return not connected and record.power == PowerState.ON


async def test_the_names_follow_commits_agents_and_a_new_load() -> None:
    view, agents = NodeView(), AgentHub()
    view.begin_load()
    view.install([node("a"), node("b"), node("c", PowerState.OFF)], {})
    agents.attach("b")
    kept = KeptNames(agents, on_without_agent)
    assert await kept.names(view) == {"a"}  # the first look: every record

    agents.attach("a")
    agents.drop("b")
    view.committed(NodeChanges(saved={"c": node("c"), "d": node("d")}))
    assert await kept.names(view) == {"b", "c", "d"}

    view.committed(NodeChanges(removed=frozenset({"d"})))
    b_off = dataclasses.replace(node("b"), power=PowerState.OFF)
    view.committed(NodeChanges(saved={"b": b_off}))
    assert await kept.names(view) == {"c"}

    # Loaded anew (a new store, a standby taking over): every record again,
    # not only what the commits named.
    view.begin_load()
    view.install([node("a"), node("e")], {})
    assert await kept.names(view) == {"e"}


async def test_a_test_that_changes_nothing_costs_no_look_at_the_fleet() -> None:
    view, agents = NodeView(), AgentHub()
    view.begin_load()
    view.install([node(f"n{i}") for i in range(100)], {})
    looked: list[str] = []

    def test(record: NodeRecord, connected: bool) -> bool:
        looked.append(record.name)
        return not connected

    kept = KeptNames(agents, test)
    assert len(await kept.names(view)) == 100 and len(looked) == 100
    looked.clear()
    agents.attach("n7")
    assert "n7" not in await kept.names(view)
    assert looked == ["n7"]  # only the node whose agent came
    looked.clear()
    await kept.names(view)
    assert looked == []
