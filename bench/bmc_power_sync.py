"""Benchmark: power sync of N Redfish BMCs in a real kiln-controller process.

What is measured: the production path end to end. A ``kiln-controller``
process (SQLite in a temporary directory, loopback, so no authentication)
holds ``--nodes`` nodes, each with its own Redfish system URL on a latency
responder, and runs its own power sync every ``--interval`` seconds
(``--power-sync-interval``): ``PowerSync.run_once`` reads every node, unseals
its BMC password, polls every BMC through ``PoolGateway.poll_power`` (for
Redfish one GET on the event loop, ``controller/bmc/http_get.py``; with
``--bmc-readers`` in the readers; 256 BMCs at once) and writes back
only the nodes whose power or BMC health changed. Each pass ends with the
controller's own log line ``power sync: N BMCs in X.Xs, W changed, D not as
expected``, which is what is parsed: wall time and rows written per pass.
Controller CPU is ``utime + stime`` of ``/proc/PID/stat`` (every thread;
with ``--bmc-readers N`` its reader processes' too, and its own share apart),
within each pass (from its start, ``--interval`` after the previous line, to
its line) and between passes, and as cores over the measured window; RSS and
peak RSS from ``/proc/PID/status``.

The responder (``--responders`` child processes, each one asyncio HTTP server)
stands in for the BMCs: it answers the Redfish service root and
``/redfish/v1/Systems/<id>`` (with ``PowerState``) after ``--latency``
seconds. A tenth of the systems are off; between measured passes the
benchmark flips ``--flip`` of them (through the responder's stdin), so the
pass after should write exactly that many rows.

The fleet. ``--api-nodes`` nodes (default 300) are enrolled through the API
(``EnrollNode``, then ``DrainNode``, ``--enrol-concurrency`` nodes in
flight; the time and the controller's CPU per node are printed). The other
nodes are written before the controller starts with its own store code
(``SqlTx`` repositories: rows, sealed passwords, events) as enrolment and a
drain leave them, because enrolment through the API runs at ~20 nodes/s on 2
cores (``--api-nodes 10000`` takes ~8 minutes): every EnrollNode pokes the
lifecycle, which inspects the node (two BMC reads, a few transactions).
Nodes are drained into maintenance so the lifecycle leaves them alone, as it
leaves ready and allocated nodes alone; without agents it would re-inspect
every node with backoff, keeping 64 BMC calls in flight for as long as the
run. The responder answers at once during this setup; the first pass that
covers every node writes the first sightings (power read for the first time)
and connects every BMC handle. Then the responder switches to ``--latency``
and ``--passes`` passes are measured, the first ``--steady`` of them with
nothing flipped (should write 0 rows). ``--cold`` then restarts the
controller on the same database: its first pass meets every BMC anew (a new
HTTP session each, one GET of the system; the store's BMC health says each
answered before, so they get every thread), beside the leak watcher's first
pass, which asks every BMC for its detectors at the same time.
The per-client request rate is raised (``--max-requests-per-second-per-client``)
so that the enrolment is not throttled at 200/s. "not as expected" counts API
nodes that were off when inspected: inspection asked their BMC to power on,
so Kiln expects them on.

The floor, measured in the same run on the same responder before the
controller starts: a bare asyncio client (HTTP/1.1 over
``asyncio.open_connection``, one kept-alive connection per worker, no
library) reading every system once with the controller's concurrency (256);
and the ideal ``N / concurrency x latency``. Ratios to both are printed.
Targets (the issue): 10,000 BMCs in <= 60 s per pass on this path, controller
CPU under one core.

Run time on a 2-core machine shared with other work: defaults (10,000 nodes,
1.0 s, 20 s interval) about 5.5 minutes: floor 40 s, store 20 s, API
enrolment 12 s, the first-sighting pass 80-90 s (CPU-bound: every BMC new),
two measured passes ~2.5 minutes. ``--nodes 2000 --latency 0.2 --interval
15`` about 1.5 minutes; ``--cold`` adds a restart and its first pass (53 s
at 10,000 BMCs and 1 s with ``--bmc-readers 1``; 262 s before a first read
was one round trip and the store's word counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kiln_process import (
    POWER_SYNC_LINE,
    Controller,
    StoreWriter,
    interrupt_on_sigterm,
    kill_all,
    pct,
    raise_fd_limit,
)

from controller.core.power_sync import pause_before_next
from controller.sim.ports import free_port

USER, PASSWORD = "bench", "bench-password"
POWER_SYNC_CONCURRENCY = 256  # PowerSync's default; the controller has no option for it


# --- the latency responder (a child process) ----------------------------------
ROOT_DOC: dict[str, object] = {
    "@odata.id": "/redfish/v1/",
    "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
    "Id": "RootService",
    "Name": "Latency responder",
    "RedfishVersion": "1.5.0",
    "UUID": "00000000-0000-0000-0000-000000000000",
    "Systems": {"@odata.id": "/redfish/v1/Systems"},
}


def initially_on(ident: str) -> bool:
    return sum(map(ord, ident)) % 10 != 0  # a tenth of the fleet is off


def _response(body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + data


class Responder:
    """Answers every GET after ``latency`` seconds; flips are toggles of systems."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.flipped: set[str] = set()
        self.requests = 0

    def system(self, ident: str) -> dict[str, object]:
        on = initially_on(ident) != (ident in self.flipped)
        return {
            "@odata.id": f"/redfish/v1/Systems/{ident}",
            "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
            "Id": ident,
            "Name": ident,
            "PowerState": "On" if on else "Off",
            "Status": {"State": "Enabled", "Health": "OK"},
        }

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode().split("?", 1)[0].rstrip("/")
                self.requests += 1
                if self.latency > 0:
                    await asyncio.sleep(self.latency)
                if path.startswith("/redfish/v1/Systems/"):
                    writer.write(_response(self.system(path.rsplit("/", 1)[1])))
                else:
                    writer.write(_response(ROOT_DOC))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except IndexError:  # not HTTP
            pass
        finally:
            writer.close()

    def command(self, line: str) -> str:
        """``latency S`` | ``flip ID ID ...`` | ``stats``; answers one line."""
        word, _, rest = line.strip().partition(" ")
        if word == "latency":
            self.latency = float(rest)
        elif word == "flip":
            self.flipped.symmetric_difference_update(rest.split())
        return f"ok {self.requests} {time.process_time():.2f}"


async def serve(port: int, latency: float) -> None:
    responder = Responder(latency)
    server = await asyncio.start_server(responder.handle, "127.0.0.1", port, backlog=4096)
    loop = asyncio.get_running_loop()
    print(f"ready {port}", flush=True)
    async with server:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:  # the parent went away
                return
            print(responder.command(line), flush=True)


class ResponderProcess:
    def __init__(self, latency: float) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port), "--latency", str(latency)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline().startswith("ready"):
            raise RuntimeError("the latency responder did not start")

    def send(self, line: str) -> tuple[int, float]:
        """Send one command; (requests served so far, responder CPU seconds)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        if not answer or answer[0] != "ok":
            raise RuntimeError(f"the latency responder answered {answer!r}")
        return int(answer[1]), float(answer[2])


class Responders:
    """``count`` responder processes; system i lives on responder i % count."""

    def __init__(self, count: int, latency: float) -> None:
        self.members: list[ResponderProcess] = []
        try:
            for _ in range(count):
                self.members.append(ResponderProcess(latency))
        except BaseException:
            self.close()
            raise

    def port_of(self, i: int) -> int:
        return self.members[i % len(self.members)].port

    def set_latency(self, latency: float) -> None:
        for m in self.members:
            m.send(f"latency {latency}")

    def flip(self, indices: list[int], ident: list[str]) -> None:
        by_member: dict[int, list[str]] = {}
        for i in indices:
            by_member.setdefault(i % len(self.members), []).append(ident[i])
        for k, names in by_member.items():
            self.members[k].send("flip " + " ".join(names))

    def stats(self) -> tuple[int, float]:
        """(requests served, CPU seconds), all responders together."""
        answers = [m.send("stats") for m in self.members]
        return sum(a[0] for a in answers), sum(a[1] for a in answers)

    def close(self) -> None:
        for m in self.members:
            if m.proc.stdin is not None:
                m.proc.stdin.close()
        kill_all([m.proc for m in self.members])


# --- the floor: a bare asyncio HTTP/1.1 client ---------------------------------
async def floor_pass(
    responders: Responders, ident: list[str], concurrency: int, timeout: float
) -> tuple[float, float, int]:
    """Read every system once, ``concurrency`` at a time, one kept-alive
    connection per worker and responder; returns (wall s, CPU s, failures)."""
    todo = list(range(len(ident)))
    failures = 0

    async def worker() -> None:
        nonlocal failures
        conns: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        try:
            while todo:
                i = todo.pop()
                port = responders.port_of(i)
                if port not in conns:
                    conns[port] = await asyncio.open_connection("127.0.0.1", port)
                reader, writer = conns[port]
                writer.write(
                    f"GET /redfish/v1/Systems/{ident[i]} HTTP/1.1\r\n"
                    f"Host: 127.0.0.1:{port}\r\nAccept: application/json\r\n\r\n".encode()
                )
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                doc = json.loads(await reader.readexactly(length))
                if doc.get("PowerState") not in ("On", "Off"):
                    failures += 1
        finally:
            for _reader, writer in conns.values():
                writer.close()

    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout)
    return time.monotonic() - t0, time.process_time() - cpu0, failures


# --- the controller side ---------------------------------------------------------
@dataclass
class Pass:
    bmcs: int
    wall: float  # the controller's own figure
    written: int
    drifted: int
    seen_at: float  # monotonic, when the bench read the line
    cpu_at: float  # controller CPU then (its BMC readers' included)
    own_at: float  # the controller process's own CPU then


class PassWatcher:
    """Reads the controller's ``power sync:`` lines as they are logged."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.warnings: dict[str, int] = {}

    async def next(self, timeout: float) -> Pass:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.ctl.new_log_lines():
                if " WARNING " in line or " ERROR " in line or "Traceback" in line:
                    key = line.split(": ", 1)[-1][:90]
                    key = "".join("N" if c.isdigit() else c for c in key)
                    self.warnings[key] = self.warnings.get(key, 0) + 1
                m = POWER_SYNC_LINE.search(line)
                if m:
                    return Pass(
                        int(m[1]),
                        float(m[2]),
                        int(m[3]),
                        int(m[4]),
                        time.monotonic(),
                        self.ctl.cpu(),
                        self.ctl.own_cpu(),
                    )
            if not self.ctl.alive():
                raise RuntimeError(f"kiln-controller exited; see {self.ctl.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no power sync pass logged within {timeout:.0f}s")
            await asyncio.sleep(0.1)


async def enrol_and_drain(
    address: str, ident: list[str], urls: list[str], in_flight: int, timeout: float
) -> tuple[float, list[float], list[float], int]:
    """EnrollNode, then DrainNode, for every node, ``in_flight`` nodes at a time.

    Returns (wall s, EnrollNode latencies, DrainNode latencies, calls retried
    on RESOURCE_EXHAUSTED)."""
    import grpc

    from kiln.v1 import fleet_pb2, fleet_pb2_grpc

    retried = 0
    enrol_s: list[float] = []
    drain_s: list[float] = []
    todo = list(range(len(ident) - 1, -1, -1))

    async def call(method: object, request: object, into: list[float]) -> None:
        nonlocal retried
        for attempt in range(20):
            t0 = time.monotonic()
            try:
                await method(request, timeout=60)  # type: ignore[operator]
                into.append(time.monotonic() - t0)
                return
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or attempt == 19:
                    raise
                retried += 1
                await asyncio.sleep(0.05 * (attempt + 1))

    async with grpc.aio.insecure_channel(address) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)

        async def worker() -> None:
            while todo:
                i = todo.pop()
                enrol = fleet_pb2.EnrollNodeRequest(
                    name=ident[i],
                    bmc_url=urls[i],
                    username=USER,
                    password=PASSWORD,
                    rack=f"rack-{i // 32:04d}",
                )
                await call(stub.EnrollNode, enrol, enrol_s)
                drain = fleet_pb2.DrainNodeRequest(name=ident[i], reason="power sync benchmark")
                await call(stub.DrainNode, drain, drain_s)

        t0 = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(in_flight))), timeout)
    return time.monotonic() - t0, enrol_s, drain_s, retried


async def count_not_in_maintenance(address: str) -> int:
    """Nodes still enrolled, inspecting or draining (paged when ListNodes pages)."""
    import grpc

    from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

    paged = "page_size" in fleet_pb2.ListNodesRequest.DESCRIPTOR.fields_by_name
    total = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        for state in (
            types_pb2.NODE_STATE_ENROLLED,
            types_pb2.NODE_STATE_INSPECTING,
            types_pb2.NODE_STATE_DRAINING,
        ):
            token = ""
            while True:
                request = fleet_pb2.ListNodesRequest(state=state)
                if paged:
                    request.page_size = 2000
                    request.page_token = token
                answer = await stub.ListNodes(request, timeout=60)
                total += len(answer.nodes)
                token = getattr(answer, "next_page_token", "")
                if not paged or not token:
                    break
    return total


def write_fleet(state_dir: Path, ident: list[str], urls: list[str]) -> None:
    """Nodes as enrolment and a drain leave them (in maintenance, power not yet
    read), with their events, written by the controller's own repositories."""
    from controller.bmc.address import parse_bmc_url
    from controller.core.eventlog import record
    from controller.core.kinds import EventKind
    from controller.core.records import NodeRecord
    from controller.core.states import NodeState

    writer = StoreWriter(state_dir)
    now = time.time()
    try:
        for start in range(0, len(ident), 2000):

            def fill(tx: Any, start: int = start) -> None:
                for i in range(start, min(start + 2000, len(ident))):
                    url = parse_bmc_url(urls[i]).url
                    node = NodeRecord(
                        name=ident[i],
                        bmc_url=url,
                        rack=f"rack-{i // 32:04d}",
                        leaf=f"rack-{i // 32:04d}",
                        bmc_username=USER,
                        state=NodeState.MAINTENANCE,
                        state_reason="power sync benchmark",
                        drained=True,
                        created_at=now,
                        updated_at=now,
                    )
                    tx.nodes.add(node, PASSWORD)
                    record(
                        tx, EventKind.NODE_ENROLLED, node=node.name, reason="enrolled", bmc_url=url
                    )
                    record(
                        tx,
                        EventKind.NODE_TRANSITION,
                        node=node.name,
                        reason="power sync benchmark",
                        from_state="enrolled",
                        to_state="maintenance",
                    )

            writer.batch(fill)
    finally:
        writer.close()


# --- main ----------------------------------------------------------------------------
async def run(args: argparse.Namespace, workdir: Path) -> int:
    n, latency, interval = args.nodes, args.latency, args.interval
    conc = POWER_SYNC_CONCURRENCY
    ideal = n / conc * latency
    pass_timeout = interval + 20 * ideal + 120
    ident = [f"node-{i:05d}" for i in range(n)]
    print(
        f"power sync of {n} Redfish BMCs at {latency}s per call through kiln-controller "
        f"(--power-sync-interval {interval:g}), {args.responders} responder process(es)"
    )
    responders = Responders(args.responders, 0.0)
    ctl: Controller | None = None
    try:
        urls = [
            f"redfish+http://127.0.0.1:{responders.port_of(i)}/redfish/v1/Systems/{ident[i]}"
            for i in range(n)
        ]
        floor_wall = float("nan")
        if not args.no_floor:
            responders.set_latency(latency)
            floor_wall, floor_cpu, floor_failed = await floor_pass(
                responders, ident, conc, pass_timeout
            )
            responders.set_latency(0.0)
            print(
                f"  floor (bare asyncio HTTP/1.1, {conc} connections): {n} systems in "
                f"{floor_wall:.1f}s, client CPU {floor_cpu:.1f}s, {floor_failed} failed; "
                f"ideal N/{conc} x {latency}s = {ideal:.1f}s"
            )
        api = min(n, args.api_nodes)
        stored = n - api
        t0 = time.monotonic()
        write_fleet(workdir / "state", ident[:stored], urls[:stored])
        if stored:
            print(
                f"  {stored} nodes written in maintenance with the controller's store code "
                f"in {time.monotonic() - t0:.1f}s (the other {api} go through the API)"
            )
        ctl = Controller(
            workdir / "state",
            workdir / "controller.log",
            [
                "--power-sync-interval", str(interval),
                "--max-requests-per-second-per-client", "1000000",
                *reader_flags(args),
            ],
        )  # fmt: skip
        ctl.start()
        serving = await asyncio.to_thread(ctl.wait_serving, 120)
        watcher = PassWatcher(ctl)
        print(f"  kiln-controller pid {ctl.pid} SERVING {serving:.1f}s after start")
        setup_t0, setup_cpu0 = time.monotonic(), ctl.cpu()
        enrol_rate = float("nan")
        if api:
            enrolled_s, enrol_lat, drain_lat, retried = await enrol_and_drain(
                ctl.address, ident[stored:], urls[stored:], args.enrol_concurrency, timeout=900
            )
            enrol_rate = api / enrolled_s
            print(
                f"  enrolled and drained {api} nodes through the API in {enrolled_s:.1f}s "
                f"({enrol_rate:.0f} nodes/s, {args.enrol_concurrency} in flight; controller CPU "
                f"{(ctl.cpu() - setup_cpu0) / api * 1e3:.0f} ms per node); EnrollNode p50 "
                f"{pct(enrol_lat, 0.5) * 1e3:.0f} ms p99 {pct(enrol_lat, 0.99) * 1e3:.0f} ms, "
                f"DrainNode p50 {pct(drain_lat, 0.5) * 1e3:.0f} ms p99 "
                f"{pct(drain_lat, 0.99) * 1e3:.0f} ms; {retried} retried on RESOURCE_EXHAUSTED"
            )
        deadline = time.monotonic() + 300
        while (left := await count_not_in_maintenance(ctl.address)) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{left} nodes not in maintenance after 300s")
            await asyncio.sleep(2.0)
        print(
            f"  all in maintenance {time.monotonic() - setup_t0:.1f}s after SERVING; "
            f"controller CPU during setup {ctl.cpu() - setup_cpu0:.1f}s"
        )
        setup_passes: list[Pass] = []
        while True:  # a pass over every node: all handles connected, first sightings written
            p = await watcher.next(pass_timeout)
            setup_passes.append(p)
            if p.bmcs == n:
                break
        responders.set_latency(latency)
        first_sightings = sum(p.written for p in setup_passes)
        print(
            f"  setup passes (responder at 0 s): {len(setup_passes)}, "
            + ", ".join(f"{p.bmcs} BMCs {p.wall:.1f}s {p.written} written" for p in setup_passes)
            + f"; first sightings written: {first_sightings} of {n}"
        )
        measured = await measure(args, ctl, watcher, responders, ident, setup_passes[-1])
        rss, hwm = ctl.memory()
        code = ctl.stop()
        print(
            f"  kiln-controller stopped (exit {code}); RSS {rss:.0f} MiB at the end, peak {hwm:.0f}"
        )
        cold: Pass | None = None
        if args.cold:
            cold = await cold_pass(args, workdir, pass_timeout)
        if watcher.warnings:
            print("  controller WARNING/ERROR lines (digits as N):")
            for text, count in sorted(watcher.warnings.items(), key=lambda kv: -kv[1])[:8]:
                print(f"    {count:6d}x {text}")
        summarize(args, measured, cold, floor_wall, ideal, enrol_rate, first_sightings, hwm)
    finally:
        if ctl is not None:
            ctl.stop()
        responders.close()
    return 0


@dataclass
class Measured:
    passes: list[Pass]
    pass_cpu: list[float]  # controller CPU within each pass
    flips: list[int]  # systems flipped before each pass
    cores: float  # controller CPU / wall over the measured window
    idle_cores: float  # between passes
    responder_requests: list[int]


async def measure(
    args: argparse.Namespace,
    ctl: Controller,
    watcher: PassWatcher,
    responders: Responders,
    ident: list[str],
    last: Pass,
) -> Measured:
    n, interval = args.nodes, args.interval
    flip_count = max(1, round(n * args.flip)) if args.flip > 0 else 0
    step = max(1, n // max(1, flip_count))
    out = Measured([], [], [], 0.0, 0.0, [])
    window_t0, window_cpu0 = last.seen_at, last.cpu_at
    idle_cpu = idle_wall = 0.0
    requests0, _ = responders.stats()
    flips = 0
    for k in range(args.passes):
        # The pass starts ``interval`` s after the last one began, and at least a
        # quarter of an interval after it ended (``pause_before_next``): sample CPU then.
        pause = pause_before_next(last.seen_at - last.wall, last.seen_at, interval)
        await asyncio.sleep(max(0.0, last.seen_at + pause - 0.3 - time.monotonic()))
        start_cpu, start_own, start_t = ctl.cpu(), ctl.own_cpu(), time.monotonic()
        idle_cpu += start_cpu - last.cpu_at
        idle_wall += start_t - last.seen_at
        p = await watcher.next(interval + 20 * n / POWER_SYNC_CONCURRENCY * args.latency + 120)
        requests, _ = responders.stats()
        out.passes.append(p)
        out.pass_cpu.append(p.cpu_at - start_cpu)
        out.flips.append(flips)
        out.responder_requests.append(requests - requests0)
        requests0 = requests
        print(
            f"  pass {k + 1}: {p.bmcs} BMCs in {p.wall:.1f}s, {p.written} written "
            f"({flips} systems flipped before it: "
            f"{'as many' if p.written == flips else 'NOT as many'}), {p.drifted} not as expected; "
            f"controller CPU {out.pass_cpu[-1]:.1f}s in the pass "
            f"({out.pass_cpu[-1] / max(p.wall, 1e-9):.2f} cores"
            + (
                f"; the controller's own process {p.own_at - start_own:.1f}s, the rest its "
                f"{args.bmc_readers} BMC readers"
                if args.bmc_readers > 0
                else ""
            )
            + f"), {out.responder_requests[-1]} requests answered"
        )
        last = p
        flips = 0
        if flip_count and args.steady <= k + 1 < args.passes:  # the next pass is a flipped one
            chosen = [(k * 7 + j * step) % n for j in range(flip_count)]
            responders.flip(chosen, ident)
            flips = len(set(chosen))
    wall = last.seen_at - window_t0
    out.cores = (last.cpu_at - window_cpu0) / wall
    out.idle_cores = idle_cpu / max(idle_wall, 1e-9)
    print(
        f"  controller CPU over the {wall:.0f}s window: {out.cores:.2f} cores "
        f"({out.idle_cores:.2f} cores between passes)"
    )
    return out


def reader_flags(args: argparse.Namespace) -> list[str]:
    return ["--bmc-readers", str(args.bmc_readers)] if args.bmc_readers > 0 else []


async def cold_pass(args: argparse.Namespace, workdir: Path, timeout: float) -> Pass:
    """Restart the controller on the same database; its first pass meets every BMC anew."""
    cold = Controller(
        workdir / "state",
        workdir / "controller-cold.log",
        ["--power-sync-interval", str(args.interval), *reader_flags(args)],
    )
    cold.start()
    try:
        await asyncio.to_thread(cold.wait_serving, 120)
        watcher = PassWatcher(cold)
        cpu0 = cold.cpu()
        p = await watcher.next(timeout + 20 * args.nodes / POWER_SYNC_CONCURRENCY * args.latency)
        print(
            f"  cold pass after a restart: {p.bmcs} BMCs in {p.wall:.1f}s, {p.written} written, "
            f"controller CPU {p.cpu_at - cpu0:.1f}s since SERVING"
        )
        return p
    finally:
        cold.stop()


def summarize(
    args: argparse.Namespace,
    m: Measured,
    cold: Pass | None,
    floor_wall: float,
    ideal: float,
    enrol_rate: float,
    first_sightings: int,
    hwm: float,
) -> None:
    n = args.nodes
    walls = [p.wall for p in m.passes]
    worst = max(walls)
    steady = [p.written for p, f in zip(m.passes, m.flips, strict=True) if f == 0]
    flipped = [(f, p.written) for p, f in zip(m.passes, m.flips, strict=True) if f]
    floor = (
        f"{worst / floor_wall:.2f}x floor {floor_wall:.1f}s, " if floor_wall == floor_wall else ""
    )
    if n >= 10000 and args.latency >= 1.0:
        target = "60s target " + ("MET" if worst <= 60 else "MISSED")
    else:
        target = "60s target is for 10,000 BMCs at 1 s"
    core = "under 1 core" if m.cores < 1 else "OVER 1 core"
    flips = ", ".join(f"{f} flipped -> {w} written" for f, w in flipped) or "no flips"
    cold_text = f"; cold pass after restart {cold.wall:.1f}s" if cold is not None else ""
    print(
        f"SUMMARY: {n} BMCs @ {args.latency}s via kiln-controller: pass {min(walls):.1f}-"
        f"{worst:.1f}s ({floor}{worst / ideal:.2f}x ideal {ideal:.1f}s), {target}; "
        f"CPU {m.cores:.2f} cores ({core}), {sum(m.pass_cpu) / len(m.pass_cpu):.1f}s per pass, "
        f"peak RSS {hwm:.0f} MiB; rows written: first sightings {first_sightings}, steady "
        f"{steady or '-'}, {flips}{cold_text}; API enrolment {enrol_rate:.0f} nodes/s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", "--n", type=int, default=10000)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per BMC answer")
    parser.add_argument(
        "--interval", type=float, default=20.0, help="the controller's --power-sync-interval"
    )
    parser.add_argument("--passes", type=int, default=2, help="measured passes")
    parser.add_argument(
        "--steady", type=int, default=1, help="measured passes before the first flip"
    )
    parser.add_argument("--flip", type=float, default=0.01, help="share of systems flipped")
    parser.add_argument("--responders", type=int, default=1)
    parser.add_argument(
        "--bmc-readers",
        type=int,
        default=0,
        help="the controller's --bmc-readers: its power sync reads in N child processes "
        "(their CPU is counted in the controller's)",
    )
    parser.add_argument("--enrol-concurrency", type=int, default=64)
    parser.add_argument(
        "--api-nodes",
        type=int,
        default=300,
        help="nodes enrolled (and drained) through the API; the rest are written with the "
        "controller's store code before it starts (default %(default)s)",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the bare-client floor")
    parser.add_argument("--cold", action="store_true", help="also measure a cold pass")
    parser.add_argument("--keep", type=Path, help="keep the state and logs in this directory")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    raise_fd_limit()
    if args.serve:
        asyncio.run(serve(args.serve, args.latency))
        return 0
    interrupt_on_sigterm()
    if args.keep:
        shutil.rmtree(args.keep / "state", ignore_errors=True)  # a fresh controller database
        args.keep.mkdir(parents=True, exist_ok=True)
        return asyncio.run(run(args, args.keep))
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        return asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
