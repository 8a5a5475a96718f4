"""A lifecycle step begins from the node's row as the view had it; by the
time it moves the node, something else may have moved it on (a rack
bring-up's provisioning, a check run's end). A step from a stale row then
leaves the node where it is, instead of moving it from a state the step
never saw (which the state machine may allow, hijacking the other work)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from core_builders import set_fields

from controller.core.fleet import Fleet
from controller.core.model import EnrollSpec
from controller.core.states import NodeState


async def enrolled(fleet: Fleet, name: str) -> None:
    await fleet.enroll(EnrollSpec(name=name, bmc_url=f"fake://{name}", username="u", password="p"))


async def transitions(fleet: Fleet, name: str) -> list[tuple[str, str]]:
    return [
        (str(e.data["from_state"]), str(e.data["to_state"]))
        for e in await fleet.events.since(0)
        if e.kind == "node.transition" and e.node == name
    ]


@pytest.mark.timeout(30)
async def test_an_enrolled_step_leaves_a_node_that_provisioning_took_meanwhile(
    make_fleet: Callable[..., Fleet],
) -> None:
    fleet = make_fleet()
    await enrolled(fleet, "n0")
    stale = await fleet.nodes.record("n0")
    assert stale.state == NodeState.ENROLLED
    # Between the step's read and its move: a bring-up with an image begins.
    await set_fields(fleet, "n0", state=NodeState.PROVISIONING, state_reason="queued")
    before = await transitions(fleet, "n0")

    assert await fleet.lifecycle._step(stale) is False

    node = await fleet.nodes.record("n0")
    assert node.state == NodeState.PROVISIONING and node.state_reason == "queued"
    assert await transitions(fleet, "n0") == before


@pytest.mark.timeout(30)
async def test_a_testing_step_without_a_suite_leaves_a_node_that_became_ready(
    make_fleet: Callable[..., Fleet],
) -> None:
    fleet = make_fleet()  # no check suite
    await enrolled(fleet, "t0")
    await set_fields(fleet, "t0", state=NodeState.TESTING, state_reason="intake checks")
    stale = await fleet.nodes.record("t0")
    # The check run ended meanwhile and the node went on to ready.
    await set_fields(fleet, "t0", state=NodeState.READY, state_reason="checks passed")

    assert await fleet.lifecycle._step(stale) is False

    node = await fleet.nodes.record("t0")
    assert node.state == NodeState.READY and node.state_reason == "checks passed"


@pytest.mark.timeout(30)
async def test_a_testing_step_without_a_suite_still_moves_a_node_that_is_testing(
    make_fleet: Callable[..., Fleet],
) -> None:
    fleet = make_fleet()
    await enrolled(fleet, "t1")
    await set_fields(fleet, "t1", state=NodeState.TESTING, state_reason="intake checks")
    row = await fleet.nodes.record("t1")

    await fleet.lifecycle._step(row)

    assert ("testing", "preparing") in await transitions(fleet, "t1")
