"""A simulated fleet with health policies and MQTT events, all on real peers.

``thermal_fleet(tmp_path, rules_yaml)`` starts a real Mosquitto broker, a
ControllerServer publishing events to it and running the given rule set, and a
SimFleet (the sushy-tools emulator as every node's BMC, agents on the NVML
fake) with every node enrolled and ready. It yields a :class:`ThermalHarness`
and stops everything on exit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiomqtt
import grpc

from controller.cli.pages import every_page_async
from controller.core.health_policy import PolicyRunner
from controller.events import Event
from controller.policies import load_rules
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet
from controller.sim.mosquitto import Mosquitto
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

READY = types_pb2.NODE_STATE_READY
EventFilter = Callable[[Event], bool]


class MqttCollector:
    """Every event that arrives on ``topics`` (a real aiomqtt subscription)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, Event]] = []
        self._arrived = asyncio.Event()

    def events(self, match: EventFilter = lambda e: True, *, topic: str = "") -> list[Event]:
        """Events received so far (de-duplicated by seq) that ``match``, in seq order."""
        seen: dict[int, Event] = {}
        for t, e in self.received:
            if (not topic or t == topic) and match(e):
                seen.setdefault(e.seq, e)
        return [seen[s] for s in sorted(seen)]

    async def wait_for(
        self, match: EventFilter, *, count: int = 1, within: float = 30.0, topic: str = ""
    ) -> list[Event]:
        """Wait until ``count`` matching events arrived; AssertionError on timeout."""
        try:
            async with asyncio.timeout(within):
                while len(self.events(match, topic=topic)) < count:
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            kinds = [(e.kind, e.node, e.data.get("action")) for _, e in self.received[-30:]]
            raise AssertionError(
                f"not {count} matching event(s) in {within}s; last: {kinds}"
            ) from None
        return self.events(match, topic=topic)

    def _add(self, topic: str, event: Event) -> None:
        self.received.append((topic, event))
        self._arrived.set()


@contextlib.asynccontextmanager
async def subscribe(broker: Mosquitto, *topics: str) -> AsyncIterator[MqttCollector]:
    """A collector subscribed (QoS 1) to ``topics`` on ``broker`` until exit."""
    collector = MqttCollector()
    ident = f"test-{time.monotonic_ns()}"
    async with aiomqtt.Client(broker.host, broker.port, identifier=ident) as client:
        for topic in topics:
            await client.subscribe(topic, qos=1)

        async def collect() -> None:
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                collector._add(str(message.topic), Event.from_json(message.payload))

        task = asyncio.create_task(collect())
        try:
            yield collector
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await task


def allocation_topic(ident: str) -> str:
    return f"kiln/v1/allocations/{ident}/events"


def policy_action(action: str = "", *, node: str = "", rule: str = "") -> EventFilter:
    """Matches policy.action events, optionally of one action, node and rule."""

    def match(e: Event) -> bool:
        return (
            e.kind == "policy.action"
            and (not action or e.data.get("action") == action)
            and (not node or e.node == node)
            and (not rule or e.rule == rule)
        )

    return match


class ThermalHarness:
    def __init__(
        self,
        server: ControllerServer,
        fleet: SimFleet,
        stub: fleet_pb2_grpc.FleetServiceStub,
        broker: Mosquitto,
        mqtt: MqttCollector,
    ) -> None:
        self.server = server
        self.fleet = fleet
        self.stub = stub
        self.broker = broker
        self.mqtt = mqtt  # everything under kiln/v1/#

    @property
    def policies(self) -> PolicyRunner:
        assert self.server.fleet is not None
        return self.server.fleet.policies

    async def node(self, name: str) -> fleet_pb2.Node:
        return await self.stub.GetNode(fleet_pb2.GetNodeRequest(name=name))

    async def nodes(self) -> list[fleet_pb2.Node]:
        return await every_page_async(self.stub.ListNodes, fleet_pb2.ListNodesRequest(), "nodes")

    async def wait_node(
        self, name: str, match: Callable[[fleet_pb2.Node], bool], within: float = 30.0
    ) -> fleet_pb2.Node:
        deadline = time.monotonic() + within
        while True:
            node = await self.node(name)
            if match(node):
                return node
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{name} stuck: state={types_pb2.NodeState.Name(node.state)} "
                    f"reason={node.state_reason!r} agent={node.agent_connected}"
                )
            await asyncio.sleep(0.1)

    async def wait_all_ready(self, within: float = 60.0) -> list[fleet_pb2.Node]:
        deadline = time.monotonic() + within
        while True:
            nodes = await self.nodes()
            if nodes and all(n.state == READY and n.schedulable for n in nodes):
                return nodes
            if time.monotonic() > deadline:
                raise AssertionError(
                    "not ready: " + ", ".join(f"{n.name}:{n.state_reason}" for n in nodes)
                )
            await asyncio.sleep(0.1)

    def _read_power(self, name: str) -> str:
        token = base64.b64encode(f"{SIM_USERNAME}:{SIM_PASSWORD}".encode()).decode()
        ident = self.fleet.nodes[name].spec.system_uuid
        url = f"{self.fleet.emulator.base_url}/redfish/v1/Systems/{ident}"
        request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(request, timeout=5) as resp:  # loopback only
            return str(json.load(resp)["PowerState"])

    async def emulator_power(self, name: str) -> str:
        """The system's PowerState as the sushy-tools emulator serves it ("On"/"Off")."""
        return await asyncio.to_thread(self._read_power, name)

    async def wait_emulator_power(self, name: str, state: str, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while (power := await self.emulator_power(name)) != state:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} is {power} at the emulator, not {state}")
            await asyncio.sleep(0.1)

    async def heat(self, node: str, gpu: int, target_c: float, rate: float = 500.0) -> None:
        """Heat one GPU through the agent's fault injection (the gRPC InjectFault API)."""
        fault = {"kind": "heat", "gpu": gpu, "target_c": target_c, "rate_c_per_s": rate}
        reply = await self.stub.InjectFault(
            fleet_pb2.InjectFaultRequest(node=node, fault_json=json.dumps(fault))
        )
        assert reply.ok, reply.message

    async def silence(self, name: str) -> None:
        """Stop the node's agent while its BMC keeps it powered on."""
        sim = self.fleet.nodes[name]
        assert sim.agent is not None and sim.task is not None
        await sim.agent.stop()
        await asyncio.gather(sim.task, return_exceptions=True)
        await self.wait_node(name, lambda n: not n.agent_connected)

    async def allocate(self, key: str, spec: fleet_pb2.AllocationSpec) -> fleet_pb2.Allocation:
        alloc = await self.stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key=key, spec=spec)
        )
        assert alloc.state == fleet_pb2.ALLOCATION_STATE_READY, alloc.reason
        return alloc

    async def allocation(self, ident: str) -> fleet_pb2.Allocation:
        return await self.stub.GetAllocation(fleet_pb2.GetAllocationRequest(id=ident))

    async def stored_events(self, **filters: Any) -> list[fleet_pb2.Event]:
        """Every event in the controller's store (the gRPC stream, no follow)."""
        stream = self.stub.WatchEvents(fleet_pb2.WatchEventsRequest(follow=False, **filters))
        return [e async for e in stream]


@contextlib.asynccontextmanager
async def thermal_fleet(
    tmp_path: Path, rules_yaml: str, *, trays: int = 4, hgx_nodes: int = 2
) -> AsyncIterator[ThermalHarness]:
    """Broker, controller (with ``rules_yaml``) and a ready simulated fleet."""
    async with Mosquitto() as broker:
        server = ControllerServer(
            ControllerConfig(
                listen="127.0.0.1:0",
                state_dir=tmp_path,
                reconcile_interval=0.2,
                sample_interval=0.3,
                rules=load_rules(rules_yaml),
                mqtt=f"{broker.host}:{broker.port}",
                simulation=True,  # heat() injects faults
            )
        )
        address = await server.start()
        fleet = SimFleet(
            default_fleet(nvl72_racks=1, hgx_nodes=hgx_nodes, trays=trays), watch_interval=0.2
        )
        try:
            await fleet.start(address)
            async with (
                grpc.aio.insecure_channel(address) as channel,
                subscribe(broker, "kiln/v1/#") as mqtt,
            ):
                stub = fleet_pb2_grpc.FleetServiceStub(channel)
                for spec in fleet.specs:
                    await stub.EnrollNode(
                        fleet_pb2.EnrollNodeRequest(
                            name=spec.name,
                            bmc_url=fleet.bmc_url(spec.name),
                            username=SIM_USERNAME,
                            password=SIM_PASSWORD,
                            rack=spec.rack,
                            leaf=spec.leaf,
                            spine=spec.spine,
                        )
                    )
                harness = ThermalHarness(server, fleet, stub, broker, mqtt)
                await harness.wait_all_ready()
                yield harness
        finally:
            await fleet.stop()
            await server.stop()
