"""The blast radius through the core, on both stores: what the policies took
down is recorded as ``policy.action`` events, and a Fleet built again on the
same store (a restarted controller, or a standby taking over) counts it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from core_builders import Racks, reconcile, spec
from core_fakes import FakeBmc

from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.kinds import EventKind
from controller.core.model import EventInfo
from controller.core.ports import Tx
from controller.core.records import NewEvent
from controller.core.states import NodeState
from controller.policies import load_rules

# Two rules of different kinds; neither rule's own caps would stop a third
# tray, only the budget they share.
RULES = load_rules(
    """
version: v1
blast_radius: {per_rack: 2, fleet: 10, window: 10m}
rules:
  - name: shutdown-heat
    when: {metric: gpu_temp_c, op: ">=", value: 94}
    for_samples: 2
    actions: [notify_job, {power_off: now}]
  - name: fatal-xid
    when: {metric: xid, in: [79]}
    actions: [notify_job, quarantine]
"""
)

HEAT = HealthReport(gpus=(GpuHealth(index=0, temp_c=95.0, slowdown_c=89.0, shutdown_c=92.0),))
XID_79 = HealthReport(gpus=(GpuHealth(index=0, temp_c=50.0, xids=(79,)),))


async def actions_of(fleet: Fleet, node: str) -> list[EventInfo]:
    return [e for e in await fleet.events.since(0, node=node) if e.kind == "policy.action"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("restart", ["start", "first-report"])
async def test_a_fleet_built_again_on_the_store_still_holds_back(
    make_fleet: Callable[..., Fleet], bmc: FakeBmc, restart: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        before = make_fleet(rules=RULES)
        racks = Racks(before, stack)
        await racks.add(["t1", "t2", "t3"], rack="r1")
        await racks.add(["u1"], rack="r2")
        for node in ("t1", "t2"):
            for _ in range(2):
                await before.agent_health(node, HEAT)
        await before.policies.settle()
        assert bmc.power["t1"] == bmc.power["t2"] == "off"
        await before.stop()

        # The controller is gone; another one comes up on the same store.
        after = make_fleet(rules=RULES)
        if restart == "start":
            await after.start()  # restores before any loop or report runs
            stack.push_async_callback(after.stop)
        await after.agent_health("t3", XID_79)
        await after.agent_health("u1", XID_79)  # another rack: its own budget
        await after.policies.settle()
        await reconcile(after, passes=2)

        t3 = await actions_of(after, "t3")
        assert [e.data["action"] for e in t3] == ["notify_job", "quarantine"]
        held = t3[1].data
        assert held["suppressed"] == (
            "cap: all rules together already took down 2 node(s) in rack r1 "
            "within 600s (blast_radius per_rack=2)"
        )
        assert held["outcome"].startswith("held back")
        assert (await after.get_node("t3")).state == NodeState.READY
        assert (await after.get_node("u1")).state == NodeState.QUARANTINED
        assert bmc.power["t3"] == "on"


@pytest.mark.timeout(60)
async def test_held_back_actions_are_not_counted_after_a_restart(
    make_fleet: Callable[..., Fleet],
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        before = make_fleet(rules=RULES)
        racks = Racks(before, stack)
        await racks.add(["t1", "t2", "t3", "t4"], rack="r1")
        for node in ("t1", "t2", "t3"):
            await before.agent_health(node, XID_79)
        await before.policies.settle()
        assert (await actions_of(before, "t3"))[1].data["suppressed"]
        await before.stop()

        after = make_fleet(rules=RULES)
        await after.agent_health("t4", XID_79)
        await after.policies.settle()
        # t1 and t2 were taken down and still count; t3 was only held back,
        # so it is not counted as a third.
        t4 = await actions_of(after, "t4")
        assert t4[1].data["suppressed"] == (
            "cap: all rules together already took down 2 node(s) in rack r1 "
            "within 600s (blast_radius per_rack=2)"
        )


@pytest.mark.timeout(30)
async def test_recent_events_are_of_one_kind_and_inside_the_window(
    make_fleet: Callable[..., Fleet],
) -> None:
    fleet = make_fleet(rules=RULES)
    await fleet.enroll(spec("n1", "r1"))
    await fleet.drain("n1", "by hand")

    def add(tx: Tx) -> None:
        for at in (100.0, 200.0, 300.0):
            tx.events.add(NewEvent(at=at, kind=EventKind.POLICY_ACTION, node="n1"))

    await fleet.store.tx(add)
    recent = await fleet.store.read(lambda tx: tx.events.recent(EventKind.POLICY_ACTION, 200.0))
    assert [(e.kind, e.at) for e in recent] == [("policy.action", 200.0), ("policy.action", 300.0)]
    everything = await fleet.store.read(lambda tx: tx.events.recent(EventKind.POLICY_ACTION, 0))
    assert len(everything) == 3, "node.enrolled and node.transition are other kinds"
