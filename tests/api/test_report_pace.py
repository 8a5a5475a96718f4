"""Backpressure from measured load: while the controller's event loop lags,
every connected agent is asked (``Pace``) to report less often, a newly
registering agent is told the longer interval in ``Registered``, and once
the loop keeps up again the interval comes back to ``--sample-interval``.

A real controller and a real agent (the NVML fake) over gRPC on loopback;
the lag is real: a callback on the loop they share sleeps, as a burst of
reports or a long scheduling pass would hold it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from fleet_waits import enroll_unreachable

from agent.client import Agent
from agent.nvml import open_backend
from controller.core.fleet import Fleet
from controller.core.report_pace import PaceRules
from controller.server import ControllerConfig, ControllerServer
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2_grpc, types_pb2

SAMPLE = 0.5  # --sample-interval
RULES = PaceRules(
    tick=0.05,
    window=0.5,
    slow_above=0.08,
    ease_below=0.03,
    longest=3.0,
    recheck=1.0,
    busy_cores=0.3,
    resting_tick=0.25,  # an idle window's probe: the load below must still be met in time
)


async def until(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"within {within}s: {what}"
        await asyncio.sleep(0.05)


class Blocker:
    """Holds the running loop for ``hold`` seconds out of every ``hold + gap``."""

    def __init__(self, hold: float = 0.15, gap: float = 0.05) -> None:
        self.hold, self.gap = hold, gap
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        time.sleep(self.hold)
        self._handle = asyncio.get_running_loop().call_later(self.gap, self.start)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


class Burner:
    """Keeps the controller's process busy without holding its event loop:
    a thread hashing a large buffer (hashlib lets go of the interpreter
    while it hashes), as the database or the BMC threads would."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._burn, daemon=True)

    def _burn(self) -> None:
        data = os.urandom(1 << 22)
        while not self._stop.is_set():
            hashlib.sha256(data).digest()

    def __enter__(self) -> Burner:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


async def next_pace(call: Any, above: float, within: float) -> float:
    """The first interval above ``above`` that the controller asks of the
    agent on ``call`` (earlier messages skipped)."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"within {within}s: a Pace above {above}s"
        msg = await asyncio.wait_for(call.read(), left)
        if msg.WhichOneof("body") == "pace" and msg.pace.sample_interval_s > above:
            return float(msg.pace.sample_interval_s)


async def pacing_controller(state_dir: Path) -> tuple[ControllerServer, Fleet, str]:
    """A controller on loopback with the test's pace rules: (server, its Fleet, address)."""
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0", state_dir=state_dir, sample_interval=SAMPLE, pace=RULES
        )
    )
    address = await server.start()
    assert server.fleet is not None
    return server, server.fleet, address


def register_message(name: str) -> agent_pb2.AgentMessage:
    gpu = types_pb2.Gpu(index=0, uuid=f"GPU-{name}", model="NVIDIA H200", memory_mib=141000)
    return agent_pb2.AgentMessage(register=agent_pb2.Register(node_name=name, gpus=[gpu]))


async def register(name: str) -> AsyncIterator[agent_pb2.AgentMessage]:
    yield register_message(name)
    await asyncio.Event().wait()


@pytest.mark.timeout(120)
async def test_a_lagging_controller_slows_its_agents_and_lets_them_speed_up_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server, fleet, address = await pacing_controller(tmp_path)
    channel = grpc.aio.insecure_channel(address)
    agent = Agent(address, "p00", open_backend("fake:h200", node_name="p00"), backoff=(0.1, 0.3))
    running = asyncio.create_task(agent.run())
    blocker = Blocker()
    late = None
    try:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        await enroll_unreachable(stub, "p00", "p01")
        await until(agent.registered.is_set, 30, "the agent registers")
        assert agent.report_interval == SAMPLE  # told in Registered
        await until(lambda: fleet.pace.lag < RULES.ease_below, 10, "an idle loop keeps up")

        blocker.start()
        await until(lambda: agent.report_interval > SAMPLE, 20, "the agent is slowed down")
        assert agent.report_interval == pytest.approx(SAMPLE * RULES.stretch)
        assert fleet.report_interval == pytest.approx(SAMPLE * RULES.stretch)
        assert fleet.pace.lag > RULES.slow_above
        slowed = [r.getMessage() for r in caplog.records if "controller is behind" in r.message]
        assert slowed and "1 agents asked to report every 0.8s" in slowed[0]

        # An agent registering now is told the longer interval at once.
        late = agent_pb2_grpc.AgentServiceStub(channel).Connect(register("p01"))
        first = await late.read()
        assert first.registered.sample_interval_s >= SAMPLE * RULES.stretch

        blocker.stop()
        await until(lambda: agent.report_interval == SAMPLE, 30, "the agent speeds up again")
        assert fleet.report_interval == SAMPLE
        assert any("keeps up" in r.getMessage() for r in caplog.records)
        assert agent.registered.is_set() and agent.connections == 1  # one stream throughout
    finally:
        blocker.stop()
        if late is not None:
            late.cancel()
        await agent.stop()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await server.stop()
        await channel.close()


@pytest.mark.timeout(120)
async def test_reports_arriving_late_slow_the_agents_while_the_loop_keeps_time(
    tmp_path: Path,
) -> None:
    """A backlog ahead of the controller's code (gRPC's own queue) delays
    every report while the event loop stays on time: here an agent's stream
    sends reports sampled 0.5 s before they are sent, after one sent at once
    (its quickest), and the controller, once busy, asks it to slow down."""
    server, fleet, address = await pacing_controller(tmp_path)
    channel = grpc.aio.insecure_channel(address)
    sending = asyncio.Event()

    async def late_reports(name: str) -> AsyncIterator[agent_pb2.AgentMessage]:
        yield register_message(name)
        await sending.wait()
        yield agent_pb2.AgentMessage(health=types_pb2.NodeHealth(sampled_at=time.time()))
        while True:
            await asyncio.sleep(0.01)
            yield agent_pb2.AgentMessage(health=types_pb2.NodeHealth(sampled_at=time.time() - 0.5))

    call = None
    try:
        await enroll_unreachable(fleet_pb2_grpc.FleetServiceStub(channel), "d00")
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(late_reports("d00"))
        first = await call.read()
        assert first.registered.sample_interval_s == SAMPLE
        await until(lambda: fleet.pace.lag < RULES.ease_below, 10, "an idle loop keeps up")
        sending.set()
        # Idle, the controller does not count them: they were late before
        # they reached it, and slowing the agent would not bring them sooner.
        pace = fleet.pace
        await until(
            lambda: pace.report_delay > 0.4 and pace.busy < RULES.busy_cores,
            10,
            "an idle window with the reports seen late",
        )
        assert pace.late < 0.4  # judged without them
        before = pace.interval()
        with Burner():  # busy: they count
            slower = await next_pace(call, above=before, within=20)
            delay, busy, lag = pace.report_delay, pace.busy, pace.lag
        assert slower == pytest.approx(before * RULES.stretch)
        assert delay == pytest.approx(0.5, abs=0.1)
        assert busy >= RULES.busy_cores
        assert lag < RULES.slow_above  # the loop alone would not have slowed it
    finally:
        if call is not None:
            call.cancel()
        await server.stop()
        await channel.close()
