"""``kiln demo``: a controller and a simulated fleet, end to end, on this machine.

It starts a controller on SQLite in a temporary directory, a simulated fleet
(GB200 NVL72 racks and HGX H200 boxes whose BMCs are served by the sushy-tools
Redfish emulator and whose GPUs are Kiln's NVML fake), enrols every node
through the API, waits for them to become ready, allocates one whole NVL72 rack
and a gang of two HGX nodes, shows them, releases them and shuts down. With
``--serve`` it keeps the fleet up for the CLI instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from importlib import resources
from typing import Any

import grpc

from controller.checks import load_default_suite
from controller.cli.pages import every_page_async
from controller.policies import RuleSet, load_rules
from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

Say = Callable[[str], None]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="run a simulated fleet end to end", description=__doc__)
    p.add_argument("--racks", type=int, default=2, help="GB200 NVL72 racks (default 2)")
    p.add_argument("--hgx", type=int, default=4, help="HGX H200 nodes (default 4)")
    p.add_argument(
        "--serve", action="store_true", help="keep the fleet up and print the controller address"
    )
    p.add_argument("--listen", default="127.0.0.1:0", help="controller HOST:PORT (default: any)")
    p.add_argument(
        "--power-delay",
        action="store_true",
        help="let power changes land 1-11 s late, as the emulator does by default",
    )
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    p.add_argument(
        "--no-thermal", action="store_true", help="skip the thermal power-down scenario at the end"
    )
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    # The controller's and agents' log lines go to a file the demo names, not
    # between its steps (with -v they also go to the terminal, as asked).
    handle, path = tempfile.mkstemp(prefix="kiln-demo-", suffix=".log")
    os.close(handle)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(to_file)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    print_step(f"log         the controller's and agents' log lines go to {path}")
    try:
        return asyncio.run(demo(args, print_step))
    except KeyboardInterrupt:
        return 130
    finally:
        root.removeHandler(to_file)
        to_file.close()


def print_step(text: str) -> None:
    print(text, flush=True)


def short(enum_name: str, prefix: str) -> str:
    return enum_name.removeprefix(prefix).lower()


async def demo(args: argparse.Namespace, say: Say) -> int:
    started = time.monotonic()
    controller = ControllerServer(
        ControllerConfig(
            listen=args.listen,
            reconcile_interval=0.5,
            sample_interval=1.0,
            rules=demo_rules(),
            checks=load_default_suite(),  # intake burn-in before a node is first ready
            simulation=True,  # the thermal scenario injects faults
            http_listen="127.0.0.1:0" if args.serve else None,  # the dashboard
        )
    )
    address = await controller.start()
    say(f"controller  listening on {address} (SQLite in a temporary directory)")
    fleet = SimFleet(default_fleet(args.racks, args.hgx), power_delay=args.power_delay)
    try:
        await fleet.start(address)
        say(
            f"bmcs        sushy-tools Redfish emulator at {fleet.emulator.base_url} "
            f"serving {len(fleet.specs)} systems"
        )
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await enroll_all(stub, fleet, say)
            if not await wait_ready(stub, len(fleet.specs), args.timeout, say):
                return 1
            await report_burn_in(stub, fleet, say)
            if args.serve:
                return await serve(address, say, dashboard=controller.http_address)
            ok = await allocate_and_release(stub, say)
            if ok:
                ok = await wait_ready(stub, len(fleet.specs), args.timeout, say)
            if ok and not args.no_thermal and args.racks > 0:
                ok = await thermal_scenario(stub, fleet, say)
    finally:
        say("shutdown    stopping agents, BMC emulator and controller")
        await fleet.stop()
        await controller.stop()
    say(f"done        in {time.monotonic() - started:.1f}s" if ok else "demo FAILED")
    if ok and not args.serve:
        say("next        keep a fleet up with `kiln demo --serve`, then in another terminal:")
        say("            kiln --controller ADDRESS nodes list, alloc create --nodes 2 --wait,")
        say("            events watch; and open the dashboard address it prints")
    return 0 if ok else 1


async def enroll_all(stub: fleet_pb2_grpc.FleetServiceStub, fleet: SimFleet, say: Say) -> None:
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
    kinds = Counter(s.kind for s in fleet.specs)
    say(
        f"enrol       {len(fleet.specs)} nodes through the API: "
        + ", ".join(f"{n} × {k.upper()}" for k, n in sorted(kinds.items()))
    )


async def report_burn_in(stub: fleet_pb2_grpc.FleetServiceStub, fleet: SimFleet, say: Say) -> None:
    """How many nodes passed their intake checks, and which checks those were."""
    passed, names = 0, []
    for spec in fleet.specs:
        answer = await stub.ListChecks(fleet_pb2.ListChecksRequest(node=spec.name))
        intake = [r for r in answer.runs if r.trigger == "intake" and r.passed]
        if intake:
            passed += 1
            names = [c.name for c in intake[-1].checks]
    say(
        f"burn-in     {passed} of {len(fleet.specs)} nodes passed intake checks "
        f"({', '.join(names) or 'none'}) before they were ready; see kiln nodes checks NODE"
    )


async def wait_ready(
    stub: fleet_pb2_grpc.FleetServiceStub, total: int, timeout: float, say: Say
) -> bool:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        nodes = await every_page_async(stub.ListNodes, fleet_pb2.ListNodesRequest(), "nodes")
        states = Counter(short(types_pb2.NodeState.Name(n.state), "NODE_STATE_") for n in nodes)
        line = ", ".join(f"{k} {v}" for k, v in sorted(states.items()))
        if line != last:
            say(f"lifecycle   {line}")
            last = line
        if states.get("ready", 0) == total and all(n.schedulable for n in nodes):
            return True
        await asyncio.sleep(0.5)
    say(f"lifecycle   not every node became ready within {timeout:.0f}s")
    return False


def describe(alloc: fleet_pb2.Allocation) -> str:
    state = short(fleet_pb2.AllocationState.Name(alloc.state), "ALLOCATION_STATE_")
    nodes = list(alloc.nodes)
    shown = ", ".join(nodes) if len(nodes) <= 4 else f"{nodes[0]} … {nodes[-1]}"
    return (
        f"{alloc.id} {state}: {len(nodes)} nodes in {len(alloc.domains)} NVLink domain(s) [{shown}]"
    )


async def allocate_and_release(stub: fleet_pb2_grpc.FleetServiceStub, say: Say) -> bool:
    rack = await stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="demo-nvl72-rack", spec=fleet_pb2.AllocationSpec(racks=1, gpu_model="GB200")
        )
    )
    say(f"allocate    one whole NVL72 rack → {describe(rack)}")
    gang = await stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="demo-hgx-gang",
            spec=fleet_pb2.AllocationSpec(
                nodes=2, gpu_model="H200", topology=fleet_pb2.TOPOLOGY_LEVEL_LEAF
            ),
        )
    )
    say(f"allocate    gang of 2 HGX H200 nodes → {describe(gang)}")
    again = await stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="demo-hgx-gang",
            spec=fleet_pb2.AllocationSpec(
                nodes=2, gpu_model="H200", topology=fleet_pb2.TOPOLOGY_LEVEL_LEAF
            ),
        )
    )
    say(f"idempotent  same key again → {again.id} (same allocation: {again.id == gang.id})")
    try:
        await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(spec=fleet_pb2.AllocationSpec(nodes=1000))
        )
    except grpc.aio.AioRpcError as e:
        say(f"refused     1000 nodes → {e.code().name}: {e.details()}")
    ok = rack.state == fleet_pb2.ALLOCATION_STATE_READY and len(rack.nodes) == 18
    ok = ok and gang.state == fleet_pb2.ALLOCATION_STATE_READY and len(gang.nodes) == 2
    listing = await every_page_async(
        stub.ListAllocations, fleet_pb2.ListAllocationsRequest(), "allocations"
    )
    for alloc in listing:
        say(f"show        {describe(alloc)}")
    for alloc in (rack, gang):
        released = await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))
        state = short(fleet_pb2.AllocationState.Name(released.state), "ALLOCATION_STATE_")
        say(f"release     {alloc.id} → {state}; its nodes reset their GPUs and return to ready")
    return ok


def demo_rules() -> RuleSet:
    """The default health rules with the thermal durations cut from minutes to
    seconds, so the power-down scenario fits in a demo."""
    text = resources.files("controller.policies").joinpath("default_rules.yaml").read_text()
    text = text.replace("for: 60s", "for: 3s").replace("after: 300s", "after: 4s")
    return load_rules(text)


async def thermal_scenario(
    stub: fleet_pb2_grpc.FleetServiceStub, fleet: SimFleet, say: Say
) -> bool:
    """16 trays of an NVL72 rack with 2 hot spares; one tray overheats."""
    alloc = await stub.CreateAllocation(
        fleet_pb2.CreateAllocationRequest(
            key="demo-train",
            spec=fleet_pb2.AllocationSpec(
                nodes=16,
                gpu_model="GB200",
                spares_per_domain=2,
                topology=fleet_pb2.TOPOLOGY_LEVEL_NVLINK,
            ),
        )
    )
    say(
        f"allocate    16 trays + 2 hot spares in one NVLink domain → {describe(alloc)}; "
        f"spares {', '.join(alloc.spares)}"
    )
    victim = alloc.nodes[3]
    node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=victim))
    slowdown = next((g.slowdown_c for g in node.health.gpus if g.HasField("slowdown_c")), 89.0)
    target = slowdown - 1
    fault = {"kind": "heat", "gpu": 2, "target_c": target, "rate_c_per_s": 15}
    await stub.InjectFault(fleet_pb2.InjectFaultRequest(node=victim, fault_json=json.dumps(fault)))
    say(
        f"thermal     heating GPU 2 of {victim} toward {target:.0f} °C "
        f"(slowdown at {slowdown:.0f} °C); rule gpu-hot: drain, tell the job, power off"
    )
    wanted = {"drained": False, "told": False, "off": False, "replaced": False}
    events = stub.WatchEvents(fleet_pb2.WatchEventsRequest(follow=True))
    try:
        # Bounded as a whole: a step that never comes ends the wait with the
        # steps missing named below, not a stream waiting on a quiet fleet.
        async with asyncio.timeout(60):
            await _follow(events, alloc.id, victim, wanted, say)
    except TimeoutError:
        pass
    finally:
        events.cancel()
    power = (await asyncio.to_thread(fleet.read_power)).get(victim)
    say(f"bmc         the Redfish emulator reports {victim} PowerState={power}")
    await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=alloc.id))
    say(f"release     {alloc.id}; {victim} stays powered off until an operator undrains it")
    missing = [k for k, v in wanted.items() if not v]
    if missing or power != "Off":
        say(f"thermal     scenario incomplete: missing {', '.join(missing) or 'power-off'}")
        return False
    return True


async def _follow(events: Any, alloc: str, victim: str, wanted: dict[str, bool], say: Say) -> None:
    """Read the fleet's events until every step of ``wanted`` was seen."""
    async for event in events:
        if event.allocation == alloc and event.kind == "allocation.notice":
            wanted["told"] = True
            say(f"event #{event.seq:<4} {event.kind} → job {alloc}: {event.reason}")
        elif (
            event.node == victim
            and event.kind == "node.transition"
            and (json.loads(event.data_json).get("to_state") == "draining")
        ):
            wanted["drained"] = True
            say(f"event #{event.seq:<4} {victim} draining: {event.reason}")
        elif event.node == victim and event.kind == "node.power":
            data = json.loads(event.data_json)
            if data.get("action") in ("off", "force_off"):
                wanted["off"] = True
                say(
                    f"event #{event.seq:<4} {victim} powered {data.get('power')} "
                    f"through its BMC ({data.get('action')})"
                )
        elif event.allocation == alloc and event.kind == "allocation.node_replaced":
            wanted["replaced"] = True
            say(f"event #{event.seq:<4} {event.kind}: {event.reason}")
        if all(wanted.values()):
            return


async def serve(address: str, say: Say, *, dashboard: str = "") -> int:
    say(f"serving     the fleet is up; try: KILN_CONTROLLER={address} kiln nodes list")
    if dashboard:
        say(f"dashboard   http://{dashboard}/ (metrics at http://{dashboard}/metrics)")
    say(f"            (or kiln --controller {address} ...); Ctrl-C stops everything")
    print(address, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="kiln")
    register(parser.add_subparsers())
    parsed = parser.parse_args(["demo", *sys.argv[1:]])
    sys.exit(parsed.func(parsed))
