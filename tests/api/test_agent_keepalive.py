"""A node that goes dark without a word (power lost, network cut) loses its
agent's stream through gRPC keepalive, on the controller's own port and on
a relay worker's; a quiet agent that is alive keeps its stream.

"Dark" is an agent process stopped with SIGSTOP: its kernel still holds the
TCP connection open (no FIN, no RST, as when a node loses power behind a
switch), but nothing answers the controller's HTTP/2 pings."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controller.api.keepalive import keepalive_options
from controller.core.agents import AgentHub
from controller.server import ControllerConfig, ControllerServer
from tests.api.test_agent_relays import enrol, relayed

ROOT = Path(__file__).resolve().parents[2]

# An agent in a process of its own: registers, prints "registered", then
# stays connected and sends nothing.
AGENT = """
import asyncio, sys
import grpc
from kiln.v1 import agent_pb2, agent_pb2_grpc, types_pb2

async def main(address, name):
    async def messages():
        gpu = types_pb2.Gpu(index=0, uuid="GPU-" + name, model="NVIDIA H200", memory_mib=141000)
        yield agent_pb2.AgentMessage(register=agent_pb2.Register(node_name=name, gpus=[gpu]))
        await asyncio.Event().wait()
    async with grpc.aio.insecure_channel(address) as channel:
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(messages())
        first = await call.read()
        print(first.WhichOneof("body"), flush=True)
        while await call.read() is not grpc.aio.EOF:
            pass
        print("ended", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@contextlib.asynccontextmanager
async def agent_process(address: str, name: str) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "proto"), str(ROOT)])}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", AGENT, address, name, stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line.strip() == b"registered", f"the agent did not register: {line!r}"
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.kill()
        await asyncio.wait_for(process.wait(), 10)


async def connected_for(hub: AgentHub, node: str, seconds: float) -> float:
    """Seconds the node's agent stays connected, at most ``seconds``."""
    start = time.monotonic()
    gone = asyncio.Event()
    hub.watch(lambda name: gone.set() if name == node and not hub.is_connected(node) else None)
    if hub.is_connected(node):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gone.wait(), seconds)
    return time.monotonic() - start


async def dark_and_quiet(server: ControllerServer, address: str) -> None:
    """A stopped agent is let go within the keepalive window; a quiet live
    one stays for several of them."""
    assert server.fleet is not None
    hub = server.fleet.agents
    async with agent_process(address, "quiet"), agent_process(address, "dark") as dark:
        assert hub.is_connected("dark") and hub.is_connected("quiet")
        dark.send_signal(signal.SIGSTOP)
        gone_after = await connected_for(hub, "dark", 20.0)
        assert not hub.is_connected("dark"), "a node gone dark kept its agent's stream 20 s"
        # keepalive 1 s: a ping within 1 s, unanswered 1 s later
        assert gone_after < 10.0
        # The live agent answered every ping and sent nothing: still there.
        assert hub.is_connected("quiet"), "a quiet agent lost its stream to keepalive"
        assert await connected_for(hub, "quiet", 4.0) >= 4.0


@pytest.mark.timeout(120)
async def test_a_dark_node_loses_its_agent_stream_and_a_quiet_one_keeps_it(
    tmp_path: Path,
) -> None:
    server = ControllerServer(
        ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path, agent_keepalive=1.0)
    )
    address = await server.start()
    channel = grpc.aio.insecure_channel(address)
    try:
        await enrol(channel, "dark", "quiet")
        await dark_and_quiet(server, address)
    finally:
        await channel.close()
        await server.stop()


@pytest.mark.timeout(120)
async def test_a_relay_worker_lets_a_dark_node_go_too(tmp_path: Path) -> None:
    async with relayed(tmp_path, agent_keepalive=1.0) as r:
        await enrol(r.api, "dark", "quiet")
        await dark_and_quiet(r.server, r.relay)


def test_keepalive_options_ping_quiet_connections_and_refuse_nonsense() -> None:
    options = dict(keepalive_options(30.0))
    assert options["grpc.keepalive_time_ms"] == 30000
    assert options["grpc.keepalive_timeout_ms"] == 10000
    assert options["grpc.http2.max_pings_without_data"] == 0
    assert dict(keepalive_options(2.0))["grpc.keepalive_timeout_ms"] == 2000
    with pytest.raises(ValueError, match="positive"):
        keepalive_options(0)
