"""The controller's side of relayed agents' reports: with S relayed
``AgentService.Connect`` calls open and registered, each round sends every
call one packed report (as a relay worker forwards it), and the controller
takes them up through its real handler chain (request limits, auth,
``AgentService``, ``Fleet.agent_health``, the policies).

Two ways, each in a process of its own: the reports taken by each link's
one report task (``RelayedContext.take_reports``, as now), and handed
through each call's request stream, which wakes the stream's reader for
every report (the code before: ``take_reports`` made a no-op, standing in
for it). Printed for each: the CPU per report, the objects made for a round
that are still alive once it has been taken (the collector walks them until
the next round: at a fleet's real pace, ten seconds, 25,000 streams'
worth). Then a change of pace (``AgentHub.pace``: one ``Pace`` to every
agent), timed until the stand-in worker has read every one: told on the
link at once (``RelayedContext.answer_now``, as now), or through each
session's queue and stream (the code before: ``agent_service._tell_pace``
made to decline, standing in for it). Both times include the stand-in
worker parsing each frame it reads, in the same process. The collector
is set as the controller's (``heap.settle``), and what is alive before
each round is frozen, so that only objects the round made are counted
(their addresses are often those of the ones they replaced).
The nodes' BMCs are the fleet benchmarks' stand-in Redfish responder on
loopback, so every node comes ready before the rounds.

    python bench/relayed_reports.py [--streams 2000] [--rounds 12]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto"), str(ROOT / "bench")]

from fleet_load import node_messages, responder_main  # noqa: E402

from controller import heap  # noqa: E402
from controller.api import agent_service  # noqa: E402
from controller.api.relay import frames  # noqa: E402
from controller.api.relay.digest import CONNECT, ReportDigest  # noqa: E402
from controller.api.relay.frames import FrameWriter  # noqa: E402
from controller.api.relay.relayed import RelayedCalls, RelayedContext  # noqa: E402
from controller.core.model import EnrollSpec, NodeState  # noqa: E402
from controller.server import ControllerConfig, ControllerServer  # noqa: E402
from controller.sim.ports import free_port  # noqa: E402
from kiln.v1 import agent_pb2  # noqa: E402

MODES = {
    "pushed": "taken by the link's report task (as now)",
    "stream": "through each call's stream (the code before)",
}


def peer(i: int) -> str:
    """A loopback address of its own per call: the request limits count
    streams per client address."""
    return f"ipv4:127.{1 + i // 60_000}.{(i // 250) % 240}.{i % 250 + 1}:50000"


async def _agents(
    reader: asyncio.StreamReader, calls: list[RelayedCalls], paces: list[int]
) -> None:
    """The worker's side of the link, for the calls' agents: each message
    handed on at once (``SENT``), each command answered done, each ``Pace``
    counted in ``paces``."""
    while (frame := await frames.read_frame(reader)) is not None:
        if frame[0] != frames.OUT:
            continue
        _, ident, raw = frame
        calls[0].on_frame((frames.SENT, ident, 1))
        message = agent_pb2.ControllerMessage.FromString(raw)
        body = message.WhichOneof("body")
        if body == "pace":
            paces[0] += 1
        elif body == "command":
            result = agent_pb2.AgentMessage(
                result=agent_pb2.CommandResult(id=message.command.id, ok=True)
            )
            calls[0].on_frame((frames.MESSAGES, [(ident, result.SerializeToString())]))


async def measure(mode: str, streams: int, rounds: int) -> dict[str, Any]:
    if mode == "stream":
        RelayedContext.take_reports = lambda self, sink: None  # type: ignore[method-assign]
        agent_service._tell_pace = lambda answer_now, seconds: False
    # The nodes' BMCs: the fleet benchmarks' stand-in Redfish responder (every
    # system on), so that every node comes ready and its lifecycle rests.
    spawn = multiprocessing.get_context("spawn")
    ours_pipe, theirs_pipe = spawn.Pipe()
    bmc_port = free_port()
    responder = spawn.Process(target=responder_main, args=(theirs_pipe, bmc_port), daemon=True)
    responder.start()
    assert ours_pipe.poll(30), "the BMC responder did not start"
    ours_pipe.recv()
    try:
        return await _measure(mode, streams, rounds, bmc_port)
    finally:
        responder.kill()


async def _measure(mode: str, streams: int, rounds: int, bmc_port: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as state:
        server = ControllerServer(
            ControllerConfig(
                listen="127.0.0.1:0", state_dir=Path(state), health_flush_interval=3600.0
            )
        )
        await server.start()
        fleet = server.fleet
        assert fleet is not None
        for i in range(streams):
            await fleet.enroll(
                EnrollSpec(
                    name=f"rr-{i:05d}",
                    bmc_url=f"redfish+http://127.0.0.1:{bmc_port}/redfish/v1/Systems/{i}",
                    username="u",
                    password="p",
                )
            )
        ours, theirs = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=ours)
        reader, other = await asyncio.open_unix_connection(sock=theirs)
        link = FrameWriter(writer)
        calls = RelayedCalls(link, server._relayed_handler)  # the relay supervisor's handler
        paces = [0]
        background = [
            asyncio.create_task(link.run()),
            asyncio.create_task(_agents(reader, [calls], paces)),
        ]
        register, report = node_messages("rr-00000", 7)
        for i in range(streams):
            register.register.node_name = register.register.hostname = f"rr-{i:05d}"
            calls.on_frame((frames.OPEN, i, CONNECT, (), {}, peer(i), None))
            calls.on_frame((frames.MESSAGES, [(i, register.SerializeToString())]))
        deadline = time.monotonic() + 300
        while fleet.agents.count() < streams:
            assert time.monotonic() < deadline, "the calls did not all register"
            await asyncio.sleep(0.05)
        while True:  # every node ready: the lifecycle rests
            view = await fleet.nodes.loaded()
            if len(view.in_states([NodeState.READY])) == streams:
                break
            assert time.monotonic() < deadline, "the nodes did not all come ready"
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # every handler back at its wait

        taken, until = [0], [0]
        round_taken = asyncio.Event()
        meter_report = fleet.meter.health_report

        def counted() -> None:
            taken[0] += 1
            meter_report()
            if taken[0] >= until[0]:
                round_taken.set()

        fleet.meter.health_report = counted  # type: ignore[method-assign]
        heap.settle()  # as the controller, once serving
        digest = ReportDigest()
        cpu: list[float] = []
        alive: list[int] = []
        for n in range(rounds):
            until[0] = (n + 1) * streams
            round_taken.clear()
            report.health.sampled_at = time.time()
            packed = digest.packed(report.SerializeToString())
            assert packed is not None
            frame = (frames.REPORTS, [(i, packed) for i in range(streams)])
            gc.freeze()  # what is alive now is out of the count that follows
            started = time.process_time()
            calls.on_frame(frame)
            await asyncio.wait_for(round_taken.wait(), 120)
            cpu.append(time.process_time() - started)
            del frame  # the link's frame, not the controller's
            # Made for this round and still alive after a young collection,
            # which stops tracking tuples of plain values (the first round's
            # include what a node's first report sets up for good).
            gc.collect(0)
            alive.append(len(gc.get_objects()))
            await asyncio.sleep(0.05)
        assert taken[0] == streams * rounds, f"{taken[0]} of {streams * rounds} reports taken"
        started = time.process_time()
        assert fleet.agents.pace(42.0) == streams
        while paces[0] < streams:
            assert time.monotonic() < deadline + 600, f"{paces[0]} of {streams} paces read"
            await asyncio.sleep(0.001)
        pace_cpu = time.process_time() - started
        for task in background:
            task.cancel()
        await calls.end_all()
        writer.close()
        other.close()
        await server.stop()
    return {
        "us_per_report": statistics.median(cpu) / streams * 1e6,
        "alive_per_stream": statistics.median(alive[1:] or alive) / streams,
        "us_per_pace": pace_cpu / streams * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--mode", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(asyncio.run(measure(args.mode, args.streams, args.rounds))))
        return 0

    print(
        f"relayed_reports: {args.streams} relayed Connect calls registered, "
        f"{args.rounds} rounds of one report each; each way in a process of its own"
    )
    got: dict[str, dict[str, Any]] = {}
    for mode, what in MODES.items():
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--mode",
                mode,
                "--streams",
                str(args.streams),
                "--rounds",
                str(args.rounds),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = got[mode] = json.loads(out.strip().splitlines()[-1])
        print(
            f"  {what}: {r['us_per_report']:.1f} us a report, "
            f"{r['alive_per_stream']:.1f} objects a stream made for a round still alive; "
            f"a change of pace {r['us_per_pace']:.1f} us an agent"
        )
    pushed, stream = got["pushed"], got["stream"]
    print(
        f"relayed_reports: {pushed['us_per_report']:.1f} us a report taken by the report task "
        f"against {stream['us_per_report']:.1f} through the streams "
        f"({stream['us_per_report'] / pushed['us_per_report']:.2f}x); objects kept a stream "
        f"{pushed['alive_per_stream']:.1f} against {stream['alive_per_stream']:.1f}, "
        f"{streams_at(pushed, stream)} at 25,000 streams; a change of pace "
        f"{pushed['us_per_pace']:.1f} us an agent told on the link against "
        f"{stream['us_per_pace']:.1f} through the streams "
        f"({stream['us_per_pace'] / pushed['us_per_pace']:.1f}x; "
        f"{pushed['us_per_pace'] * 25:.0f} against {stream['us_per_pace'] * 25:.0f} ms "
        f"at 25,000 agents)"
    )
    return 0


def streams_at(pushed: dict[str, Any], stream: dict[str, Any], fleet: int = 25_000) -> str:
    return (
        f"{pushed['alive_per_stream'] * fleet:,.0f} against "
        f"{stream['alive_per_stream'] * fleet:,.0f}"
    )


if __name__ == "__main__":
    sys.exit(main())
