"""The outbox relay: publish stored events to MQTT, losing none.

:class:`MqttPublisher` reads unpublished events from an
:class:`~controller.events.outbox.EventOutbox` in ``seq`` order, publishes
each to its topics (:func:`~controller.events.topics.topics_for`) with QoS 1,
and marks an event published only after the broker acknowledged every one of
its publishes. While the broker is down events simply stay in the outbox; the
relay reconnects with exponential backoff and carries on from the oldest
unpublished event. Delivery is therefore at least once: after a broken
connection an event may be published again, and consumers de-duplicate by
``seq``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

import aiomqtt

from controller.core.errors import InvalidArgument
from controller.events.broker import BrokerAccess
from controller.events.model import Event
from controller.events.outbox import EventOutbox
from controller.events.topics import DEFAULT_PREFIX, topics_for

log = logging.getLogger(__name__)


class MqttPublisher:
    """Relay events from ``outbox`` to the MQTT broker at ``host:port``.

    ``retry_backoff`` is (first, longest) delay in seconds between connection
    attempts; the delay doubles after each failure. ``batch`` events are
    published concurrently (pipelined on one connection, so still in order);
    ``ack_timeout`` bounds the wait for the broker's acknowledgements.
    """

    def __init__(
        self,
        outbox: EventOutbox,
        host: str,
        port: int,
        *,
        prefix: str = DEFAULT_PREFIX,
        client_id: str,
        qos: int = 1,
        retry_backoff: tuple[float, float] = (0.5, 10.0),
        poll_interval: float = 1.0,
        batch: int = 100,
        ack_timeout: float = 5.0,
        access: BrokerAccess | None = None,
    ) -> None:
        if qos not in (1, 2):
            raise ValueError("the outbox relay needs acknowledged publishes: qos 1 or 2")
        self._outbox = outbox
        self._host = host
        self._port = port
        self._prefix = prefix
        self._client_id = client_id
        self._qos = qos
        self._backoff = retry_backoff
        self._poll_interval = poll_interval
        self._batch = batch
        self._ack_timeout = ack_timeout
        self._access = access or BrokerAccess()
        self._tls = self._access.tls.context() if self._access.tls is not None else None
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.published = 0

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def wait_connected(self) -> None:
        await self._connected.wait()

    def notify(self) -> None:
        """Tell the relay new events are in the outbox (it also polls)."""
        self._wake.set()

    async def run(self) -> None:
        """Relay until :meth:`stop`. Never raises for broker trouble; it retries."""
        self._task = asyncio.current_task()
        delay = self._backoff[0]
        while not self._stopping.is_set():
            try:
                async with aiomqtt.Client(
                    self._host,
                    self._port,
                    identifier=self._client_id,
                    timeout=self._ack_timeout,
                    username=self._access.username,
                    password=self._access.password,
                    tls_context=self._tls,
                ) as client:
                    client.pending_calls_threshold = self._batch * 4 + 10
                    self._connected.set()
                    log.info(
                        "publishing events to MQTT %s:%s (%s)",
                        self._host,
                        self._port,
                        self._access.summary,
                    )
                    delay = self._backoff[0]
                    await self._pump(client)
            except aiomqtt.MqttError as e:
                log.warning(
                    "MQTT %s:%s unavailable (%s); retrying in %ss", self._host, self._port, e, delay
                )
            finally:
                self._connected.clear()
            if self._stopping.is_set():
                break
            await self._sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def stop(self, grace: float = 2.0) -> None:
        """Stop the relay; waits up to ``grace`` seconds for the current batch.
        Idempotent. Events not yet acknowledged stay in the outbox."""
        self._stopping.set()
        self._wake.set()
        task = self._task
        if task is None or task.done() or task is asyncio.current_task():
            return
        done, _ = await asyncio.wait({task}, timeout=grace)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _pump(self, client: aiomqtt.Client) -> None:
        while not self._stopping.is_set():
            events = await self._outbox.unpublished(self._batch)
            if not events:
                await self._sleep(self._poll_interval)
                continue
            await self._publish_batch(client, events)

    async def _publish_batch(self, client: aiomqtt.Client, events: list[Event]) -> None:
        # Issue every publish at once: paho sends them in call order on one
        # connection, so the broker sees seq order; then wait for all acks.
        calls = [
            (event.seq, client.publish(topic, payload, qos=self._qos))
            for event in events
            for payload in (_payload(event),)
            for topic in topics_for(event, self._prefix)
        ]
        results = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        failed = {
            seq for (seq, _), r in zip(calls, results, strict=True) if isinstance(r, BaseException)
        }
        # Only the prefix before the first failure is surely delivered in order.
        acked = []
        for event in events:
            if event.seq in failed:
                break
            acked.append(event.seq)
        if acked:
            await self._outbox.mark_published(acked)
            self.published += len(acked)
        if failed:
            first = next(r for r in results if isinstance(r, BaseException))
            if isinstance(first, aiomqtt.MqttError):
                raise first
            raise aiomqtt.MqttError(f"publish failed: {first!r}") from first

    async def _sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking early on notify() or stop()."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        self._wake.clear()


def _payload(event: Event) -> str:
    """The event's JSON; an event whose data cannot be encoded is still sent
    (with its data replaced) so that consumers see no hole in ``seq``."""
    try:
        return event.to_json()
    except InvalidArgument as e:
        log.error(
            "event %s (%s, node %s) has unencodable data: %s", event.seq, event.kind, event.node, e
        )
        return dataclasses.replace(event, data={"unencodable": str(e)}).to_json()
