"""Benchmark: restart kiln-controller on a large store, then every agent reconnecting at once.

The store: ``--nodes`` nodes (default 25,000) and ``--events`` events
(100,000), written into the controller's SQLite database by the controller's
own store code (``open_engine`` migrates it, ``SqlTx`` repositories add the
rows, seal the BMC passwords and write the JSON columns), in transactions of
1,000 nodes -- enrolling 25,000 nodes through the API is far slower (about
20 nodes/s on 2 cores while the lifecycle inspects each one: see
``bench/bmc_power_sync.py``). The fleet looks as one that ran: racks of 8
HGX nodes (8x H200, leaf per rack, spine per 16 racks) and GB200 NVL72 racks
(18 nodes of 4 GPUs sharing one NVLink clique), a latest health report per
GPU for every node with an inventory; 96 % ready, 2 % in maintenance, 2 %
still inspecting without an inventory (their agents never came); events of
the last 30 days (enrolment, transitions, agent connections). Each node has
its own Redfish URL on a loopback port that refuses connections (the BMCs
are not what is measured here; power sync runs every hour, so its pass does
not fall in the window).

Measured, from ``kiln-controller`` process start (``sys.executable -m
controller.main``): (a) gRPC health SERVING, (b) the first ``ListNodes``
answered (``page_size`` 1000 where the API pages), (c) the whole fleet paged
through. Then ``--agents`` agents (default: one per node) reconnect at once:
``--generators`` processes, each an asyncio loop opening its share of
``AgentService.Connect`` streams over ``--channels`` grpc.aio channels,
send a Register with the GPU inventory an agent builds (``agent/client.py``
``gpu_pb``: uuid, serial, PCI bus and device id, memory, architecture,
clique) and wait for ``Registered``; an attempt that fails is retried with
the agent's backoff (0.5 s doubling to 30 s, jittered), and counted by its
status. Printed: time until all registered (``--storm-timeout`` at most),
registrations/s, time to Registered p50/p99, failed attempts, the
controller's CPU (``/proc/PID/stat``) as cores and per registration, its RSS
over the storm, and ``GetNode`` latency for an already-registered node
(sequential calls, 10 s deadline) before and during the storm. Afterwards:
the fleet paged again (now with every agent connected); the controller's
CPU with the fleet quiet (``--idle-seconds``, 30, from ``--idle-settle``,
20 s, after the storm: every stream open, nothing sent, nothing asked; the
issue's "idle fleet of 25,000 ready nodes", its health reports aside,
which ``fleet_scale.py`` measures); and SIGTERM with every stream open
(killed after 30 s).

A failed attempt that reads ``INTERNAL: Internal error from Core`` is a
stream the server ended before the client's first message went out; gRPC's
asyncio client reports that as INTERNAL whatever the server's status was
(grpc/grpc#36066). Under a storm these, and ``CANCELLED``, come from gRPC
itself, most likely its limits on calls the busy event loop has not yet
picked up (``grpc.server.max_pending_requests``,
``grpc.server_max_unrequested_time_in_server``): a bare grpc.aio server
spending 4 ms of its loop per call sheds some of 3,000 streams the same way.
The controller logs nothing for them.

Real agents have one TCP connection each; here a few channels carry
thousands of streams each, so the controller's per-connection costs
(accepts, TLS) are not measured, and the generators share the 2 cores with
the controller (their CPU is printed too).

Targets (the issue): restart to SERVING <= 5 s with 25,000 nodes; every agent
registered again without the controller falling over.

Run time on a 2-core machine shared with other work: building the default
store 25-112 s (``--reuse DIR`` keeps it for the next run), restart and
paging ~10 s, the storm of 25,000 agents about 1.5 minutes, idle 50 s
(``--storm-timeout``, 900 s, bounds it), SIGTERM ~15 s: about 6 minutes with
``--reuse``, the generators' start included. ``--quick`` (2,500 nodes,
10,000 events, 2,500 agents) about 1.5 minutes.

All the nodes' BMCs share one refusing address, so after a few refused
calls that address's breaker fails every node's BMC call fast: the BMCs
cost next to nothing here, as intended.

``--bmc responder`` puts the benchmark's stand-in Redfish responder
(``fleet_load.py``, in a process of its own, its CPU not counted) on that
address instead: every power read answers On, no chassis shows leak
detectors. Power sync then runs every minute (``--power-sync-interval``)
and the idle figure includes the BMC reads a quiet, connected fleet still
costs: power sync's (a node its connected agent vouches for is read every
``--power-sync-vouched-every`` passes, the others every pass) and the leak
watcher's rediscovery reads. The store then holds what the controller
before the restart kept of its leak reads (every BMC showed no detectors,
the last read within the half hour before: each asked again 0-60 minutes
after the restart, as the watcher before would have); ``--no-leak-looks``
leaves them out, and the restarted watcher asks every BMC at once, and
again 5-10 minutes later, as before those were kept. The
idle window then wants a longer ``--idle-settle`` (240 s: past the first
power sync pass, which begins a minute after start and reads every BMC
whose agent was not back yet). The line says how many power reads a
second the BMCs answered in the window; with ``--bmc-readers N`` the
readers' CPU is in the figure (the controller's own process is said apart).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import shutil
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kiln_process import (
    Controller,
    StoreWriter,
    interrupt_on_sigterm,
    pct,
    raise_fd_limit,
    tree_cpu_seconds,
)

DAY = 86400.0
HGX_RACK, NVL_RACK = 8, 18  # nodes per rack
PAGE = 1000  # ListNodes page size (what the kiln CLI asks for)


# --- the fleet, as a controller that ran would have stored it ----------------------
@dataclass(frozen=True)
class NodeShape:
    name: str
    rack: str
    spine: str
    state: str  # "ready" | "maintenance" | "inspecting"
    gpu_model: str  # NVML name ("" for none)
    gpus: int
    clique: str


def fleet_shape(nodes: int) -> list[NodeShape]:
    """Racks of HGX H200 nodes, every fifth rack a GB200 NVL72; deterministic."""
    out: list[NodeShape] = []
    rack = 0
    while len(out) < nodes:
        nvl = rack % 5 == 4
        size = NVL_RACK if nvl else HGX_RACK
        rack_name = f"r{rack:04d}"
        clique = f"{uuid.UUID(int=rack + 1)}.{rack % 7}" if nvl else ""
        for slot in range(size):
            if len(out) >= nodes:
                break
            i = len(out)
            state = "inspecting" if i % 50 == 7 else "maintenance" if i % 50 == 23 else "ready"
            out.append(
                NodeShape(
                    name=f"{rack_name}-n{slot:02d}",
                    rack=rack_name,
                    spine=f"spine-{rack // 16:03d}",
                    state=state,
                    gpu_model=""
                    if state == "inspecting"
                    else "NVIDIA GB200"
                    if nvl
                    else "NVIDIA H200",
                    gpus=0 if state == "inspecting" else 4 if nvl else 8,
                    clique=clique,
                )
            )
        rack += 1
    return out


def gpu_fields(node: NodeShape) -> list[dict[str, Any]]:
    """The inventory an agent on this node reports (the fields of agent/client.py gpu_pb)."""
    nvl = node.gpu_model == "NVIDIA GB200"
    seed = uuid.uuid5(uuid.NAMESPACE_DNS, node.name).int
    count = node.gpus or (4 if node.name.endswith(("0", "2")) else 8)  # inspecting: its box
    return [
        {
            "index": g,
            "uuid": f"GPU-{uuid.UUID(int=(seed + g) % (1 << 128))}",
            "model": "NVIDIA GB200" if nvl else "NVIDIA H200",
            "serial": f"{1650924000000 + (seed + g) % 10**9}",
            "pci_bus_id": f"00000000:{0x18 + 0x20 * g:02X}:00.0",
            "memory_mib": 189471 if nvl else 143771,
            "architecture": "Blackwell" if nvl else "Hopper",
            "clique": node.clique,
            "pci_device_id": 0x2941 if nvl else 0x2335,
        }
        for g in range(count)
    ]


def bmc_url(port: int, node: str) -> str:
    """The node's BMC URL in the built store, as enrolment canonicalises it."""
    from controller.bmc.address import parse_bmc_url

    return parse_bmc_url(f"redfish+http://127.0.0.1:{port}/redfish/v1/Systems/{node}").url


def build_store(state_dir: Path, shape: list[NodeShape], events: int, port: int) -> None:
    """Write the fleet and ``events`` events with the controller's repositories."""
    from controller.core.health import GpuHealth, HealthReport
    from controller.core.kinds import EventKind
    from controller.core.model import GpuInfo
    from controller.core.records import NewEvent, NodeRecord
    from controller.core.states import NodeState, PowerState

    now = time.time()
    rng = random.Random(7)
    writer = StoreWriter(state_dir)
    try:
        for start in range(0, len(shape), 1000):

            def fill(tx: Any, start: int = start) -> None:
                for node in shape[start : start + 1000]:
                    gpus = [GpuInfo(**g) for g in gpu_fields(node)] if node.gpus else []
                    health = None
                    if gpus:
                        health = HealthReport(
                            sampled_at=now - 30,
                            gpus=tuple(
                                GpuHealth(
                                    index=g.index,
                                    uuid=g.uuid,
                                    temp_c=38.0 + rng.random() * 30,
                                    mem_temp_c=40.0 + rng.random() * 30,
                                    slowdown_c=90.0,
                                    shutdown_c=95.0,
                                    gpu_max_c=87.0,
                                    power_w=120.0 + rng.random() * 500,
                                    power_limit_w=700.0,
                                    sm_clock_mhz=1980,
                                    mem_clock_mhz=2619,
                                    ecc_sbe_aggregate=rng.randrange(3),
                                    remap_correctable=0,
                                    remap_uncorrectable=0,
                                    remap_pending=False,
                                    remap_failure=False,
                                )
                                for g in gpus
                            ),
                        )
                    record = NodeRecord(
                        name=node.name,
                        bmc_url=bmc_url(port, node.name),
                        rack=node.rack,
                        leaf=node.rack,
                        spine=node.spine,
                        bmc_username="kiln",
                        bmc_health="ok",
                        state=NodeState(node.state),
                        state_reason="restart benchmark",
                        drained=node.state == "maintenance",
                        power=PowerState.ON,
                        gpu_model=node.gpu_model.replace("NVIDIA ", ""),
                        gpu_count=len(gpus),
                        nvlink_domain=node.clique,
                        agent_last_seen=now - 30 if gpus else 0.0,
                        health=health,
                        created_at=now - 30 * DAY,
                        updated_at=now - DAY,
                    )
                    tx.nodes.add(record, "bmc-password")
                    if gpus:
                        tx.nodes.set_gpus(node.name, gpus)

            writer.batch(fill)
        steps: list[tuple[EventKind, str, dict[str, Any]]] = [
            (EventKind.NODE_ENROLLED, "enrolled", {}),
            (EventKind.NODE_TRANSITION, "inspection started", {"to_state": "inspecting"}),
            (EventKind.NODE_AGENT, "agent connected", {"gpus": 8}),
            (EventKind.NODE_TRANSITION, "inspected", {"to_state": "preparing"}),
            (EventKind.NODE_TRANSITION, "prepared", {"to_state": "ready"}),
            (EventKind.NODE_AGENT, "agent disconnected", {}),
        ]
        for start in range(0, events, 10000):

            def add_events(tx: Any, start: int = start) -> None:
                for k in range(start, min(start + 10000, events)):
                    node = shape[k % len(shape)]
                    kind, reason, data = steps[(k // len(shape)) % len(steps)]
                    at = now - 30 * DAY + (k / max(1, events)) * 30 * DAY
                    tx.events.add(
                        NewEvent(at=at, kind=kind, node=node.name, reason=reason, data=data)
                    )

            writer.batch(add_events)
    finally:
        writer.close()


# --- the agents (generator child processes) ---------------------------------------
async def generate(address: str, names: list[str], channels: int, timeout: float) -> None:
    """Open one Connect stream per name at "go" (stdin), Register, wait for
    Registered; print {"done": [monotonic...], "errors": {...}} and hold the
    streams open until stdin says "close" (or closes)."""
    import grpc

    from kiln.v1 import agent_pb2, agent_pb2_grpc, types_pb2

    shape = {n.name: n for n in fleet_shape_by_names(names)}
    registers = [
        agent_pb2.AgentMessage(
            register=agent_pb2.Register(
                node_name=name,
                hostname=name,
                agent_version="0.9.0",
                driver_version="570.124.06",
                nvml_backend="fake:h200",
                gpus=[types_pb2.Gpu(**g) for g in gpu_fields(shape[name])],
            )
        )
        for name in names
    ]
    options = [("grpc.max_receive_message_length", 16 << 20)]
    chans = [grpc.aio.insecure_channel(address, options=options) for _ in range(channels)]
    for chan in chans:
        await asyncio.wait_for(chan.channel_ready(), 30)
    stubs = [agent_pb2_grpc.AgentServiceStub(chan) for chan in chans]
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    if (await loop.run_in_executor(None, sys.stdin.readline)).strip() != "go":
        return
    done: list[float] = []
    errors: dict[str, int] = {}
    calls: list[Any] = []

    closing = asyncio.Event()

    async def outgoing(i: int) -> Any:
        yield registers[i]
        await closing.wait()  # the stream stays open, as an agent's does

    retries: list[int] = []

    async def agent(i: int) -> None:
        """Dial until registered, backing off as agent/client.py does (0.5 s
        doubling to 30 s, jittered); every failed attempt is counted by status."""
        delay = 0.5
        for attempt in range(1000):
            call = stubs[i % len(stubs)].Connect(outgoing(i))
            try:
                answer = await call.read()
                if answer is not grpc.aio.EOF and answer.WhichOneof("body") == "registered":
                    calls.append(call)
                    done.append(time.monotonic())
                    retries.append(attempt)
                    return
                key = "no Registered"
            except grpc.aio.AioRpcError as e:
                key = f"{e.code().name}: {(e.details() or '')[:70]}"
            errors[key] = errors.get(key, 0) + 1
            call.cancel()
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 30.0)

    tasks = [asyncio.create_task(agent(i)) for i in range(len(names))]
    _finished, pending = await asyncio.wait(tasks, timeout=timeout)
    if pending:
        errors["still waiting at the timeout"] = len(pending)
    result = {"agents": len(names), "done": done, "errors": errors, "retried": sum(retries)}
    print(json.dumps(result), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # "close" or EOF
    closing.set()
    for call in calls:
        call.cancel()
    for task in pending:
        task.cancel()
    for chan in chans:
        await chan.close()


def fleet_shape_by_names(names: list[str]) -> list[NodeShape]:
    """The shapes of these node names (the fleet is deterministic: rebuilt, then picked)."""
    wanted = set(names)
    last_rack = max(int(n[1:5]) for n in names)
    rebuilt = fleet_shape((last_rack + 1) * NVL_RACK)
    return [s for s in rebuilt if s.name in wanted]


@dataclass
class Generator:
    proc: asyncio.subprocess.Process
    result: dict[str, Any] = field(default_factory=dict)

    async def line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError("an agent generator exited early")
        return raw.decode()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((text + "\n").encode())


async def start_generators(
    address: str, names: list[str], count: int, channels: int, timeout: float, workdir: Path
) -> list[Generator]:
    gens: list[Generator] = []
    for k in range(count):
        share = names[k::count]
        if not share:
            continue
        names_file = workdir / f"agents-{k}.json"
        names_file.write_text(json.dumps(share))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--generate", address, str(names_file),
            "--channels", str(channels), "--storm-timeout", str(timeout),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=64 << 20,
        )  # fmt: skip
        gens.append(Generator(proc))
    for g in gens:
        if (await g.line(120)).strip() != "ready":
            raise RuntimeError("an agent generator did not get ready")
    return gens


# --- the controller side -------------------------------------------------------
async def page_all(stub: Any, timeout: float = 120.0) -> tuple[float, float, int, int, int]:
    """Page through every node; (first page s, all s, pages, nodes, agents connected)."""
    from kiln.v1 import fleet_pb2

    paged = "page_size" in fleet_pb2.ListNodesRequest.DESCRIPTOR.fields_by_name
    t0 = time.monotonic()
    first = 0.0
    pages = nodes = connected = 0
    token = ""
    while True:
        request = fleet_pb2.ListNodesRequest()
        if paged:
            request.page_size = PAGE
            request.page_token = token
        answer = await stub.ListNodes(request, timeout=timeout)
        pages += 1
        if pages == 1:
            first = time.monotonic() - t0
        nodes += len(answer.nodes)
        connected += sum(1 for n in answer.nodes if n.agent_connected)
        token = getattr(answer, "next_page_token", "")
        if not paged or not token:
            return first, time.monotonic() - t0, pages, nodes, connected


async def probe_get_node(
    stub: Any, names: list[str], stop: asyncio.Event, out: list[float], failed: list[str]
) -> None:
    """GetNode on already-registered nodes, one call at a time, until ``stop``."""
    import grpc

    from kiln.v1 import fleet_pb2

    i = 0
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            await stub.GetNode(fleet_pb2.GetNodeRequest(name=names[i % len(names)]), timeout=10)
            out.append(time.monotonic() - t0)
        except grpc.aio.AioRpcError as e:
            failed.append(e.code().name)
        i += 1
        await asyncio.sleep(0.02)


async def register_probes(stub: Any, names: list[str]) -> list[Any]:
    from kiln.v1 import agent_pb2, types_pb2

    shapes = {s.name: s for s in fleet_shape_by_names(names)}
    calls = []
    for name in names:
        call = stub.Connect()
        register = agent_pb2.Register(
            node_name=name,
            hostname=name,
            agent_version="0.9.0",
            nvml_backend="fake:h200",
            gpus=[types_pb2.Gpu(**g) for g in gpu_fields(shapes[name])],
        )
        await call.write(agent_pb2.AgentMessage(register=register))
        answer = await asyncio.wait_for(call.read(), 60)
        if answer.WhichOneof("body") != "registered":
            raise RuntimeError(f"probe agent {name} was not registered")
        calls.append(call)
    return calls


def refused_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prepare_store(
    args: argparse.Namespace, workdir: Path, shape: list[NodeShape]
) -> tuple[Path, int]:
    """A state directory holding the built store: fresh, or a copy of
    ``--reuse``'s; and the loopback port its BMC URLs name."""
    meta = {"nodes": args.nodes, "events": args.events, "version": 1}
    source = args.reuse or workdir / "built"
    stamp = source / "bench-store.json"
    built = json.loads(stamp.read_text()) if stamp.exists() else {}
    if {k: built.get(k) for k in meta} != meta or "bmc_port" not in built:
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        t0 = time.monotonic()
        built = {**meta, "bmc_port": refused_port()}
        build_store(source, shape, args.events, built["bmc_port"])
        stamp.write_text(json.dumps(built))
        size = sum(f.stat().st_size for f in source.glob("kiln.db*")) / 2**20
        print(
            f"  store built with the controller's store code (SqlTx repositories, 1000 nodes "
            f"a transaction): {args.nodes} nodes, {sum(s.gpus for s in shape)} GPUs, "
            f"{args.events} events in {time.monotonic() - t0:.1f}s, {size:.0f} MiB"
        )
    else:
        print(f"  store reused from {source} ({args.nodes} nodes, {args.events} events)")
    state = workdir / "state"
    shutil.copytree(source, state, ignore=shutil.ignore_patterns("bench-store.json"))
    if args.bmc == "responder" and not args.no_leak_looks:
        keep_leak_looks(state, shape, int(built["bmc_port"]))
    return state, int(built["bmc_port"])


def keep_leak_looks(state_dir: Path, shape: list[NodeShape], port: int) -> None:
    """What the leak watcher of the controller before the restart kept: the
    stand-in responder shows no leak detectors, so every BMC showed none at
    its last reads, four or more in a row (the hourly cap), the last within
    the half hour before the restart (each asked again 0-60 minutes after
    it). Without them (``--no-leak-looks``, or a store from before the
    looks were kept) the restarted watcher asks all 25,000 at once."""
    from controller.core.records import LeakLook

    now = time.time()
    rng = random.Random(11)
    looks = {
        node.name: LeakLook(
            bmc_url(port, node.name),
            now - rng.uniform(0.0, 1800.0),
            4,
        )
        for node in shape
    }
    writer = StoreWriter(state_dir)
    try:
        writer.batch(lambda tx: tx.nodes.save_leak_looks(looks))
    finally:
        writer.close()
    print(f"  {len(looks)} BMCs' last leak reads kept as showing no detectors (a fleet that ran)")


async def run(args: argparse.Namespace, workdir: Path) -> int:
    import grpc

    from kiln.v1 import agent_pb2_grpc, fleet_pb2_grpc

    shape = fleet_shape(args.nodes)
    agents = min(args.agents or args.nodes, args.nodes)
    print(
        f"restart of kiln-controller on {args.nodes} nodes and {args.events} events, then "
        f"{agents} agents reconnecting at once ({args.generators} generator processes, "
        f"{args.channels} channels each)"
    )
    state, bmc_port = prepare_store(args, workdir, shape)
    options = ["--power-sync-interval", str(args.power_sync_interval)]
    if args.bmc_readers:
        options += ["--bmc-readers", str(args.bmc_readers)]
    if args.vouched_every:
        options += ["--power-sync-vouched-every", str(args.vouched_every)]
    options += shlex.split(args.controller_options)
    ctl = Controller(state, workdir / "controller.log", options)
    gens: list[Generator] = []
    probes: list[Any] = []
    bmcs = Bmcs(args.bmc, bmc_port)
    try:
        bmcs.start()
        ctl.start()
        serving = await asyncio.to_thread(ctl.wait_serving, 120)
        options = [("grpc.max_receive_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(ctl.address, options=options) as channel:
            fleet = fleet_pb2_grpc.FleetServiceStub(channel)
            first, whole, pages, listed, _ = await page_all(fleet)
            since_start = time.monotonic() - ctl.started_at
            rss0, _ = ctl.memory()
            print(
                f"  (a) SERVING {serving:.2f}s after process start (5s target "
                f"{'MET' if serving <= 5 else 'MISSED'}); (b) first ListNodes page "
                f"({PAGE}) {serving + first:.2f}s; (c) all {listed} nodes in {pages} pages "
                f"{since_start:.2f}s ({whole:.2f}s of paging, {listed / whole:.0f} nodes/s); "
                f"RSS {rss0:.0f} MiB"
            )
            if listed != args.nodes:
                print(f"  !! ListNodes listed {listed} of {args.nodes} nodes")
            ready = [s.name for s in shape if s.state == "ready"]
            probe_names, storm_names = ready[:4], [s.name for s in shape]
            storm_names = [n for n in storm_names if n not in set(probe_names)][: agents - 4]
            agent_stub = agent_pb2_grpc.AgentServiceStub(channel)
            probes = await register_probes(agent_stub, probe_names)
            base: list[float] = []
            base_failed: list[str] = []
            stop = asyncio.Event()
            prober = asyncio.create_task(
                probe_get_node(fleet, probe_names, stop, base, base_failed)
            )
            await asyncio.sleep(3.0)
            stop.set()
            await prober
            print(
                f"  GetNode of a registered node before the storm: p50 "
                f"{pct(base, 0.5) * 1e3:.1f} ms, p99 {pct(base, 0.99) * 1e3:.1f} ms "
                f"({len(base)} calls)"
            )
            gens = await start_generators(
                ctl.address,
                storm_names,
                args.generators,
                args.channels,
                args.storm_timeout,
                workdir,
            )
            storm = await storm_phase(args, ctl, fleet, gens, probe_names)
            settled = await page_all(fleet)
            print(
                f"  after the storm: all {settled[3]} nodes paged in {settled[1]:.2f}s, "
                f"{settled[4]} with an agent connected"
            )
            idle = await idle_phase(args, ctl, bmcs, sum(s.state == "ready" for s in shape))
        t0 = time.monotonic()
        code = ctl.stop(timeout=30)
        stop_s = time.monotonic() - t0
        print(
            f"  SIGTERM with {storm.registered + 4} agent streams open: exit {code} "
            f"in {stop_s:.2f}s"
        )
        errors = ctl.log_count(" ERROR ") + ctl.log_count("Traceback")
        warnings = ctl.log_count(" WARNING ")
        print(f"  controller log: {errors} ERROR/Traceback lines, {warnings} WARNING lines")
        ok = storm.registered == len(storm_names)
        print(
            f"SUMMARY: restart on {args.nodes} nodes/{args.events} events: SERVING "
            f"{serving:.2f}s ({'MET' if serving <= 5 else 'MISSED'} 5s), first page "
            f"{serving + first:.2f}s, all paged {since_start:.2f}s; {storm.registered}/"
            f"{len(storm_names)} agents registered in {storm.all_s:.1f}s "
            f"({storm.rate:.0f}/s, p99 {storm.p99:.1f}s, {storm.failed_attempts} attempts "
            f"refused and retried){'' if ok else ' NOT ALL'}; controller "
            f"{storm.cores:.2f} cores, peak RSS {storm.hwm:.0f} MiB; GetNode p99 "
            f"{pct(base, 0.99) * 1e3:.0f} -> {storm.get_p99 * 1e3:.0f} ms during the storm; "
            f"idle {idle * 100:.1f} % of a core ({'MET' if idle < 0.05 else 'MISSED'} 5 %); "
            f"SIGTERM exit {code} after {stop_s:.1f}s"
        )
    finally:
        for call in probes:
            call.cancel()
        ctl.stop()
        bmcs.stop()
        for g in gens:
            with contextlib.suppress(Exception):
                g.send("close")
                assert g.proc.stdin is not None
                g.proc.stdin.close()
        for g in gens:
            try:
                await asyncio.wait_for(g.proc.wait(), 10)
            except TimeoutError:
                g.proc.kill()
                await g.proc.wait()
    return 0


@dataclass
class Storm:
    registered: int
    all_s: float
    rate: float
    p99: float
    cores: float
    hwm: float
    get_p99: float
    failed_attempts: int


async def storm_phase(
    args: argparse.Namespace, ctl: Controller, fleet: Any, gens: list[Generator], probes: list[str]
) -> Storm:
    latencies: list[float] = []
    failed: list[str] = []
    stop = asyncio.Event()
    cpu0 = ctl.cpu()
    gen_cpu0 = [cpu(g.proc.pid) for g in gens]
    t_go = time.monotonic()
    for g in gens:
        g.send("go")
    prober = asyncio.create_task(probe_get_node(fleet, probes, stop, latencies, failed))
    samples: list[tuple[float, float, float]] = []  # (t, cpu, rss)

    async def sample() -> None:
        while not stop.is_set():
            rss, _ = ctl.memory()
            samples.append((time.monotonic() - t_go, ctl.cpu() - cpu0, rss))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    try:
        for g in gens:
            g.result = json.loads(await g.line(args.storm_timeout + 60))
    finally:
        stop.set()
        await prober
        await sampler
    done = sorted(t - t_go for g in gens for t in g.result["done"])
    errors: dict[str, int] = {}
    for g in gens:
        for code, count in g.result["errors"].items():
            errors[code] = errors.get(code, 0) + count
    wall = done[-1] if done else time.monotonic() - t_go
    cpu_used = ctl.cpu() - cpu0
    _, hwm = ctl.memory()
    gen_cpu = sum(cpu(g.proc.pid) - c for g, c in zip(gens, gen_cpu0, strict=True))
    half = done[len(done) // 2] if done else float("nan")
    retried = sum(int(g.result.get("retried", 0)) for g in gens)
    print(
        f"  storm: {len(done)} of {storm_size(gens)} registered; all in {wall:.1f}s "
        f"({len(done) / wall:.0f}/s), half by {half:.1f}s; time to Registered p50 "
        f"{pct(done, 0.5):.1f}s p99 {pct(done, 0.99):.1f}s; {sum(errors.values())} attempts "
        f"failed and were retried with the agent's backoff ({retried} retries by agents that "
        f"then registered): {errors or 'none'}"
    )
    print(
        f"  controller during the storm: {cpu_used:.1f}s CPU = {cpu_used / wall:.2f} cores, "
        f"{cpu_used / max(1, len(done)) * 1e3:.2f} ms per registration; RSS peak {hwm:.0f} MiB; "
        f"generators {gen_cpu:.1f}s CPU"
    )
    if samples:
        marks = samples[:: max(1, len(samples) // 8)]
        print(
            "  over time (s: CPU s, RSS MiB): "
            + ", ".join(f"{t:.0f}: {c:.0f}, {r:.0f}" for t, c, r in marks)
        )
    print(
        f"  GetNode of a registered node during the storm: p50 {pct(latencies, 0.5) * 1e3:.1f} "
        f"ms, p99 {pct(latencies, 0.99) * 1e3:.1f} ms, max {max(latencies, default=0) * 1e3:.0f}"
        f" ms ({len(latencies)} calls, {len(failed)} failed {sorted(set(failed))})"
    )
    return Storm(
        registered=len(done),
        all_s=wall,
        rate=len(done) / wall if wall else 0.0,
        p99=pct(done, 0.99),
        cores=cpu_used / wall if wall else 0.0,
        hwm=hwm,
        get_p99=pct(latencies, 0.99),
        failed_attempts=sum(errors.values()),
    )


async def idle_phase(args: argparse.Namespace, ctl: Controller, bmcs: Bmcs, ready: int) -> float:
    """The controller's CPU (its BMC readers' included) with the fleet quiet:
    every stream open, nothing sent, nothing asked (after ``--idle-settle``
    seconds for the storm's aftermath). Returns cores."""
    await asyncio.sleep(args.idle_settle)
    c0, own0, t0 = tree_cpu_seconds(ctl.pid), cpu(ctl.pid), time.monotonic()
    served0 = bmcs.served()
    await asyncio.sleep(args.idle_seconds)
    took = time.monotonic() - t0
    cores = (tree_cpu_seconds(ctl.pid) - c0) / took
    own = (cpu(ctl.pid) - own0) / took
    reads = (bmcs.served() - served0) / took
    print(
        f"  idle: {args.nodes} nodes ({ready} ready), every agent stream open and quiet, "
        f"nothing asked: {cores * 100:.1f} % of a core over {args.idle_seconds:.0f}s "
        f"(the controller's own process {own * 100:.1f} %), "
        f"{args.idle_settle:.0f}s after the storm (target < 5 %: "
        f"{'MET' if cores < 0.05 else 'MISSED'}); "
        + (
            f"the BMCs answered {reads:.1f} power reads a second"
            if args.bmc == "responder"
            else "every BMC refuses connections"
        )
    )
    return cores


class Bmcs:
    """The nodes' BMCs: one loopback port that refuses connections, or the
    benchmark's stand-in Redfish responder there (``fleet_load.py``: every
    system on, no leak detectors), counting the System reads it served."""

    def __init__(self, kind: str, port: int) -> None:
        self.kind = kind
        self.port = port
        self._conn: Any = None
        self._proc: Any = None

    def start(self) -> None:
        if self.kind != "responder":
            return
        import multiprocessing

        from fleet_load import responder_main

        self._conn, theirs = multiprocessing.Pipe()
        self._proc = multiprocessing.Process(
            target=responder_main, args=(theirs, self.port), daemon=True
        )
        self._proc.start()
        if not self._conn.poll(30) or self._conn.recv() != "ready":
            raise RuntimeError(
                f"the BMC responder could not serve port {self.port} (the store's BMC "
                f"URLs name it): run without --reuse to build a store on a free port"
            )

    def served(self) -> int:
        """System documents served so far (0 for refusing BMCs)."""
        if self._conn is None:
            return 0
        self._conn.send(("count",))
        return int(self._conn.recv().get("system", 0))

    def stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(("quit",))
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = None


def storm_size(gens: list[Generator]) -> int:
    return sum(int(g.result.get("agents", 0)) for g in gens)


def cpu(pid: int) -> float:
    from kiln_process import cpu_seconds

    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=25000)
    parser.add_argument("--events", type=int, default=100000)
    parser.add_argument("--agents", type=int, default=0, help="agents reconnecting (0: all)")
    parser.add_argument("--quick", action="store_true", help="2,500 nodes, 10,000 events")
    parser.add_argument("--generators", type=int, default=4, help="agent generator processes")
    parser.add_argument("--channels", type=int, default=4, help="grpc.aio channels each")
    parser.add_argument("--storm-timeout", type=float, default=900.0)
    parser.add_argument("--idle-settle", type=float, default=20.0, help="s after the storm")
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="s of idle measured")
    parser.add_argument(
        "--bmc",
        choices=("refusing", "responder"),
        default="refusing",
        help="the nodes' BMCs: one loopback port refusing connections (default), or a "
        "stand-in Redfish responder answering every power read (then power sync runs "
        "every minute and the idle figure includes its reads)",
    )
    parser.add_argument(
        "--power-sync-interval",
        type=float,
        default=0.0,
        help="the controller's --power-sync-interval (0: 3600 with refusing BMCs, so no "
        "pass falls in the windows; 60, the default, with the responder)",
    )
    parser.add_argument("--bmc-readers", type=int, default=0, help="the controller's")
    parser.add_argument(
        "--vouched-every",
        type=int,
        default=0,
        help="the controller's --power-sync-vouched-every (0: its default)",
    )
    parser.add_argument(
        "--controller-options",
        default="",
        help="more kiln-controller options, as one string (e.g. '--power-sync-spread 0')",
    )
    parser.add_argument(
        "--no-leak-looks",
        action="store_true",
        help="with --bmc responder: keep no earlier leak reads in the store (the "
        "restarted watcher asks every BMC at once, as before they were kept)",
    )
    parser.add_argument("--reuse", type=Path, help="keep the built store here and reuse it")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it")
    parser.add_argument("--generate", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    raise_fd_limit()
    if args.generate:
        names = json.loads(Path(args.generate[1]).read_text())
        asyncio.run(generate(args.generate[0], names, args.channels, args.storm_timeout))
        return 0
    interrupt_on_sigterm()
    if args.quick:
        args.nodes, args.events = 2500, 10000
    if not args.power_sync_interval:
        args.power_sync_interval = 60.0 if args.bmc == "responder" else 3600.0
    if args.keep:
        shutil.rmtree(args.keep / "state", ignore_errors=True)
        args.keep.mkdir(parents=True, exist_ok=True)
        return asyncio.run(run(args, args.keep))
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        return asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
