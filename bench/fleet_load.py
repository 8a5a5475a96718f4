"""The load side of ``bench/fleet_scale.py``: agent streams, the floor server and a BMC stand-in.

* :func:`node_messages` builds what a real agent sends for one node, through
  the agent's own code: a ``FakeNvml`` H200 node (8 GPUs), its inventory read
  by ``agent.gpu_inventory.read_inventory`` and converted by
  ``agent.client.gpu_pb`` into the ``Register`` that ``agent/client.py``
  builds, and one ``HealthSampler.sample()`` converted by
  ``agent.client.health_pb`` into a ``NodeHealth``. Sampling costs about 5 ms
  of CPU per node (fake NVML), far too much to repeat for thousands of
  reports a second, so each node's report is sampled once and re-sent with a
  fresh ``sampled_at``: same size and shape, the readings do not change.
* :class:`Streams` holds many ``AgentService.Connect`` streams on a few
  shared ``grpc.aio`` channels (each its own TCP connection): Register, wait
  for Registered, then a NodeHealth every interval the controller asks for
  (``Registered``, then ``Pace`` when it slows its agents down; ``interval``
  when it names none) from a random phase; commands from the controller
  (``reset_gpus`` when a node is prepared or released) are answered ``ok``
  at once. :func:`generator_main`
  runs one in a child process, driven over a pipe.
* :func:`floor_main`: a bare ``grpc.aio`` server whose ``AgentService.Connect``
  answers Registered and then only reads and drops (counts) the messages.
* :func:`responder_main`: a tiny asyncio HTTP server that stands in for the
  fleet's Redfish BMCs (service root and ``Systems/<id>``, every system
  powered on), closing each connection after its answer so that thousands of
  BMCs do not hold thousands of sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "proto")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import grpc  # noqa: E402

from agent.client import AGENT_VERSION, gpu_pb, health_pb  # noqa: E402
from agent.gpu_inventory import read_inventory  # noqa: E402
from agent.health import HealthSampler  # noqa: E402
from agent.nvml import open_backend  # noqa: E402
from controller.sim.ports import free_port  # noqa: E402
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc  # noqa: E402

PART = "h200"
CONNECT_TIMEOUT_S = 120.0  # Register -> Registered, per stream
CONNECTS_IN_FLIGHT = 64  # per process: registrations are database writes


def node_messages(name: str, seed: int) -> tuple[Any, Any]:
    """(Register, NodeHealth) AgentMessages for one fake H200 node, built as the agent does."""
    nvml = open_backend(f"fake:{PART}", node_name=name, seed=seed)
    nvml.nvmlInit()
    try:
        inventory = read_inventory(nvml)
        sampler = HealthSampler(nvml)
        try:
            health = sampler.sample()
        finally:
            sampler.close()
    finally:
        nvml.nvmlShutdown()
    register = agent_pb2.AgentMessage(
        register=agent_pb2.Register(
            node_name=name,
            hostname=name,
            agent_version=AGENT_VERSION,
            driver_version=inventory.driver_version,
            nvml_backend=f"fake:{PART}",
            gpus=gpu_pb(inventory),
            applied_profile="",
        )
    )
    report = agent_pb2.AgentMessage(health=health_pb(health, 0.0))
    return register, report


def _error_text(e: BaseException) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"


@dataclass
class _Stream:
    name: str
    register: Any
    report: Any
    call: Any = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_sent: float = 0.0
    interval: float = 0.0  # as the controller asked (Registered, then Pace)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class Streams:
    """Many agent streams in one event loop; see the module docstring.

    ``on_sent(name, sampled_at)`` is called after each report is written.
    """

    def __init__(
        self,
        names: list[str],
        seeds: list[int],
        interval: float,
        on_sent: Callable[[str, float], None] | None = None,
    ) -> None:
        self.interval = interval
        self.on_sent = on_sent
        started = time.process_time()
        self._streams = [
            _Stream(n, *node_messages(n, s)) for n, s in zip(names, seeds, strict=True)
        ]
        self.build_cpu_s = time.process_time() - started
        self._channels: list[grpc.aio.Channel] = []
        self._sending = asyncio.Event()
        self._sending.set()
        self._closing = False
        self.sent = 0
        self.late = 0  # reports that went out after their slot (the schedule slipped)
        self.lost = 0  # streams that ended while they should have stayed open
        self.commands = 0
        self.paces = 0  # Pace messages (the controller asked for a new interval)
        self.inflight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self.errors: Counter[str] = Counter()
        self.write_s: list[float] = []

    @property
    def sizes(self) -> tuple[int, int]:
        """Bytes of one Register and one NodeHealth AgentMessage."""
        if not self._streams:
            return 0, 0
        s = self._streams[0]
        return s.register.ByteSize(), s.report.ByteSize()

    async def connect(self, address: str, channels: int) -> tuple[int, int, float]:
        """Open every stream; returns (registered, failed, seconds)."""
        self._closing = False
        self._channels = [
            grpc.aio.insecure_channel(
                address,
                # Own subchannels: each channel is its own TCP connection.
                options=[("grpc.use_local_subchannel_pool", 1), ("kiln.bench.channel", k)],
            )
            for k in range(max(1, channels))
        ]
        gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
        started = time.monotonic()
        oks = await asyncio.gather(
            *(
                self._open(s, self._channels[i % len(self._channels)], gate)
                for i, s in enumerate(self._streams)
            )
        )
        return sum(oks), len(oks) - sum(oks), time.monotonic() - started

    async def _open(
        self, stream: _Stream, channel: grpc.aio.Channel, gate: asyncio.Semaphore
    ) -> bool:
        async with gate:
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            try:
                await asyncio.wait_for(call.write(stream.register), CONNECT_TIMEOUT_S)
                first = await asyncio.wait_for(call.read(), CONNECT_TIMEOUT_S)
            except (grpc.aio.AioRpcError, TimeoutError) as e:
                call.cancel()
                self.errors[f"connect: {_error_text(e)}"] += 1
                return False
            if first is grpc.aio.EOF or first.WhichOneof("body") != "registered":
                call.cancel()
                self.errors["connect: no Registered answer"] += 1
                return False
        stream.call = call
        stream.interval = first.registered.sample_interval_s or self.interval
        stream.tasks = [
            asyncio.create_task(self._read(stream)),
            asyncio.create_task(self._send(stream)),
        ]
        return True

    async def _read(self, stream: _Stream) -> None:
        """Answer the controller's commands; note a stream that ends."""
        try:
            while True:
                msg = await stream.call.read()
                if msg is grpc.aio.EOF:
                    raise ConnectionError("the controller ended the stream")
                if msg.WhichOneof("body") == "pace":  # as an agent does: report at this pace
                    stream.interval = msg.pace.sample_interval_s or self.interval
                    self.paces += 1
                elif msg.WhichOneof("body") == "command":
                    answer = agent_pb2.AgentMessage(
                        result=agent_pb2.CommandResult(id=msg.command.id, ok=True)
                    )
                    async with stream.lock:
                        await stream.call.write(answer)
                    self.commands += 1
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not self._closing:
                self.lost += 1
                self.errors[f"stream: {_error_text(e)}"] += 1

    async def _send(self, stream: _Stream) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(random.uniform(0, stream.interval))
        next_at = loop.time()
        while True:
            if not self._sending.is_set():
                await self._sending.wait()
                await asyncio.sleep(random.uniform(0, stream.interval))
                next_at = loop.time()
            now = time.time()
            stream.report.health.sampled_at = now
            self.inflight += 1
            self._drained.clear()
            began = loop.time()
            try:
                async with stream.lock:
                    await stream.call.write(stream.report)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not self._closing:
                    self.errors[f"write: {_error_text(e)}"] += 1
                return
            finally:
                self.inflight -= 1
                if not self.inflight:
                    self._drained.set()
            self.write_s.append(loop.time() - began)
            stream.last_sent = now
            self.sent += 1
            if self.on_sent is not None:
                self.on_sent(stream.name, now)
            next_at += stream.interval
            delay = next_at - loop.time()
            if delay < 0:
                self.late += 1
                next_at = loop.time()
                delay = 0.0
            await asyncio.sleep(delay)

    async def pause(self, timeout: float = 30.0) -> dict[str, float]:
        """Stop sending, wait for writes in flight; returns each node's last ``sampled_at``."""
        self._sending.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), timeout)
        return {s.name: s.last_sent for s in self._streams if s.call is not None}

    def resume(self) -> None:
        self._sending.set()

    def stats(self, reset_writes: bool = False) -> dict[str, Any]:
        writes = sorted(self.write_s)
        if reset_writes:
            self.write_s = []
        return {
            "sent": self.sent,
            "late": self.late,
            "lost": self.lost,
            "commands": self.commands,
            "paces": self.paces,
            "asked": [s.interval for s in self._streams if s.call is not None],
            "errors": dict(self.errors.most_common(5)),
            "cpu": time.process_time(),
            "write_p99": writes[int(0.99 * (len(writes) - 1))] if writes else 0.0,
            "open": sum(1 for s in self._streams if s.call is not None),
        }

    async def disconnect(self) -> None:
        self._closing = True
        for s in self._streams:
            for t in s.tasks:
                t.cancel()
            if s.call is not None:
                s.call.cancel()
        await asyncio.gather(*(t for s in self._streams for t in s.tasks), return_exceptions=True)
        for s in self._streams:
            s.call, s.tasks = None, []
        for ch in self._channels:
            await ch.close(grace=None)
        self._channels = []
        self._sending.set()


# --- child processes -------------------------------------------------------------
async def _commands(conn: Connection) -> AsyncIterator[tuple[Any, ...]]:
    """The parent's commands, read in a thread so the event loop keeps running."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            cmd = await loop.run_in_executor(None, conn.recv)
        except (EOFError, OSError):
            return
        yield cmd


def generator_main(conn: Connection, names: list[str], seeds: list[int], interval: float) -> None:
    """A load generator process: builds its nodes' messages, then obeys the pipe."""
    asyncio.run(_generator(conn, names, seeds, interval))


async def _generator(conn: Connection, names: list[str], seeds: list[int], interval: float) -> None:
    streams = Streams(names, seeds, interval)
    conn.send(("built", streams.build_cpu_s, *streams.sizes))
    try:
        async for cmd in _commands(conn):
            op = cmd[0]
            if op == "connect":
                conn.send(await streams.connect(cmd[1], cmd[2]))
            elif op == "stats":
                conn.send(streams.stats(reset_writes=bool(cmd[1])))
            elif op == "pause":
                conn.send(await streams.pause())
            elif op == "resume":
                streams.resume()
                conn.send(True)
            elif op == "disconnect":
                await streams.disconnect()
                conn.send(True)
            else:  # "quit"
                break
    finally:
        await streams.disconnect()


class _FloorService(agent_pb2_grpc.AgentServiceServicer):  # type: ignore[misc]
    """Same stream shape as the controller's AgentService; every message dropped."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.reports = 0
        self.streams = 0

    async def Connect(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("body") != "register":
            return
        self.streams += 1
        yield agent_pb2.ControllerMessage(
            registered=agent_pb2.Registered(
                node_name=first.register.node_name, sample_interval_s=self.interval
            )
        )
        async for msg in request_iterator:
            if msg.WhichOneof("body") == "health":
                self.reports += 1


class _FloorFleet(fleet_pb2_grpc.FleetServiceServicer):  # type: ignore[misc]
    """CreateAllocation and ReleaseAllocation answered from memory, with
    messages of the controller's shape: gRPC's own cost of an allocation
    cycle, nothing stored or decided."""

    def __init__(self) -> None:
        self.cycles = 0

    async def CreateAllocation(self, request: Any, context: Any) -> Any:
        return _allocation_pb(
            f"alloc-{request.key[:10]}",
            fleet_pb2.ALLOCATION_STATE_READY,
            "1 nodes in 1 NVLink domain(s)",
            key=request.key,
            spec=request.spec,
        )

    async def ReleaseAllocation(self, request: Any, context: Any) -> Any:
        self.cycles += 1
        return _allocation_pb(request.id, fleet_pb2.ALLOCATION_STATE_RELEASED, "released")


def _allocation_pb(ident: str, state: int, reason: str, **fields: Any) -> Any:
    now = time.time()
    return fleet_pb2.Allocation(
        id=ident,
        state=state,
        reason=reason,
        nodes=["node-00001"],
        domains=["node-00001"],
        created_at=now,
        updated_at=now,
        created_by="bench",
        **fields,
    )


def floor_main(conn: Connection, port: int, interval: float) -> None:
    asyncio.run(_floor(conn, port, interval))


async def _floor(conn: Connection, port: int, interval: float) -> None:
    server = grpc.aio.server(
        options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 1 << 20)]
    )
    service = _FloorService(interval)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    fleet_pb2_grpc.add_FleetServiceServicer_to_server(_FloorFleet(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    conn.send("ready")
    try:
        async for cmd in _commands(conn):
            if cmd[0] == "count":
                conn.send((service.reports, service.streams))
            else:
                break
    finally:
        await server.stop(grace=None)


_ROOT_DOC = {
    "@odata.id": "/redfish/v1/",
    "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
    "Id": "RootService",
    "Name": "Kiln fleet_scale BMC stand-in",
    "RedfishVersion": "1.5.0",
    "UUID": "00000000-0000-0000-0000-000000000000",
    "Systems": {"@odata.id": "/redfish/v1/Systems"},
}


def _answer(status: str, doc: dict[str, Any] | None) -> bytes:
    body = json.dumps(doc).encode() if doc is not None else b""
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _system_doc(ident: str) -> dict[str, Any]:
    return {
        "@odata.id": f"/redfish/v1/Systems/{ident}",
        "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
        "Id": ident,
        "Name": ident,
        "PowerState": "On",
        "Status": {"State": "Enabled", "Health": "OK"},
    }


@contextlib.contextmanager
def responder_on_free_port() -> Iterator[int]:
    """The stand-in responder in a process of its own on a free loopback
    port, for a benchmark's ``with`` block: the port; stopped after."""
    port = free_port()
    parent, child = multiprocessing.Pipe()
    responder = multiprocessing.Process(target=responder_main, args=(child, port), daemon=True)
    responder.start()
    if parent.recv() != "ready":
        raise SystemExit("the stand-in responder did not start")
    try:
        yield port
    finally:
        parent.send(("stop",))
        responder.join(5)


def responder_main(conn: Connection, port: int) -> None:
    asyncio.run(_responder(conn, port))


async def _responder(conn: Connection, port: int) -> None:
    served: Counter[str] = Counter()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            method, path = head.split(b" ", 2)[:2]
            text = path.decode(errors="replace").split("?", 1)[0].rstrip("/")
            if method != b"GET":
                served["refused"] += 1
                writer.write(_answer("405 Method Not Allowed", None))
            elif text == "/redfish/v1":
                served["root"] += 1
                writer.write(_answer("200 OK", _ROOT_DOC))
            elif text.startswith("/redfish/v1/Systems/"):
                served["system"] += 1
                writer.write(_answer("200 OK", _system_doc(text.rsplit("/", 1)[1])))
            else:
                served["unknown"] += 1
                writer.write(_answer("404 Not Found", {"error": "not here"}))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            pass
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    conn.send("ready")
    try:
        async for cmd in _commands(conn):
            if cmd[0] == "count":
                conn.send(dict(served))
            else:
                break
    finally:
        server.close()


def pid_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cores_over(pid: int, seconds: float) -> float:
    """The process's CPU, in cores, while this sleeps ``seconds``."""
    c0, t0 = pid_cpu_s(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (pid_cpu_s(pid) - c0) / (time.monotonic() - t0)


def pid_rss_mb(pid: int) -> float:
    """VmRSS of a process in MB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
