"""Queue semantics of ``schedule``: order, quotas with borrowing, holds."""

from __future__ import annotations

from placement_fleet import fleet, hold_nodes, rack_nodes

from controller.placement import Level, QueueConfig, Request, Usage, schedule


def test_priority_then_fifo() -> None:
    topo = fleet().nvl72_racks(1).build()
    reqs = [
        Request("late-low", nodes=10, submitted=1),
        Request("early-low", nodes=10, submitted=0),
        Request("high", nodes=8, priority=5, submitted=9),
    ]
    res = schedule(topo, Usage(topo), reqs)
    assert set(res.admitted) == {"high", "early-low"}
    assert set(res.waiting) == {"late-low"}
    assert res.usage is not None and len(res.usage) == 2


def test_permanent_refusals_are_rejected_not_waiting() -> None:
    topo = fleet().nvl72_racks(1).build()
    res = schedule(
        topo,
        Usage(topo),
        [Request("huge", nodes=40), Request("bad", nodes=3, racks=1), Request("ok", nodes=1)],
    )
    assert set(res.rejected) == {"huge", "bad"}
    assert set(res.admitted) == {"ok"}
    assert not res.held


def test_quota_caps_a_queue() -> None:
    topo = fleet().hgx(4).build()
    queues = [QueueConfig("a", gpu_quota=16), QueueConfig("b", gpu_quota=16)]
    reqs = [Request(f"a{i}", nodes=1, queue="a", submitted=i) for i in range(3)]
    res = schedule(topo, Usage(topo), reqs, queues)
    assert set(res.admitted) == {"a0", "a1"}
    assert "quota" in res.waiting["a2"]


def test_borrowing_from_unused_quota() -> None:
    topo = fleet().hgx(4).build()
    queues = [QueueConfig("a", gpu_quota=16, borrowing_limit=8), QueueConfig("b", gpu_quota=16)]
    reqs = [Request(f"a{i}", nodes=1, queue="a", submitted=i) for i in range(4)]
    res = schedule(topo, Usage(topo), reqs, queues)
    assert set(res.admitted) == {"a0", "a1", "a2"}  # 24 GPUs = quota 16 + borrowed 8
    assert "a3" in res.waiting


def test_borrowing_needs_lendable_quota() -> None:
    topo = fleet().hgx(4).build()
    queues = [QueueConfig("a", gpu_quota=8, borrowing_limit=16), QueueConfig("b", gpu_quota=8)]
    usage = hold_nodes(Usage(topo), "b-job", ["hgx-h200-004"], topo)
    usage = usage.without("b-job")
    # b holds nothing: a may borrow b's 8 unused GPUs, not more.
    res = schedule(
        topo, usage, [Request(f"a{i}", nodes=1, queue="a", submitted=i) for i in range(3)], queues
    )
    assert set(res.admitted) == {"a0", "a1"}
    assert "borrow" in res.waiting["a2"]


def test_request_larger_than_quota_plus_limit_is_rejected() -> None:
    topo = fleet().hgx(4).build()
    res = schedule(
        topo, Usage(topo), [Request("big", nodes=3, queue="a")], [QueueConfig("a", gpu_quota=8)]
    )
    assert "big" in res.rejected


def test_unknown_queue_rejected_when_queues_configured() -> None:
    topo = fleet().hgx(1).build()
    res = schedule(topo, Usage(topo), [Request("x", nodes=1, queue="nope")], [QueueConfig("a")])
    assert "x" in res.rejected


def test_head_of_queue_holds_nodes_against_small_requests() -> None:
    topo = fleet().nvl72_racks(1).build()
    usage = hold_nodes(Usage(topo), "running", rack_nodes(1, range(1, 5)), topo)
    big = Request("big", nodes=18, level=Level.NVLINK, priority=10)
    small = [Request(f"s{i}", nodes=1, submitted=i) for i in range(5)]
    res = schedule(topo, usage, [big, *small])
    assert "big" in res.waiting
    assert set(res.held["big"]) == set(rack_nodes(1, range(5, 19)))
    assert not res.admitted  # every free node is held for the head
    # Once the running job ends, the head starts.
    res2 = schedule(topo, usage.without("running"), [big, *small])
    assert "big" in res2.admitted


def test_hold_leaves_unrelated_capacity_to_small_requests() -> None:
    topo = fleet().nvl72_racks(2).hgx(2).build()
    usage = hold_nodes(Usage(topo), "running", rack_nodes(1, [1]) + rack_nodes(2, [1, 2]), topo)
    big = Request("big", racks=1, priority=10)
    small = [Request(f"s{i}", nodes=1, submitted=i) for i in range(3)]
    res = schedule(topo, usage, [big, *small])
    held = set(res.held["big"])
    assert held == set(rack_nodes(1, range(2, 19)))  # the rack closest to whole
    admitted = {n for p in res.admitted.values() for n in p.nodes}
    assert len(res.admitted) == 3
    assert not admitted & held


def test_resubmitted_key_is_not_booked_twice() -> None:
    topo = fleet().hgx(2).build()
    res = schedule(topo, Usage(topo), [Request("a", nodes=1)])
    assert res.usage is not None
    again = schedule(topo, res.usage, [Request("a", nodes=1)])
    assert again.admitted["a"].nodes == res.admitted["a"].nodes
    assert again.usage is not None and len(again.usage) == 1


def test_duplicate_keys_in_one_cycle() -> None:
    topo = fleet().hgx(2).build()
    res = schedule(topo, Usage(topo), [Request("a", nodes=1), Request("a", nodes=1, submitted=1)])
    assert "a" in res.admitted and "a" in res.rejected
