"""The outbox relay against a real Mosquitto broker started by the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiomqtt
import pytest

from controller.events import Event, MemoryOutbox, MqttPublisher
from controller.sim.mosquitto import Mosquitto

FAST = {"retry_backoff": (0.05, 0.2), "poll_interval": 0.05}


class Subscriber:
    """Collects every message under ``kiln/v1/#``."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, Event]] = []
        self.arrived = asyncio.Event()

    def on(self, topic: str) -> list[int]:
        return [e.seq for t, e in self.messages if t == topic]

    async def wait_for(self, topic: str, count: int, within: float = 10.0) -> list[int]:
        async with asyncio.timeout(within):
            while len(self.on(topic)) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.on(topic)


@contextlib.asynccontextmanager
async def subscribed(broker: Mosquitto) -> AsyncIterator[Subscriber]:
    sub = Subscriber()
    async with aiomqtt.Client(broker.host, broker.port, identifier="test-sub") as client:
        await client.subscribe("kiln/v1/#", qos=1)

        async def collect() -> None:
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                sub.messages.append((str(message.topic), Event.from_json(message.payload)))
                sub.arrived.set()

        task = asyncio.create_task(collect())
        try:
            yield sub
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await task


@contextlib.asynccontextmanager
async def relaying(publisher: MqttPublisher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(publisher.run())
    try:
        yield task
    finally:
        await publisher.stop()
        await asyncio.wait_for(task, timeout=5)


class GatedOutbox(MemoryOutbox):
    """A MemoryOutbox whose readers wait while ``gate`` is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def unpublished(self, limit: int) -> list[Event]:
        await self.gate.wait()
        return await super().unpublished(limit)


@pytest.fixture
async def broker() -> AsyncIterator[Mosquitto]:
    async with Mosquitto() as b:
        yield b


async def test_events_reach_documented_topics_in_order(broker: Mosquitto) -> None:
    outbox = MemoryOutbox()
    await outbox.append("node.transition", node="r1n1", reason="ready", data={"to": "ready"})
    await outbox.append("allocation.created", allocation="a/1", data={"nodes": ["r1n1"]})
    await outbox.append("policy.action", node="r1n2", rule="gpu-hot", reason="hot")
    for i in range(20):
        await outbox.append("node.power", node="r1n1", data={"i": i})
    async with subscribed(broker) as sub:
        publisher = MqttPublisher(outbox, broker.host, broker.port, client_id="kiln-test", **FAST)
        async with relaying(publisher):
            assert await sub.wait_for("kiln/v1/events", 23) == list(range(1, 24))
            assert await sub.wait_for("kiln/v1/nodes/r1n1/events", 21) == [1, *range(4, 24)]
            assert await sub.wait_for("kiln/v1/allocations/a%2F1/events", 1) == [2]
            assert await sub.wait_for("kiln/v1/nodes/r1n2/events", 1) == [3]
            assert await sub.wait_for("kiln/v1/rules/gpu-hot/events", 1) == [3]
    first = next(e for t, e in sub.messages if t == "kiln/v1/events")
    assert first == (await outbox.since(0))[0]
    assert first.data == {"to": "ready"}
    assert await outbox.unpublished(100) == []
    assert publisher.published == 23
    # Raw payloads are the documented JSON object, nothing more.
    assert set(json.loads(first.to_json())) == {
        "seq",
        "at",
        "kind",
        "node",
        "allocation",
        "rule",
        "reason",
        "data",
    }


async def test_notify_wakes_the_relay(broker: Mosquitto) -> None:
    outbox = MemoryOutbox()
    publisher = MqttPublisher(
        outbox, broker.host, broker.port, client_id="kiln-test", poll_interval=60.0
    )
    async with subscribed(broker) as sub, relaying(publisher):
        await publisher.wait_connected()
        await asyncio.sleep(0.1)  # the relay is now idle in its 60s poll
        await outbox.append("node.drift", node="n1")
        publisher.notify()
        assert await sub.wait_for("kiln/v1/events", 1, within=5) == [1]


async def test_broker_outage_loses_nothing(broker: Mosquitto) -> None:
    outbox = GatedOutbox()
    publisher = MqttPublisher(outbox, broker.host, broker.port, client_id="kiln-test", **FAST)
    async with relaying(publisher):
        async with subscribed(broker) as sub:
            for i in range(5):
                await outbox.append("node.transition", node=f"n{i}")
            assert await sub.wait_for("kiln/v1/events", 5) == [1, 2, 3, 4, 5]

        await broker.stop()
        for i in range(5, 40):
            await outbox.append("node.transition", node=f"n{i}")
        await asyncio.sleep(0.5)  # several failed reconnects
        assert not publisher.connected
        assert [e.seq for e in await outbox.unpublished(100)] == list(range(6, 41))

        # Hold the relay until a subscriber is listening on the restarted broker.
        outbox.gate.clear()
        await broker.start()
        async with subscribed(broker) as sub:
            outbox.gate.set()
            assert await sub.wait_for("kiln/v1/events", 35) == list(range(6, 41))
    assert await outbox.unpublished(100) == []
    assert outbox.published_count == 40


async def test_relay_started_before_broker_delivers_once_it_is_up() -> None:
    broker = Mosquitto()
    outbox = GatedOutbox()
    await outbox.append("allocation.waiting", allocation="a1")
    publisher = MqttPublisher(outbox, broker.host, broker.port, client_id="kiln-test", **FAST)
    try:
        async with relaying(publisher):
            await asyncio.sleep(0.3)
            assert not publisher.connected
            assert outbox.published_count == 0
            outbox.gate.clear()
            await broker.start()
            async with subscribed(broker) as sub:
                outbox.gate.set()
                assert await sub.wait_for("kiln/v1/allocations/a1/events", 1) == [1]
    finally:
        await broker.close()


async def test_stop_is_idempotent_and_ends_run(broker: Mosquitto) -> None:
    publisher = MqttPublisher(MemoryOutbox(), broker.host, broker.port, client_id="kiln-test")
    task = asyncio.create_task(publisher.run())
    await publisher.wait_connected()
    await publisher.stop()
    await publisher.stop()
    await asyncio.wait_for(task, timeout=2)
    assert task.done() and not publisher.connected


def test_qos_zero_rejected() -> None:
    with pytest.raises(ValueError, match="qos 1 or 2"):
        MqttPublisher(MemoryOutbox(), "127.0.0.1", 1, client_id="x", qos=0)
