"""The latest health lives in memory and is written behind, in batches.

Against both stores (the in-memory fake and SQLite): a report is visible at
once and in the store only after a flush; a flush writes in batches; a
sighting keeps the stored report; a failed flush keeps its samples for the
next; a controller restarted after a flush sees what was flushed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from controller.core.fleet import Fleet
from controller.core.health import GpuHealth, HealthReport
from controller.core.live import LiveHealth
from controller.core.model import EnrollSpec
from controller.core.ports import Store, Tx

T = TypeVar("T")


def report(at: float, temp: float = 40.0) -> HealthReport:
    return HealthReport(sampled_at=at, gpus=(GpuHealth(index=0, temp_c=temp),))


async def enrolled(fleet: Fleet, count: int) -> list[str]:
    names = [f"n{i}" for i in range(count)]
    for i, name in enumerate(names):
        await fleet.enroll(
            EnrollSpec(
                name=name,
                bmc_url=f"fake://bmc-{i}",
                username="admin",
                password="pw",
                rack="r1",
            )
        )
    return names


async def stored_health(store: Store, name: str) -> HealthReport | None:
    node = await store.read(lambda tx: tx.nodes.get(name))
    assert node is not None
    return node.health


class CountingStore:
    """A store that counts transactions and can fail the next ones."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.transactions = 0
        self.fail = 0

    async def tx(self, fn: Callable[[Tx], T]) -> T:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the database went away")
        self.transactions += 1
        return await self.inner.tx(fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.timeout(60)
async def test_a_report_is_visible_at_once_and_stored_after_a_flush(
    make_fleet: Callable[..., Fleet], store: Store
) -> None:
    fleet = make_fleet()
    [name] = await enrolled(fleet, 1)
    assert await fleet.nodes.agent_health(name, report(100.0, 71.0)) == "r1"
    shown = await fleet.get_node(name)
    assert shown.health is not None and shown.health.gpus[0].temp_c == 71.0
    assert await stored_health(store, name) is None  # not yet written
    assert fleet.live.pending == 1
    assert await fleet.live.flush() == 1
    stored = await stored_health(store, name)
    assert stored is not None and stored.sampled_at == 100.0
    # A restarted controller (a new Fleet on the same store) sees it.
    again = make_fleet()
    assert (await again.get_node(name)).health == stored
    assert (await again.get_node(name)).agent_last_seen > 0


@pytest.mark.timeout(60)
async def test_flushes_write_in_batches_and_keep_what_failed(
    make_fleet: Callable[..., Fleet], store: Store
) -> None:
    fleet = make_fleet()
    names = await enrolled(fleet, 5)
    counting = CountingStore(store)
    live = LiveHealth(counting, batch=2)  # type: ignore[arg-type]
    for i, name in enumerate(names):
        live.note(name, report(200.0 + i))
    counting.fail = 1
    assert await live.flush() == 0  # the first batch failed: nothing lost
    assert live.pending == 5
    assert await live.flush() == 5
    assert counting.transactions == 3  # 2 + 2 + 1
    for i, name in enumerate(names):
        stored = await stored_health(store, name)
        assert stored is not None and stored.sampled_at == 200.0 + i
    # Unknown nodes are skipped, not an error.
    live.note("ghost", report(300.0))
    assert await live.flush() == 0


class ReportingStore(CountingStore):
    """A store during whose first write another report lands."""

    def __init__(self, inner: Store, live: Callable[[], LiveHealth], node: str) -> None:
        super().__init__(inner)
        self._live = live
        self._node = node

    async def tx(self, fn: Callable[[Tx], T]) -> T:
        if self.transactions == 0:
            self._live().note(self._node, report(500.0, 88.0))
        return await super().tx(fn)


@pytest.mark.timeout(60)
async def test_a_flush_writes_what_was_waiting_when_it_began(
    make_fleet: Callable[..., Fleet], store: Store
) -> None:
    """A report that lands while a flush writes waits for the next flush: a
    flush does not chase the reports that come in meanwhile."""
    fleet = make_fleet()
    first, second = await enrolled(fleet, 2)
    live: LiveHealth | None = None
    counting = ReportingStore(store, lambda: live, second)  # type: ignore[arg-type,return-value]
    live = LiveHealth(counting, batch=10)  # type: ignore[arg-type]
    live.note(first, report(400.0))
    assert await live.flush() == 1
    assert counting.transactions == 1, "one write: the report that came during it waits"
    assert live.pending == 1
    assert await stored_health(store, second) is None
    assert await live.flush() == 1
    stored = await stored_health(store, second)
    assert stored is not None and stored.sampled_at == 500.0
    assert live.pending == 0


class BatchesStore(CountingStore):
    """A store that records the names of each health batch written."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.batches: list[list[str]] = []

    async def tx(self, fn: Callable[[Tx], T]) -> T:
        batches = self.batches

        class Nodes:
            def __init__(self, nodes: Any) -> None:
                self._nodes = nodes

            def save_health_batch(self, samples: Any) -> int:
                batches.append([s.node for s in samples])
                return int(self._nodes.save_health_batch(samples))

        class Spied:
            def __init__(self, tx: Tx) -> None:
                self.nodes = Nodes(tx.nodes)

        return await super().tx(lambda tx: fn(Spied(tx)))  # type: ignore[arg-type]


@pytest.mark.timeout(60)
async def test_a_flush_writes_neighbours_together(
    make_fleet: Callable[..., Fleet], store: Store
) -> None:
    """Reports come in any order; a flush writes them by name, so each batch
    holds nodes whose rows sit together (fewer pages a commit)."""
    fleet = make_fleet()
    names = await enrolled(fleet, 7)
    batches = BatchesStore(store)
    live = LiveHealth(batches, batch=3)  # type: ignore[arg-type]
    for i in (5, 0, 6, 2, 4, 1, 3):
        live.note(names[i], report(100.0 + i))
    assert await live.flush() == 7
    assert batches.batches == [sorted(names)[0:3], sorted(names)[3:6], sorted(names)[6:]]


@pytest.mark.timeout(60)
async def test_a_sighting_keeps_the_stored_report(
    make_fleet: Callable[..., Fleet], store: Store
) -> None:
    fleet = make_fleet()
    [name] = await enrolled(fleet, 1)
    await fleet.nodes.agent_health(name, report(100.0))
    await fleet.live.flush()
    restarted = LiveHealth(store)
    restarted.note(name, None, seen_at=555.0)  # a registration: no report yet
    await restarted.flush()
    node = await store.read(lambda tx: tx.nodes.get(name))
    assert node is not None
    assert node.agent_last_seen == 555.0
    assert node.health is not None and node.health.sampled_at == 100.0


@pytest.mark.timeout(60)
async def test_a_drift_report_records_its_event_at_once(
    make_fleet: Callable[..., Fleet], store: Store
) -> None:
    fleet = make_fleet()
    [name] = await enrolled(fleet, 1)
    drifted = HealthReport(sampled_at=100.0, drift=("GPU 0: clocks not locked",))
    await fleet.nodes.agent_health(name, drifted)
    events = await store.read(lambda tx: tx.events.since(0, limit=100))
    assert [e.kind for e in events if e.node == name][-1] == "node.gpu_drift"
    assert fleet.live.pending == 1  # the sample itself is still written behind


@pytest.mark.timeout(30)
async def test_a_report_for_an_unknown_node_is_dropped(make_fleet: Callable[..., Fleet]) -> None:
    fleet = make_fleet()
    assert await fleet.nodes.agent_health("nobody", report(1.0)) is None
    assert fleet.live.pending == 0


def eight_gpus(at: float) -> HealthReport:
    """A report shaped as an 8-GPU node's: numbers, strings and tuples of them."""
    gpus = tuple(
        GpuHealth(
            index=i,
            uuid=f"GPU-{i:08d}",
            temp_c=40.0 + i,
            power_w=300.5,
            sm_clock_mhz=1980,
            xids=(79,) if i == 3 else (),
            nvlink_down=(1, 2) if i == 5 else (),
            errors=("remapped rows: Not Supported",),
        )
        for i in range(8)
    )
    return HealthReport(sampled_at=at, gpus=gpus, bmc_temps_c=(30.0, 31.5), drift=("x",))


def typed_objects(objects: list[object]) -> int:
    return sum(1 for o in objects if isinstance(o, (GpuHealth, HealthReport)))


@pytest.mark.timeout(60)
def test_the_latest_reports_are_held_out_of_the_collectors_sight(store: Store) -> None:
    """Typed, each held 8-GPU report was 11 objects more for every young
    collection to walk; held packed (bytes), it is none: what stays tracked
    is each node's history of (time, temperature) points."""
    import gc

    live = LiveHealth(store)
    nodes = [f"n{i}" for i in range(500)]
    for name in nodes:  # sightings: the nodes' entries, no report yet
        live.note(name, None, seen_at=1.0)
    gc.collect()
    before = len(gc.get_objects())
    typed_before = typed_objects(gc.get_objects())
    for name in nodes:
        live.note(name, eight_gpus(1.0))
        live.note(name, eight_gpus(2.0))  # the first one replaced
    gc.collect()
    gc.collect()
    tracked = (len(gc.get_objects()) - before) / len(nodes)
    # One: the node's history of (time, temperature) points, a deque.
    assert tracked < 1.5, f"{tracked:.1f} tracked objects a held report"
    assert typed_objects(gc.get_objects()) == typed_before  # none held typed
    assert live.health("n7") == eight_gpus(2.0)


@pytest.mark.timeout(30)
def test_a_report_reads_back_equal_with_a_version_that_moves_with_reports(
    store: Store,
) -> None:
    live = LiveHealth(store)
    assert live.version("n1") == 0 and live.health("n1") is None
    live.note("n1", None, seen_at=5.0)  # a sighting: no report, no version
    assert live.version("n1") == 0 and live.health("n1") is None and live.last_seen("n1") == 5.0
    sent = eight_gpus(10.0)
    live.note("n1", sent, seen_at=11.0)
    first = live.version("n1")
    assert first > 0
    read = live.health("n1")
    assert read == sent and read is not sent  # a typed copy, equal to what came
    assert live.version("n1") == first  # reading changes nothing
    live.note("n1", None, seen_at=12.0)  # a sighting keeps the report and its version
    assert live.version("n1") == first and live.health("n1") == sent
    assert live.last_seen("n1") == 12.0
    live.note("n1", eight_gpus(20.0))
    assert live.version("n1") > first and live.health("n1") == eight_gpus(20.0)
    live.seed("n2", eight_gpus(3.0), 4.0)  # from the store at start
    assert live.version("n2") > 0 and live.health("n2") == eight_gpus(3.0)
    live.seed("n1", eight_gpus(1.0), 1.0)  # what came since wins
    assert live.health("n1") == eight_gpus(20.0)
    live.forget("n1")
    assert live.version("n1") == 0 and live.health("n1") is None
