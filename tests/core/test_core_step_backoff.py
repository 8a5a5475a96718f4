"""Reconcile by change: idle nodes are not read, a failing node waits longer
after each failure, and a change that may unblock it clears the wait."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
from core_builders import set_fields
from core_fakes import FakeBmc

from controller.core.fleet import Fleet
from controller.core.lifecycle import StepBackoff
from controller.core.model import EnrollSpec
from controller.core.states import NodeState


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def enroll(fleet: Fleet, name: str) -> None:
    await fleet.enroll(EnrollSpec(name=name, bmc_url=f"fake://{name}", username="u", password="p"))


async def tries(fleet: Fleet, bmc: FakeBmc, clock: FakeClock, node: str, seconds: int) -> list[int]:
    """One lifecycle pass per simulated second; the seconds at which the
    node's BMC was tried."""
    tried = []
    start = clock.now
    for second in range(seconds):
        clock.now = start + second
        before = sum(1 for n, _ in bmc.calls if n == node)
        await fleet.lifecycle.reconcile_once()
        await fleet.lifecycle.settle()
        if sum(1 for n, _ in bmc.calls if n == node) > before:
            tried.append(second)
    return tried


def gaps(seconds: list[int]) -> list[int]:
    return [b - a for a, b in itertools.pairwise(seconds)]


@pytest.mark.timeout(60)
async def test_an_unreachable_bmc_is_retried_with_growing_delays(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc
) -> None:
    fleet = make_fleet()
    clock = FakeClock()
    fleet.lifecycle.clock = clock
    fleet.lifecycle.step_backoff = StepBackoff(first_delay_s=1, max_delay_s=16, jitter=0)
    bmc.unreachable.add("dead")
    await enroll(fleet, "dead")
    tried = await tries(fleet, bmc, clock, "dead", 80)
    assert gaps(tried)[:5] == [1, 2, 4, 8, 16]
    assert all(g == 16 for g in gaps(tried)[5:])  # capped
    node = await fleet.get_node("dead")
    assert node.state == NodeState.INSPECTING and "no route" in node.state_reason
    # The BMC is fixed and an operator acts: the wait is forgotten at once.
    bmc.unreachable.discard("dead")
    fleet.lifecycle.poke("dead")
    assert fleet.lifecycle.waiting("dead") == 0.0
    assert await tries(fleet, bmc, clock, "dead", 1) == [0]


@pytest.mark.timeout(60)
async def test_a_node_waiting_for_its_agent_is_not_polled_every_pass(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc
) -> None:
    fleet = make_fleet()
    clock = FakeClock()
    fleet.lifecycle.clock = clock
    fleet.lifecycle.idle_backoff = StepBackoff(first_delay_s=1, max_delay_s=8, jitter=0)
    fleet.lifecycle.agent_wait = StepBackoff(max_delay_s=8, jitter=0)
    bmc.power["quiet"] = "on"
    await enroll(fleet, "quiet")
    tried = await tries(fleet, bmc, clock, "quiet", 40)
    assert len(tried) <= 8  # 40 passes, at most every 8 s once backed off
    assert "waiting for the node's agent" in (await fleet.get_node("quiet")).state_reason


@pytest.mark.timeout(60)
async def test_waiting_for_an_agent_backs_off_past_the_failure_cap_and_writes_once(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc
) -> None:
    """An agent's registration pokes its node, so a node waiting for one is
    looked at (its power read through its BMC) once its BMC says on only at
    the agent wait's cap, beyond the failure backoff's; its reason is written
    once, not at every look."""
    fleet = make_fleet()
    clock = FakeClock()
    fleet.lifecycle.clock = clock
    fleet.lifecycle.step_backoff = StepBackoff(first_delay_s=1, max_delay_s=4, jitter=0)
    fleet.lifecycle.idle_backoff = StepBackoff(first_delay_s=1, max_delay_s=32, jitter=0)
    fleet.lifecycle.agent_wait = StepBackoff(max_delay_s=32, jitter=0)
    bmc.power["quiet"] = "on"
    await enroll(fleet, "quiet")
    await fleet.lifecycle.reconcile_once()
    await fleet.lifecycle.settle()
    events = len(await fleet.events.since(0, node="quiet"))
    tried = await tries(fleet, bmc, clock, "quiet", 130)
    assert gaps(tried)[-2:] == [32, 32], tried  # the idle cap, not the failure cap of 4
    assert len(await fleet.events.since(0, node="quiet")) == events  # no rewrite, no event
    node = await fleet.get_node("quiet")
    assert node.state_reason == "powered on; waiting for the node's agent to register"


@pytest.mark.timeout(60)
async def test_the_jitter_spreads_retries_within_bounds() -> None:
    policy = StepBackoff(first_delay_s=2, max_delay_s=60, jitter=0.5)
    rng = random.Random(3)
    delays = [policy.delay(3, rng) for _ in range(200)]  # base 8 s
    assert all(4.0 <= d <= 8.0 for d in delays)
    assert max(delays) - min(delays) > 2.0
    assert all(30.0 <= policy.delay(20, rng) <= 60.0 for _ in range(50))


@pytest.mark.timeout(60)
async def test_a_pass_looks_only_at_nodes_that_may_be_due(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes in a state that calls for no step, and nodes waiting out a
    backoff, cost a pass nothing: it looks at the nodes saved since the last
    pass, those whose wait ended and those whose step finished."""
    fleet = make_fleet()
    clock = FakeClock()
    lifecycle = fleet.lifecycle
    lifecycle.clock = clock
    lifecycle.idle_backoff = StepBackoff(first_delay_s=8, max_delay_s=8, jitter=0)
    lifecycle.agent_wait = StepBackoff(max_delay_s=8, jitter=0)
    names = [f"n{i:02d}" for i in range(40)]
    for name in names:
        bmc.power[name] = "on"
        await enroll(fleet, name)
    parked = names[20:]
    for name in parked:  # out of service: no step is due
        await set_fields(fleet, name, state=NodeState.MAINTENANCE)

    async def never() -> None:
        raise AssertionError("a pass read every node")

    monkeypatch.setattr(fleet.nodes, "records", never)

    async def one_pass() -> tuple[int, int]:
        """(nodes the pass looked at, BMC calls its steps made)."""
        looked, calls = lifecycle.looked, len(bmc.calls)
        await lifecycle.reconcile_once()
        await lifecycle.settle()
        return lifecycle.looked - looked, len(bmc.calls) - calls

    looked, calls = await one_pass()  # the first: every node, as enrolment poked each
    assert looked == 40 and calls >= 20
    assert {n for n, _ in bmc.calls} == set(names[:20])
    # Their steps found no agent and backed off for 8 s; the next pass looks
    # at them once (their steps ended), then none is looked at until then.
    assert (await one_pass())[1] == 0
    for _ in range(7):
        clock.now += 1
        assert await one_pass() == (0, 0)
    clock.now += 1  # their waits end
    looked, calls = await one_pass()
    assert looked == 20 and calls >= 20
    assert await one_pass() == (20, 0)  # their steps ended: they wait again
    # A node saved (an operator acts on a parked node) is looked at at once.
    await set_fields(fleet, parked[0], state=NodeState.ENROLLED)
    looked, calls = await one_pass()
    assert looked == 1 and calls >= 1
    assert await one_pass() == (1, 0)  # its step ended: it waits
    clock.now += 1
    assert await one_pass() == (0, 0)
    assert (await fleet.get_node(parked[0])).state == NodeState.INSPECTING
    assert lifecycle.waiting(parked[0]) > 0


@pytest.mark.timeout(60)
async def test_power_sync_writes_only_what_changed(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc
) -> None:
    fleet = make_fleet()
    for name in ("p1", "p2", "p3"):
        await enroll(fleet, name)
        bmc.power[name] = "on"
    await fleet.power_sync.run_once()
    assert fleet.power_sync.rows_written == 3  # first sighting of each
    await fleet.power_sync.run_once()
    assert fleet.power_sync.rows_written == 0  # nothing changed: nothing written
    bmc.power["p2"] = "off"
    await fleet.power_sync.run_once()
    assert fleet.power_sync.rows_written == 1
    assert (await fleet.get_node("p2")).power.value == "off"


@pytest.mark.timeout(60)
async def test_a_power_sync_pass_hands_the_database_only_the_readings_that_changed(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The readings are sorted out against the view on the loop: at 25,000
    nodes the transaction had looked at every node in one piece each pass."""
    fleet = make_fleet()
    for name in ("p1", "p2", "p3"):
        await enroll(fleet, name)
        bmc.power[name] = "on"
    await fleet.power_sync.run_once()
    handed: list[list[str]] = []
    apply = fleet.power_sync._apply

    def counted(tx: Any, polled: dict[str, Any]) -> Any:
        handed.append(sorted(polled))
        return apply(tx, polled)

    monkeypatch.setattr(fleet.power_sync, "_apply", counted)
    await fleet.power_sync.run_once()
    assert handed == [], "nothing changed: no transaction"
    bmc.power["p2"] = "off"
    await fleet.power_sync.run_once()
    assert handed == [["p2"]]
    assert fleet.power_sync.rows_written == 1
    assert (await fleet.get_node("p2")).power.value == "off"


@pytest.mark.timeout(60)
async def test_repeated_failures_warn_at_growing_intervals(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = make_fleet()
    clock = FakeClock()
    fleet.lifecycle.clock = clock
    fleet.lifecycle.step_backoff = StepBackoff(first_delay_s=1, max_delay_s=1, jitter=0)
    bmc.unreachable.add("noisy")
    await enroll(fleet, "noisy")
    caplog.set_level("WARNING", logger="controller.core.lifecycle")
    tried = await tries(fleet, bmc, clock, "noisy", 40)
    warned = [r for r in caplog.records if "noisy" in r.getMessage()]
    assert len(tried) >= 19  # retried every second or two...
    assert len(warned) <= 6  # ...warned at the 1st, 2nd, 4th, 8th, 16th, 32nd failure


@pytest.mark.timeout(60)
async def test_the_failed_steps_of_a_pass_share_one_warning(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc, caplog: pytest.LogCaptureFixture
) -> None:
    """A rack's BMC network down: one line for its nodes, not one each; a
    single node keeps its own line."""
    fleet = make_fleet()
    clock = FakeClock()
    fleet.lifecycle.clock = clock
    dead = [f"dead-{i:02d}" for i in range(18)]
    for name in dead:
        bmc.unreachable.add(name)
        await enroll(fleet, name)
    caplog.set_level("WARNING", logger="controller.core.lifecycle")
    await fleet.lifecycle.reconcile_once()
    await fleet.lifecycle.settle()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("lifecycle steps of 18 nodes failed")
    assert "(step 1 failed; next in" in line and line.endswith(", ...")
    assert sum(name in line for name in dead) == 11  # the first and ten more

    caplog.clear()
    bmc.unreachable.add("alone")
    await enroll(fleet, "alone")
    await fleet.lifecycle.reconcile_once()  # the others wait out their backoff
    await fleet.lifecycle.settle()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("node alone: ") and "(step 1 failed; next in" in line


@pytest.mark.timeout(60)
async def test_a_poke_while_a_step_runs_is_not_lost(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's agent registers while a step that looked before it is
    still running: that step's "waiting for the agent" must not back the
    node off, or it waits out a delay (up to a minute) with its agent there."""
    fleet = make_fleet()
    clock = FakeClock()
    fleet.lifecycle.clock = clock
    await enroll(fleet, "n1")
    entered, release = asyncio.Event(), asyncio.Event()
    answer = bmc.power_state

    async def held(target: object) -> str:
        entered.set()
        await release.wait()
        return await answer(target)  # type: ignore[arg-type]

    monkeypatch.setattr(bmc, "power_state", held)
    await fleet.lifecycle.reconcile_once()
    await asyncio.wait_for(entered.wait(), 10)
    fleet.lifecycle.poke("n1")  # as its agent's registration does
    release.set()
    await fleet.lifecycle.settle()
    assert (await fleet.get_node("n1")).state == NodeState.INSPECTING  # still no agent here
    assert fleet.lifecycle.waiting("n1") == 0.0  # but not backed off: looked at next pass


@pytest.mark.timeout(60)
async def test_a_node_waiting_for_its_agent_is_powered_on_again_when_power_sync_sees_it_off(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc
) -> None:
    """Once its BMC says on, a node waiting for its agent waits the idle cap:
    what ends the wait is its agent registering (a poke) or power sync
    reading it off (a saved row), not a look every few seconds."""
    fleet = make_fleet()
    clock = FakeClock()
    fleet.lifecycle.clock = clock
    fleet.lifecycle.idle_backoff = StepBackoff(first_delay_s=1, max_delay_s=8, jitter=0)
    fleet.lifecycle.agent_wait = StepBackoff(max_delay_s=300, jitter=0)
    await enroll(fleet, "n1")  # its BMC says off: the first look powers it on
    tried = await tries(fleet, bmc, clock, "n1", 60)
    assert tried[:2] == [0, 1] and len(tried) == 2, tried  # then on: the cap at once
    assert bmc.power["n1"] == "on"
    assert 200 < fleet.lifecycle.waiting("n1") <= 300
    bmc.power["n1"] = "off"  # lost power behind Kiln's back
    await fleet.power_sync.run_once()
    await tries(fleet, bmc, clock, "n1", 2)
    assert bmc.power["n1"] == "on"
    assert ("n1", "on") in bmc.calls[-3:]


@pytest.mark.timeout(60)
async def test_a_backoff_after_thousands_of_failures_stays_at_its_cap() -> None:
    """A BMC dead for days fails thousands of steps in a row: 2**(n-1) must
    not overflow a float (it did past about 1,025)."""
    policy = StepBackoff(first_delay_s=1, max_delay_s=60, jitter=0.5)
    rng = random.Random(5)
    assert all(30.0 <= policy.delay(n, rng) <= 60.0 for n in (1_100, 5_000, 10**6))
