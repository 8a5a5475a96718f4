"""Agent streams served by relay worker processes (``--agent-relays``):
real worker processes, a real controller, agents' gRPC calls on the relay
port. What a direct call gets, a relayed one gets: registration, reports
that reach the node's health, commands and their answers, refusals with
the same status and text, authentication; a worker killed mid-stream is
started again and its agents' sessions are let go at once."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from fleet_waits import enroll_unreachable
from tls_certs import TestCa

from controller.api.relay import frames
from controller.api.relay import relayed as relayed_calls
from controller.api.relay.frames import MESSAGES, OPEN, FrameWriter
from controller.api.relay.supervisor import AgentRelays
from controller.core.health import GpuHealth, HealthReport
from controller.core.model import AgentCommand
from controller.server import ControllerConfig, ControllerServer, ListenError
from controller.sim.ports import free_port
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc, types_pb2
from kiln_common.tls import channel_credentials

CONNECT = "/kiln.v1.AgentService/Connect"
GPU = types_pb2.Gpu(index=0, uuid="GPU-r0", model="NVIDIA H200", memory_mib=141000)


def registration(name: str) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(register=agent_pb2.Register(node_name=name, gpus=[GPU]))


def report(temp_c: float) -> agent_pb2.AgentMessage:
    gpu = types_pb2.GpuHealth(index=0, uuid="GPU-r0", temp_c=temp_c)
    return agent_pb2.AgentMessage(health=types_pb2.NodeHealth(sampled_at=time.time(), gpus=[gpu]))


class Agent:
    """One agent's call: messages written from a queue, answers read."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...] = ()):
        self.outbox: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
        self.call = agent_pb2_grpc.AgentServiceStub(channel).Connect(
            self._messages(), metadata=metadata or None
        )

    async def _messages(self) -> AsyncIterator[agent_pb2.AgentMessage]:
        while (msg := await self.outbox.get()) is not None:
            yield msg

    def send(self, msg: agent_pb2.AgentMessage) -> None:
        self.outbox.put_nowait(msg)

    async def read(self) -> agent_pb2.ControllerMessage:
        msg = await asyncio.wait_for(self.call.read(), 10)
        assert msg is not grpc.aio.EOF
        return msg  # type: ignore[no-any-return]


def _this_report(o: object) -> bool:
    """A typed copy of the report the first test sends (61.5 °C on GPU-r0)."""
    if isinstance(o, HealthReport):
        return any(_this_report(g) for g in o.gpus)
    return isinstance(o, GpuHealth) and o.uuid == "GPU-r0" and o.temp_c == 61.5


async def refusal(agent: Agent) -> grpc.aio.AioRpcError:
    """The status the agent's call ended with, its first answer being a refusal."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await agent.read()
    return refused.value


async def until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def enrol(
    channel: grpc.aio.Channel, *names: str, metadata: tuple[tuple[str, str], ...] = ()
) -> None:
    await enroll_unreachable(fleet_pb2_grpc.FleetServiceStub(channel), *names, metadata=metadata)


@dataclass
class Relayed:
    """A controller with one relay worker, a channel to its API and one to
    its agent port."""

    server: ControllerServer
    api: grpc.aio.Channel
    agents: grpc.aio.Channel
    relay: str


@contextlib.asynccontextmanager
async def relayed(
    tmp_path: Path, credentials: grpc.ChannelCredentials | None = None, **config: object
) -> AsyncIterator[Relayed]:
    relay = f"127.0.0.1:{free_port()}"
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            agent_listen=relay,
            agent_relays=1,
            **config,  # type: ignore[arg-type]
        )
    )
    address = await server.start()

    def channel(target: str) -> grpc.aio.Channel:
        if credentials is None:
            return grpc.aio.insecure_channel(target)
        return grpc.aio.secure_channel(target, credentials)

    api, agents = channel(address), channel(relay)
    try:
        yield Relayed(server, api, agents, relay)
    finally:
        await agents.close()
        await api.close()
        await server.stop()


@pytest.mark.timeout(120)
async def test_a_relayed_agent_registers_reports_and_answers_commands(tmp_path: Path) -> None:
    async with relayed(tmp_path) as r:
        server, api, agents = r.server, r.api, r.agents
        await enrol(api, "r0")
        agent = Agent(agents)
        agent.send(registration("r0"))
        first = await agent.read()
        assert first.WhichOneof("body") == "registered" and first.registered.node_name == "r0"
        assert server.fleet is not None and server.fleet.agents.is_connected("r0")
        assert server.relays is not None
        assert server.relays.figures() == {"workers": 1, "calls": 1, "restarts": 0, "backlog": 0}

        agent.send(report(61.5))
        stub = fleet_pb2_grpc.FleetServiceStub(api)

        async def temp() -> float:
            node = await stub.GetNode(fleet_pb2.GetNodeRequest(name="r0"))
            return node.health.gpus[0].temp_c if node.health.gpus else 0.0

        deadline = time.monotonic() + 10
        while await temp() != 61.5:
            assert time.monotonic() < deadline, "the relayed report never reached the node"
            await asyncio.sleep(0.05)
        # The worker packed it, and nothing on the stream's path holds a typed
        # copy while it waits for the next report (at a fleet's pace every
        # object alive that long is walked by each young collection).
        gc.collect()
        assert [o for o in gc.get_objects() if _this_report(o)] == []

        # A command down the relay, its answer back up.
        calling = asyncio.create_task(
            server.fleet.agents.call("r0", AgentCommand("reset_gpus"), timeout=10)
        )
        command = (await agent.read()).command
        assert command.WhichOneof("kind") == "reset_gpus"
        agent.send(agent_pb2.AgentMessage(result=agent_pb2.CommandResult(id=command.id, ok=True)))
        outcome = await calling
        assert outcome.ok

        # A newer call of the node replaces this one: the old call's next
        # report (handed to the controller without waking its stream,
        # relayed.py) is not taken, and ends that call.
        newer = Agent(agents)
        newer.send(registration("r0"))
        assert (await newer.read()).WhichOneof("body") == "registered"
        agent.send(report(70.0))
        assert await asyncio.wait_for(agent.call.read(), 10) is grpc.aio.EOF
        assert await agent.call.code() == grpc.StatusCode.OK
        newer.send(report(62.0))
        deadline = time.monotonic() + 10
        while (seen := await temp()) != 62.0:
            assert seen != 70.0, "the replaced call's report was taken"
            assert time.monotonic() < deadline, "the newer call's report never reached the node"
            await asyncio.sleep(0.05)

        # The agent ends its call: the session is let go.
        newer.call.cancel()
        await until(lambda: not server.fleet.agents.is_connected("r0"))  # type: ignore[union-attr]
        await until(lambda: server.relays.calls() == 0)  # type: ignore[union-attr]


@pytest.mark.timeout(120)
async def test_a_new_pace_goes_onto_the_link_at_once_without_waking_the_streams(
    tmp_path: Path,
) -> None:
    """A change of pace asks every agent of the fleet: a relayed call's agent
    is told on the link at once, without its session's queue (through the
    queue, each of 25,000 streams was woken to send it)."""
    async with relayed(tmp_path) as r:
        fleet = r.server.fleet
        assert fleet is not None
        await enrol(r.api, "p0", "p1")
        agents = {name: Agent(r.agents) for name in ("p0", "p1")}
        for name, agent in agents.items():
            agent.send(registration(name))
            assert (await agent.read()).WhichOneof("body") == "registered"
        assert fleet.agents.pace(42.0) == 2
        for name in agents:  # told already: nothing left for the stream to send
            session = fleet.agents.session(name)
            assert session is not None and session.queue.empty()
        for agent in agents.values():
            assert (await agent.read()).pace.sample_interval_s == 42.0
        # A command still goes through the stream, and the next pace beside it.
        calling = asyncio.create_task(fleet.agents.call("p0", AgentCommand("reset_gpus"), 10))
        command = (await agents["p0"].read()).command
        fleet.agents.pace(63.0)
        assert (await agents["p0"].read()).pace.sample_interval_s == 63.0
        agents["p0"].send(
            agent_pb2.AgentMessage(result=agent_pb2.CommandResult(id=command.id, ok=True))
        )
        assert (await calling).ok
        for agent in agents.values():
            agent.call.cancel()


@pytest.mark.timeout(120)
async def test_relayed_refusals_keep_their_status_and_text(tmp_path: Path) -> None:
    async with relayed(tmp_path) as r:
        agents = r.agents
        # Not a registration first.
        agent = Agent(agents)
        agent.send(report(40.0))
        refused = await refusal(agent)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.details() == "first message must be register"

        # A node never enrolled.
        agent = Agent(agents)
        agent.send(registration("nowhere"))
        refused = await refusal(agent)
        assert refused.code() == grpc.StatusCode.NOT_FOUND
        assert "nowhere" in (refused.details() or "")

        # A report over a limit: the worker forwards it as it came, and the
        # controller refuses it as it refuses a direct one (its field named).
        await enrol(r.api, "r1")
        agent = Agent(agents)
        agent.send(registration("r1"))
        assert (await agent.read()).WhichOneof("body") == "registered"
        over = report(50.0)
        over.health.gpus[0].errors.extend(["e"] * 17)
        agent.send(over)
        refused = await refusal(agent)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.details() == "AgentMessage.health.gpus[0].errors: at most 16 items, not 17"

        # Bytes that are not an AgentMessage: the request limits' answer.
        raw = agents.stream_stream("/kiln.v1.AgentService/Connect")
        call = raw(iter([b"\xff\xff\xff"]))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid" in (raised.value.details() or "")

        # The relay port serves Kiln's services only.
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await agents.unary_unary("/kiln.v1.Elsewhere/Call")(b"")
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.timeout(120)
async def test_relayed_calls_are_authenticated_and_refusals_audited(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    async with relayed(tmp_path, auth=True, bootstrap_token_file=token_file) as r:
        api, agents = r.api, r.agents
        admin = (("authorization", f"Bearer {token_file.read_text().strip()}"),)
        stub = fleet_pb2_grpc.FleetServiceStub(api)
        await enrol(api, "a0", "a1", metadata=admin)
        # No credentials.
        agent = Agent(agents)
        agent.send(registration("a0"))
        refused = await refusal(agent)
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED

        # An agent token of a0 registering a1: refused and audited.
        issued = await stub.IssueAgentToken(
            fleet_pb2.IssueAgentTokenRequest(node="a0"), metadata=admin
        )
        as_a0 = (("authorization", f"Bearer {issued.token}"),)
        agent = Agent(agents, as_a0)
        agent.send(registration("a1"))
        refused = await refusal(agent)
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert issued.token not in (refused.details() or "")

        # The same token registering its own node.
        agent = Agent(agents, as_a0)
        agent.send(registration("a0"))
        assert (await agent.read()).WhichOneof("body") == "registered"

        audit = await stub.ListAudit(fleet_pb2.ListAuditRequest(method="Connect"), metadata=admin)
        codes = {e.code for e in audit.entries}
        assert {"UNAUTHENTICATED", "PERMISSION_DENIED"} <= codes, codes
        assert all(issued.token not in e.arguments_json + e.detail for e in audit.entries)
        agent.call.cancel()


@pytest.mark.timeout(120)
async def test_the_report_pace_counts_the_relay_workers_cpu(tmp_path: Path) -> None:
    """A relay worker that cannot keep up holds the reports before the
    controller: the pace judges the busiest process, the workers among them."""
    async with relayed(tmp_path) as r:
        server = r.server
        assert server.fleet is not None and server.relays is not None
        (worker,) = server.relays._processes.values()
        spent = server.relays.cpu_seconds()
        assert set(spent) == {worker.pid} and spent[worker.pid] > 0  # its start-up, at least
        assert set(server.fleet._lag_probe.helpers()) == {worker.pid}
        os.kill(worker.pid, signal.SIGKILL)
        await worker.wait()
        assert worker.pid not in server.relays.cpu_seconds()  # a worker gone counts no more


@pytest.mark.timeout(120)
async def test_a_killed_worker_lets_its_agents_go_and_is_started_again(tmp_path: Path) -> None:
    async with relayed(tmp_path) as r:
        server, api, agents, relay = r.server, r.api, r.agents, r.relay
        await enrol(api, "k0")
        agent = Agent(agents)
        agent.send(registration("k0"))
        assert (await agent.read()).WhichOneof("body") == "registered"
        assert server.fleet is not None and server.relays is not None
        (worker,) = server.relays._processes.values()
        os.kill(worker.pid, signal.SIGKILL)

        await until(lambda: not server.fleet.agents.is_connected("k0"))  # type: ignore[union-attr]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await agent.read()
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE

        await until(lambda: server.relays.restarts == 1 and server.relays._processes, 20)  # type: ignore[union-attr]
        # Its agent comes back through the new worker.
        deadline = time.monotonic() + 20
        while True:
            agent = Agent(grpc.aio.insecure_channel(relay))
            agent.send(registration("k0"))
            try:
                assert (await agent.read()).WhichOneof("body") == "registered"
                break
            except grpc.aio.AioRpcError:
                assert time.monotonic() < deadline, "no worker took the agent back"
                await asyncio.sleep(0.2)
        assert server.fleet.agents.is_connected("k0")
        agent.call.cancel()


@pytest.mark.timeout(120)
async def test_a_relayed_agent_may_register_only_the_node_its_certificate_names(
    tmp_path: Path,
) -> None:
    """Mutual TLS ends in the worker; the certificate's names reach the
    controller's check as they would on its own port."""
    (tmp_path / "pki").mkdir()
    ca = TestCa(tmp_path / "pki")
    server_cert = ca.server()
    node_a = ca.client("m0")
    operator = channel_credentials(ca.ca_path, node_a.cert, node_a.key)
    assert operator is not None
    async with relayed(
        tmp_path,
        operator,
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        tls_client_ca=ca.ca_path,
        auth=False,
    ) as r:
        server, api, agents = r.server, r.api, r.agents
        await enrol(api, "m0", "m1")
        agent = Agent(agents)
        agent.send(registration("m1"))
        refused = await refusal(agent)
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "m0" in (refused.details() or "")

        agent = Agent(agents)
        agent.send(registration("m0"))
        assert (await agent.read()).WhichOneof("body") == "registered"
        assert server.fleet is not None
        expires = server.fleet.agents.cert_expires_at("m0")
        assert expires is not None and expires > time.time()
        agent.call.cancel()


@pytest.mark.timeout(60)
async def test_a_controller_behind_its_relayed_reports_stops_reading_the_link() -> None:
    """Forwarded messages no handler has taken up are bounded: past HIGH the
    link is not read (``room`` waits) until they are down to LOW."""
    gates = [asyncio.Event()]  # the newest is the next call's

    async def never_reads(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        await gates[-1].wait()  # a handler behind: takes nothing up
        async for _ in requests:
            pass
        yield b""

    handler = grpc.stream_stream_rpc_method_handler(never_reads)

    async def handler_for(_details: object) -> grpc.RpcMethodHandler:
        return handler

    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    calls = relayed_calls.RelayedCalls(FrameWriter(writer), handler_for)
    try:
        calls.on_frame((OPEN, 1, CONNECT, (), {}, "ipv4:127.0.0.1:1", None))
        await asyncio.sleep(0)
        calls.on_frame((MESSAGES, [(1, b"x")] * relayed_calls.HIGH))
        await asyncio.wait_for(calls.room(), 1)  # at HIGH, still room
        calls.on_frame((MESSAGES, [(1, b"x")]))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(calls.room(), 0.2)
        assert calls.queued == relayed_calls.HIGH + 1
        gates[-1].set()  # the handler catches up
        gates.append(asyncio.Event())
        await asyncio.wait_for(calls.room(), 5)
        assert calls.queued <= relayed_calls.LOW

        # Fewer messages, but large ones: their bytes are bounded too.
        big = b"x" * (1024 * 1024)
        calls.on_frame((OPEN, 2, CONNECT, (), {}, "ipv4:127.0.0.1:2", None))
        await asyncio.sleep(0)
        calls.on_frame((MESSAGES, [(2, big)] * 257))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(calls.room(), 0.5)
        assert calls.queued_bytes >= 257 * len(big) > relayed_calls.HIGH_BYTES
    finally:
        await calls.end_all()
        assert calls.queued == 0 and calls.queued_bytes == 0
        writer.close()
        theirs.close()


@pytest.mark.timeout(60)
async def test_a_fleet_call_is_answered_while_the_agents_link_is_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker sends the agents' streams on one link and every other call
    on its own: with the controller behind on the agents' messages (past
    HIGH, so their link is not read), a ``GetNode`` through the same worker
    is still read and answered at once, not queued behind them."""
    monkeypatch.setattr(relayed_calls, "HIGH", 3)
    monkeypatch.setattr(relayed_calls, "LOW", 1)
    behind = asyncio.Event()

    async def never_reads(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        await behind.wait()  # a controller behind: takes nothing up
        yield b""

    async def get_node(request: fleet_pb2.GetNodeRequest, context: object) -> fleet_pb2.Node:
        return fleet_pb2.Node(name=request.name)

    async def handler_for(details: relayed_calls.CallDetails) -> grpc.RpcMethodHandler:
        if details.method == CONNECT:
            return grpc.stream_stream_rpc_method_handler(never_reads)
        return grpc.unary_unary_rpc_method_handler(
            get_node,
            request_deserializer=fleet_pb2.GetNodeRequest.FromString,
            response_serializer=fleet_pb2.Node.SerializeToString,
        )

    relays = AgentRelays(1, f"127.0.0.1:{free_port()}", handler_for)
    await relays.start()
    channel = grpc.aio.insecure_channel(relays.listen)
    try:
        agent = Agent(channel)
        for i in range(20):
            agent.outbox.put_nowait(registration(f"a{i}"))
        await until(lambda: relays.figures()["backlog"] > relayed_calls.HIGH)
        await asyncio.sleep(0.5)
        held = relays.figures()["backlog"]
        assert held < 20  # the agents' link is not read past HIGH
        node = await fleet_pb2_grpc.FleetServiceStub(channel).GetNode(
            fleet_pb2.GetNodeRequest(name="n7"), timeout=5
        )
        assert node.name == "n7"
        assert relays.figures()["backlog"] == held  # still not read
        behind.set()
        agent.call.cancel()
    finally:
        await channel.close()
        await relays.stop()


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(120)
def test_relay_workers_of_a_killed_controller_exit_and_free_the_port(tmp_path: Path) -> None:
    """``kiln-controller --agent-relays 2`` killed with SIGKILL: its workers
    see their link end and exit, so a restarted controller's workers are
    the only ones on the agent port."""
    port, agent_port = free_port(), free_port()
    argv = [sys.executable, "-m", "controller.main", "--listen", f"127.0.0.1:{port}"]
    argv += ["--state-dir", str(tmp_path / "state")]
    argv += ["--agent-listen", f"127.0.0.1:{agent_port}", "--agent-relays", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 2 or not _accepts(agent_port):
            assert proc.poll() is None, "the controller exited"
            assert time.monotonic() < deadline, "the relay workers never served"
            time.sleep(0.2)
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(w) for w in workers):
            assert time.monotonic() < deadline, "a relay worker outlived its controller"
            time.sleep(0.1)
        assert not _accepts(agent_port)
    finally:
        if proc.poll() is None:
            proc.kill()


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(60)
async def test_an_agent_port_in_use_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    """The workers share their port with SO_REUSEPORT, so a port anything
    else listens on (another controller's workers included) is refused
    before anything is served."""
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            agent_listen=f"127.0.0.1:{port}",
            agent_relays=1,
        )
    )
    try:
        with pytest.raises(ListenError) as refused:
            await server.start()
        assert f"127.0.0.1:{port}" in str(refused.value)
        assert "already in use" in str(refused.value)
        assert server.relays is None
    finally:
        await server.stop()
        taken.close()


@pytest.mark.timeout(60)
async def test_frames_batch_messages_in_order_and_refuse_what_is_not_a_frame() -> None:
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    reader, other = await asyncio.open_unix_connection(sock=theirs)
    link = FrameWriter(writer)
    sending = asyncio.create_task(link.run())
    try:
        big = b"y" * (1024 * 1024)
        link.send((OPEN, 7, CONNECT, (), {}, "peer", None))
        for i in range(20):
            link.message(7, big[:-1] + bytes([i]))
        got: list[bytes] = []
        first = await frames.read_frame(reader)
        assert first is not None and first[0] == OPEN
        while len(got) < 20:
            frame = await asyncio.wait_for(frames.read_frame(reader), 10)
            assert frame is not None and frame[0] == MESSAGES
            assert sum(len(raw) for _, raw in frame[1]) <= frames.BATCH_BYTES
            got += [raw for _, raw in frame[1]]
        assert [raw[-1] for raw in got] == list(range(20))

        # Bytes that are not a frame end the link with FrameError.
        bad = asyncio.StreamReader()
        bad.feed_data(b"\x00\x00\x00\x03abc")
        with pytest.raises(frames.FrameError):
            await frames.read_frame(bad)
        bad = asyncio.StreamReader()
        bad.feed_data(b"\xff\xff\xff\xff")
        with pytest.raises(frames.FrameError):
            await frames.read_frame(bad)
        bad = asyncio.StreamReader()
        bad.feed_data(frames.encode((1,))[:-1])
        bad.feed_eof()
        with pytest.raises(frames.FrameError):
            await frames.read_frame(bad)
    finally:
        sending.cancel()
        other.close()
