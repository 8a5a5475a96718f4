"""Benchmark: kiln-controller's agent-report path and API at fleet scale.

What is measured, per fleet size N (``--nodes``), each on a fresh controller:

1. A real ``kiln-controller`` process (SQLite in a temporary directory,
   loopback, so no authentication; per-client request limit raised so that
   the benchmark's own API calls are not refused) gets N nodes enrolled over
   ``EnrollNode``, 64 calls in flight (the time is printed). Their BMC URLs
   are ``redfish+http://127.0.0.1:PORT/redfish/v1/Systems/<node>``, one per
   node, served by a stand-in (``--bmc responder``, the default: a tiny
   asyncio HTTP server answering the service root and ``Systems/<id>``, every
   system on; ``bench/fleet_load.py``) so that nodes can pass inspection and
   become ready; ``--bmc dead`` points them at a port where nothing listens
   (nodes then stay inspecting and no allocation is ever admitted).
2. N agent streams (``AgentService.Connect``) from ``--generators`` child
   processes, each an asyncio loop with its streams on ``--channels`` shared
   ``grpc.aio`` channels. Each stream sends the Register a real agent sends
   (a fake-NVML 8x H200 node, through the agent's own inventory and
   conversion code) and then a NodeHealth every R seconds (sampled once per
   node through ``agent.health.HealthSampler``, re-sent with a fresh
   ``sampled_at``: sampling the fake costs ~5 ms per report), and answers the
   controller's ``reset_gpus`` commands ``ok``. ``--compress K`` (default 10)
   runs N/K nodes and agents at R = interval/K: the same offered report rate
   (fleet-size costs such as ListNodes and RSS are then those of N/K nodes).
3. Once every node is ready and the controller no longer slows the agents
   down (it may while the fleet comes up: enrolment, registration and
   inspection load it; the wait is at most ``--pace-settle`` seconds, and
   what it waited for is printed), over ``--duration`` seconds with every
   node registered: reports offered
   (N/R) and sent (gRPC buffers generously, so a write returning says little);
   reports visible, i.e. processed: sent minus the backlog found at the
   window's end (the generators stop and report each node's last
   ``sampled_at``; a full ListNodes shows which of those are visible; each
   node's stream is in order, so a node showing its last report has had
   every earlier one processed). Then, in a window of its own (it loads the
   controller), report-to-visible latency from ``--probes`` agent streams in
   this process: each report's ``sampled_at`` against the time GetNode first
   shows it, polled every 5 ms (an upper bound). The controller's CPU
   (utime+stime from /proc/PID/stat, all threads) in cores and per visible
   report, with and without its idle CPU (measured for a few seconds with
   every stream open and nothing sent); its RSS (VmRSS).
4. With the reports still flowing, ``--clients`` concurrent clients (8):
   GetNode on random nodes, ListNodes of the whole fleet (first page and
   all pages when ListNodesRequest has ``page_size``, else one call); then
   ``--alloc-clients`` (32, a scheduler's submitters: each waits for its
   answer, so the controller's group commit takes in at most that many at
   once) CreateAllocation (``--nodes 1`` shape: AllocationSpec nodes=1)
   followed by ReleaseAllocation: p50/p99, admitted allocations a second,
   the controller's CPU a cycle, and how many of the machine's cores were
   busy meanwhile (``/proc/stat``: everything sharing the machine, the
   generators and clients included), and the controller process's busiest
   threads (the event loop, the database writer): the share of a core each
   ran, and the share it was runnable but waited for a CPU
   (``/proc/PID/task/TID/schedstat``), which says whether the window was
   bound by the controller's own CPU or by the machine's cores it shares
   with the load. Then the same window again with
   every agent quiet (streams open, no reports; ``--quiet-alloc-seconds``,
   0 for none): the allocation path
   on this fleet apart from the reports that share the controller's
   interpreter and the machine's cores with it.
5. The floor: the same generators against a bare ``grpc.aio`` server in its
   own process whose Connect answers Registered and drops every message;
   its CPU per report received, and the controller/floor ratio. The same
   server answers CreateAllocation and ReleaseAllocation from memory (the
   controller's message shapes, nothing stored or decided): the same
   clients' cycles a second and its CPU per cycle, beside the controller's
   in both allocation windows (the quiet window's ratio to the floor is the
   figure to compare across runs: the machine's speed moves both).

``--agent-relays N`` starts the controller with N relay worker processes
serving the agent streams on a port of their own (``--agent-listen``; the
generators and probes dial it): the controller's CPU and RSS then include
its workers, and the report window also prints the controller process's
own share. With ``--api-via-relays`` too, the benchmark's ``FleetService``
calls (enrolment, GetNode, ListNodes, the allocation windows) go to the
workers' port as well, which forwards them to the controller.
``--bmc-readers N`` starts it with N BMC reader processes doing the power
sync's and the leak watcher's BMC reads; they are counted in the
controller's CPU and RSS the same way.

Everything shares the machine's cores (on a 2-core machine the generators
take a large share); the generators' CPU is printed beside the controller's.
Each size ends with a summary line; the last line is the largest size's.
Targets (printed as MET/MISSED): 25,000 agents at one report per 10 s on at
most 2 cores, report p99 under 100 ms, GetNode p99 under 50 ms, at most 3x
the floor's CPU per report, at least 500 admitted allocations a second
(when missed, a line says what 500 a second would cost in CPU at the
run's own cost per cycle).

The controller serves ``/metrics`` on a port of its own here, read at each
end of the report-to-visible window and of both allocation windows: a line
after each says how often and how long its garbage collector paused it
meanwhile (``kiln_gc_pause_seconds``, by generation, and how many pauses
were longer than 100 ms). A p99 over 80 probe reports is decided by one
such pause.

How long it takes, measured on a 2-core machine shared with other work,
against the controller of December 2026 (its speed is changing): the
defaults (1,000 and 5,000 nodes, x10 compressed, 30 s windows) about 8
minutes: N=1k x10 (100 agents) 2.5 minutes, N=5k x10 (500 agents) 5, as the
controller saturates there (the wait for ready nodes runs to its 60 s limit
and CreateAllocation calls to their 30 s deadline). Uncompressed N=1k took
5.5 minutes (enrolment 40 s at 25 nodes/s, message building 25 s, 90 s
waiting for ready nodes). Later the same month ``--nodes 1000,5000,10000``
took about 10 minutes (10k x10: 1,000 agents enrolled in 7 s, registered in
5 s, all ready after 16 s). 25k x10 (2,500 agents at 1 s) was not run
there; at the ready wait's limit of max(60 s, nodes/20 s)
(``--ready-timeout``) expect 10 minutes or more, and uncompressed 25,000
nodes 45 minutes or more. In December 2026, 25k x10 took 5-7 minutes and
40k x10 6-8, of which up to 2 minutes (``--pace-settle``) waiting for the
controller to stop slowing the agents after the bring-up.

    python bench/fleet_scale.py [--nodes 1000,5000] [--interval 10] [--compress 10]
        [--duration 30] [--generators 4] [--bmc responder|dead] [--log-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import math
import multiprocessing
import os
import random
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto"), str(ROOT / "bench")]

# gRPC C-core notices (a GOAWAY as a server stops) are not results.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402
from fleet_load import (  # noqa: E402
    Streams,
    floor_main,
    generator_main,
    pid_cpu_s,
    pid_rss_mb,
    responder_main,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from kiln_process import busiest_threads, thread_schedule, with_children  # noqa: E402

from controller.sim.ports import free_port  # noqa: E402
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2  # noqa: E402

USER, PASSWORD = "bench", "bench-password"
NODES_PER_RACK = 8
CALL_TIMEOUT_S = 60.0
BIG = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
ADMITTED = (fleet_pb2.ALLOCATION_STATE_READY, fleet_pb2.ALLOCATION_STATE_PREPARING)
SPAWN = multiprocessing.get_context("spawn")

# Every child process and subprocess, killed at exit whatever happens.
_children: list[BaseProcess | subprocess.Popen[bytes]] = []


def _kill_children() -> None:
    for child in _children:
        with contextlib.suppress(Exception):
            if isinstance(child, subprocess.Popen):
                if child.poll() is None:
                    child.kill()
                    child.wait(timeout=10)
            elif child.is_alive():
                child.kill()
                child.join(timeout=10)


atexit.register(_kill_children)


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def us(micros: float) -> str:
    return "n/a" if micros != micros else f"{micros:.0f} us"


def ms(seconds: float) -> str:
    return "n/a" if seconds != seconds else f"{seconds * 1e3:.1f} ms"  # NaN: nothing measured


# --- child processes over a pipe --------------------------------------------------
class Child:
    """A spawned process driven by request/answer over a pipe, every wait bounded."""

    def __init__(self, target: Any, *args: Any) -> None:
        self.conn, theirs = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=target, args=(theirs, *args), daemon=True)
        self.proc.start()
        _children.append(self.proc)
        theirs.close()

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def recv(self, timeout: float) -> Any:
        try:
            if self.conn.poll(timeout):
                return self.conn.recv()
        except (EOFError, OSError):
            raise RuntimeError(f"child process {self.pid} exited ({self.proc.exitcode})") from None
        raise TimeoutError(f"child process {self.pid} did not answer within {timeout:.0f}s")

    def ask(self, timeout: float, *cmd: Any) -> Any:
        self.conn.send(cmd)
        return self.recv(timeout)

    async def aask(self, timeout: float, *cmd: Any) -> Any:
        return await asyncio.to_thread(self.ask, timeout, *cmd)

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(("quit",))
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)
        self.conn.close()


class Generators:
    def __init__(self, names: list[str], count: int, interval: float) -> None:
        count = max(1, min(count, len(names)))
        self.children = [
            Child(generator_main, names[k::count], list(range(k, len(names), count)), interval)
            for k in range(count)
        ]

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    async def ask(self, timeout: float, *cmd: Any) -> list[Any]:
        return list(await asyncio.gather(*(c.aask(timeout, *cmd) for c in self.children)))

    async def built(self, timeout: float) -> list[Any]:
        return list(
            await asyncio.gather(*(asyncio.to_thread(c.recv, timeout) for c in self.children))
        )

    def stop(self) -> None:
        for c in self.children:
            c.stop()


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += pid_cpu_s(pid)
    return total


def controller_cpu_s(pid: int) -> float:
    """CPU seconds of the controller and its relay workers together."""
    return cpu_of(with_children(pid))


HELPER_ROLES = (
    ("controller.api.relay.worker", "relay workers"),
    ("controller.bmc.reader", "BMC readers"),
)


def helpers_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of the controller's helper processes, by role."""
    found = dict.fromkeys((role for _, role in HELPER_ROLES), 0.0)
    for child in with_children(pid)[1:]:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for module, role in HELPER_ROLES:
                if module in command:
                    found[role] += pid_cpu_s(child)
    return found


def machine_busy_s() -> float:
    """CPU seconds every core of this machine spent not idle, since boot
    (``/proc/stat``: user, nice, system, irq, softirq and steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def controller_rss_mb(pid: int) -> float:
    total = 0.0
    for one in with_children(pid):
        with contextlib.suppress(OSError):
            total += pid_rss_mb(one)
    return total


# --- the controller's garbage collector -----------------------------------------------
class GcPauses:
    """The controller's garbage-collector pauses, from its ``/metrics``
    (``kiln_gc_pause_seconds``, by generation): what a window's p99 may be
    made of. One scrape at each end of a window, so that the scrape's own
    work for the controller (its fleet gauges) falls outside it."""

    LONG = 0.1  # s: a bucket bound of kiln_gc_pause_seconds

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    def read(self) -> dict[str, tuple[float, float, float]]:
        """Per generation: (pauses, seconds in all, pauses longer than LONG)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url, timeout=10) as answer:  # loopback only
            text = answer.read().decode()
        seen: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            if family.name != "kiln_gc_pause_seconds":
                continue
            for sample in family.samples:
                one = seen.setdefault(sample.labels["generation"], {})
                if sample.name.endswith("_count"):
                    one["count"] = sample.value
                elif sample.name.endswith("_sum"):
                    one["sum"] = sample.value
                elif sample.name.endswith("_bucket") and float(sample.labels["le"]) == self.LONG:
                    one["short"] = sample.value
        return {
            gen: (v.get("count", 0.0), v.get("sum", 0.0), v.get("count", 0.0) - v.get("short", 0.0))
            for gen, v in seen.items()
        }

    async def snapshot(self) -> dict[str, tuple[float, float, float]] | None:
        """``read``, off this loop; None when the controller did not answer."""
        try:
            return await asyncio.to_thread(self.read)
        except (OSError, ValueError, KeyError):
            return None

    @staticmethod
    def text(
        before: dict[str, tuple[float, float, float]] | None,
        after: dict[str, tuple[float, float, float]] | None,
    ) -> str:
        if before is None or after is None:
            return "the garbage collector's pauses: not read (/metrics did not answer)"
        zero = (0.0, 0.0, 0.0)
        delta = {  # per generation: (pauses, seconds, long pauses) in the window
            g: tuple(a - b for a, b in zip(after[g], before.get(g, zero), strict=True))
            for g in sorted(after)
        }
        by_gen = ", ".join(f"{d[0]:.0f} of generation {g}" for g, d in delta.items())
        return (
            f"the garbage collector paused the controller "
            f"{sum(d[0] for d in delta.values()):.0f} times ({by_gen}), "
            f"{sum(d[1] for d in delta.values()) * 1000:.0f} ms in all, "
            f"{sum(d[2] for d in delta.values()):.0f} longer than {GcPauses.LONG * 1000:.0f} ms"
        )


# --- the controller ------------------------------------------------------------------
def start_controller(
    args: argparse.Namespace,
    workdir: Path,
    port: int,
    interval: float,
    agent_port: int,
    metrics_port: int,
) -> tuple[subprocess.Popen[bytes], Path]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "proto"), env.get("PYTHONPATH", "")])
    log_path = workdir / "controller.log"
    cmd = [
        sys.executable, "-m", "controller.main",
        "--listen", f"127.0.0.1:{port}",
        "--state-dir", str(workdir / "state"),
        "--sample-interval", f"{interval:g}",
        "--power-sync-interval", f"{args.power_sync_interval:g}",
        # Pauses in this benchmark (backlog check, idle CPU) must not read as
        # silent agents, which would start BMC thermal reads.
        "--agent-silent-after", f"{max(60.0, 6 * interval):g}",
        "--max-requests-per-second-per-client", "1000000",
        # The generators answer only reset_gpus; DCGM and nvbandwidth runs
        # (the intake checks) are not what this measures.
        "--checks", args.checks,
        # Its /metrics: the garbage collector's pauses in each window.
        "--http-listen", f"127.0.0.1:{metrics_port}",
    ]  # fmt: skip
    if args.bmc_readers > 0:
        cmd += ["--bmc-readers", str(args.bmc_readers)]
    cmd += shlex.split(args.controller_options)
    if args.agent_relays > 0:
        cmd += ["--agent-listen", f"127.0.0.1:{agent_port}"]
        cmd += ["--agent-relays", str(args.agent_relays)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    _children.append(proc)
    return proc, log_path


def helpers(args: argparse.Namespace) -> str:
    """The controller's helper processes, counted in its CPU and RSS."""
    named = []
    if args.agent_relays > 0:
        named.append(f"{args.agent_relays} relay workers")
    if args.bmc_readers > 0:
        named.append(f"{args.bmc_readers} BMC readers")
    return " and ".join(named)


async def wait_serving(channel: grpc.aio.Channel, proc: subprocess.Popen[bytes]) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("kiln-controller did not start serving within 60 s")
        await asyncio.sleep(0.2)


def stop_controller(proc: subprocess.Popen[bytes]) -> tuple[float, int | None]:
    sent = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return time.monotonic() - sent, proc.returncode


async def enrol(
    stub: Any, names: list[str], bmc_base: str, in_flight: int
) -> tuple[float, Counter[str]]:
    gate = asyncio.Semaphore(in_flight)
    failures: Counter[str] = Counter()

    async def one(i: int, name: str) -> None:
        request = fleet_pb2.EnrollNodeRequest(
            name=name,
            bmc_url=f"{bmc_base}/redfish/v1/Systems/{name}",
            username=USER,
            password=PASSWORD,
            rack=f"rack-{i // NODES_PER_RACK:04d}",
            leaf=f"leaf-{i // (NODES_PER_RACK * 4):03d}",
            spine=f"spine-{i // (NODES_PER_RACK * 64):02d}",
        )
        async with gate:
            for _attempt in range(20):
                try:
                    await stub.EnrollNode(request, timeout=CALL_TIMEOUT_S)
                    return
                except grpc.aio.AioRpcError as e:
                    if e.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                        failures[f"{e.code().name}: {e.details()}"] += 1
                        return
                    await asyncio.sleep(0.05)
            failures["RESOURCE_EXHAUSTED 20 times"] += 1

    started = time.monotonic()
    await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    return time.monotonic() - started, failures


# --- listing nodes -----------------------------------------------------------------------
_REQ_FIELDS = fleet_pb2.ListNodesRequest.DESCRIPTOR.fields_by_name
_RESP_FIELDS = fleet_pb2.ListNodesResponse.DESCRIPTOR.fields_by_name
PAGING = "page_size" in _REQ_FIELDS and "page_token" in _REQ_FIELDS
_NEXT = next((f for f in ("next_page_token", "page_token") if f in _RESP_FIELDS), None)


async def list_nodes(stub: Any, page_size: int, **filters: Any) -> tuple[list[Any], float, float]:
    """Every node (all pages); returns (nodes, first page seconds, whole seconds)."""
    started = time.monotonic()
    if not PAGING or _NEXT is None:
        answer = await stub.ListNodes(fleet_pb2.ListNodesRequest(**filters), timeout=300)
        took = time.monotonic() - started
        return list(answer.nodes), took, took
    nodes: list[Any] = []
    token = ""
    first = 0.0
    for _page in range(100_000):
        request = fleet_pb2.ListNodesRequest(page_size=page_size, page_token=token, **filters)
        answer = await stub.ListNodes(request, timeout=300)
        first = first or time.monotonic() - started
        nodes.extend(answer.nodes)
        token = getattr(answer, _NEXT)
        if not token:
            break
    return nodes, first, time.monotonic() - started


def state_name(node: Any) -> str:
    return str(types_pb2.NodeState.Name(node.state)).removeprefix("NODE_STATE_").lower()


def node_census(url: str) -> Counter[str]:
    """Nodes by lifecycle state, from the controller's ``/metrics``
    (``kiln_nodes``, summed over racks): one tally of the whole fleet, far
    cheaper for the controller than listing it."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as answer:  # loopback only
        text = answer.read().decode()
    states: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "kiln_nodes":
            for sample in family.samples:
                states[sample.labels["state"]] += int(sample.value)
    return +states


async def wait_ready(
    stub: Any, names: list[str], args: argparse.Namespace, metrics_url: str
) -> tuple[Counter[str], dict[str, str], float]:
    """Wait until every agent's node is ready, progress stalls (no node
    became ready for ``--stall`` seconds) or time runs out, saying how far
    the bring-up has come every 30 s. Counts from the controller's
    ``/metrics`` census every 5 s, then takes one full census by
    ``ListNodes`` for the reasons of the nodes not ready."""
    started = time.monotonic()
    limit = args.ready_timeout or max(60.0, len(names) / 20)
    best, best_at, said_at, said_ready = -1, started, started, 0
    while time.monotonic() - started < limit:
        try:
            census = await asyncio.to_thread(node_census, metrics_url)
        except (OSError, ValueError, KeyError):
            census = Counter()  # not answered: no progress seen this time
        ready = census.get("ready", 0)
        now = time.monotonic()
        if ready >= len(names):
            break
        if ready > best:
            best, best_at = ready, now
        elif now - best_at > args.stall:
            break
        if now - said_at >= 30.0:
            rate = (ready - said_ready) / (now - said_at)
            states = ", ".join(f"{c} {s}" for s, c in census.most_common())
            print(
                f"    bringing up: {ready}/{len(names)} ready after {now - started:.0f}s "
                f"({rate:.1f}/s over the last {now - said_at:.0f}s; {states})"
            )
            said_at, said_ready = now, ready
        await asyncio.sleep(5.0)
    took = time.monotonic() - started
    nodes, _, _ = await list_nodes(stub, args.page_size)
    states = Counter(state_name(n) for n in nodes)
    reasons: dict[str, str] = {}
    for n in nodes:
        state = state_name(n)
        if state != "ready" and n.state_reason and state not in reasons:
            reasons[state] = n.state_reason
    return states, reasons, took


# --- report-to-visible probes -------------------------------------------------------------
@dataclass
class Probes:
    stub: Any
    recording: bool = False
    latencies: list[float] = field(default_factory=list)
    unseen: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def sent(self, name: str, sampled_at: float) -> None:
        if self.recording:
            task = asyncio.create_task(self._watch(name, sampled_at))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _watch(self, name: str, sampled_at: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while loop.time() < deadline:
            try:
                node = await self.stub.GetNode(fleet_pb2.GetNodeRequest(name=name), timeout=10)
            except grpc.aio.AioRpcError:
                break
            if node.health.sampled_at >= sampled_at:
                self.latencies.append(time.time() - sampled_at)
                return
            await asyncio.sleep(0.005)
        self.unseen += 1


async def median_asked(generators: Generators, interval: float) -> float:
    """The median report interval the controller asks of the agents now."""
    stats = await generators.ask(30, "stats", False)
    return statistics.median([i for a in stats for i in a["asked"]] or [interval])


async def wait_unpaced(
    generators: Generators, interval: float, limit: float
) -> tuple[float, float, bool]:
    """Wait (at most ``limit`` seconds) until the controller asks the agents
    for ``interval`` again, after it slowed them while the fleet came up
    (enrolment, registration, inspection): the window measures the steady
    state at the offered load, not the bring-up. (seconds waited, the
    slowest median interval seen, whether it eased back)."""
    started = time.monotonic()
    slowest = asked = await median_asked(generators, interval)
    while asked > interval * 1.001 and time.monotonic() - started < limit:
        await asyncio.sleep(1.0)
        asked = await median_asked(generators, interval)
        slowest = max(slowest, asked)
    return time.monotonic() - started, slowest, asked <= interval * 1.001


# --- API phase ------------------------------------------------------------------------------
async def timed_loop(clients: int, seconds: float, body: Any) -> None:
    stop = time.monotonic() + seconds

    async def client(k: int) -> None:
        while time.monotonic() < stop:
            await body(k)

    await asyncio.gather(*(client(k) for k in range(clients)))


@dataclass
class Cycles:
    """One allocation window's outcome."""

    create_lat: list[float]
    release_lat: list[float]
    admitted: int
    pending: Counter[str]
    rate: float  # admitted a second
    cores: float  # the controller's (and its relays')
    machine: float  # cores of the whole machine busy: everything sharing it
    # The controller's own process, its busiest threads: (cores running,
    # cores runnable but waiting for a CPU), busiest first.
    threads: list[tuple[float, float]] = field(default_factory=list)

    def text(self) -> str:
        """The window's outcome and latencies, as its line prints them."""
        create, release = self.create_lat, self.release_lat
        return (
            f"{self.admitted} admitted ({self.rate:.0f}/s), {sum(self.pending.values())} not; "
            f"create p50 {ms(pct(create, 0.5))} p99 {ms(pct(create, 0.99))}, "
            f"release p50 {ms(pct(release, 0.5))} p99 {ms(pct(release, 0.99))}"
        )

    def cpu_text(self) -> str:
        """The controller's CPU a cycle and how busy the whole machine was."""
        per_cycle = self.cores / self.rate * 1e6 if self.rate else float("nan")
        text = (
            f"controller {self.cores:.2f} cores ({per_cycle:.0f} us/cycle), the machine "
            f"{self.machine:.2f} of its {os.cpu_count()} cores busy"
        )
        if self.threads:
            ran = " + ".join(f"{r:.2f}" for r, _ in self.threads)
            waited = " + ".join(f"{w:.2f}" for _, w in self.threads)
            text += (
                f"; the controller's own busiest threads ran {ran} cores and waited for "
                f"a CPU {waited} (runnable, not running)"
            )
        return text


async def alloc_cycles(
    stub: Any, clients: int, seconds: float, pid: int, errors: Counter[str]
) -> Cycles:
    """``clients`` loops of CreateAllocation (one node) then its release, for
    ``seconds``."""
    create_lat: list[float] = []
    release_lat: list[float] = []
    admitted = 0
    pending: Counter[str] = Counter()

    async def alloc(_k: int) -> None:
        nonlocal admitted
        request = fleet_pb2.CreateAllocationRequest(
            key=uuid.uuid4().hex, spec=fleet_pb2.AllocationSpec(nodes=1)
        )
        t = time.monotonic()
        try:
            a = await stub.CreateAllocation(request, timeout=30)
        except grpc.aio.AioRpcError as e:
            errors[f"CreateAllocation {e.code().name}: {e.details()}"] += 1
            await asyncio.sleep(0.05)
            return
        create_lat.append(time.monotonic() - t)
        if a.state in ADMITTED:
            admitted += 1
        else:
            pending[f"{fleet_pb2.AllocationState.Name(a.state)}: {a.reason}"] += 1
        t = time.monotonic()
        try:
            await stub.ReleaseAllocation(fleet_pb2.ReleaseAllocationRequest(id=a.id), timeout=30)
            release_lat.append(time.monotonic() - t)
        except grpc.aio.AioRpcError as e:
            errors[f"ReleaseAllocation {e.code().name}: {e.details()}"] += 1

    t0, c0, m0 = time.monotonic(), controller_cpu_s(pid), machine_busy_s()
    threads0 = thread_schedule(pid)
    await timed_loop(clients, seconds, alloc)
    elapsed = time.monotonic() - t0
    cores = (controller_cpu_s(pid) - c0) / elapsed
    machine = (machine_busy_s() - m0) / elapsed
    threads = busiest_threads(threads0, thread_schedule(pid), elapsed)[:4]
    rate = admitted / elapsed
    return Cycles(create_lat, release_lat, admitted, pending, rate, cores, machine, threads)


async def api_phase(
    stub: Any, names: list[str], args: argparse.Namespace, pid: int, gc_pauses: GcPauses
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    errors: Counter[str] = Counter()

    get_lat: list[float] = []

    async def get(_k: int) -> None:
        t = time.monotonic()
        try:
            await stub.GetNode(fleet_pb2.GetNodeRequest(name=random.choice(names)), timeout=30)
            get_lat.append(time.monotonic() - t)
        except grpc.aio.AioRpcError as e:
            errors[f"GetNode {e.code().name}: {e.details()}"] += 1

    t0, c0 = time.monotonic(), controller_cpu_s(pid)
    await timed_loop(args.clients, args.api_seconds, get)
    elapsed = time.monotonic() - t0
    out["get"] = (get_lat, len(get_lat) / elapsed, (controller_cpu_s(pid) - c0) / elapsed)

    first_lat: list[float] = []
    whole_lat: list[float] = []
    size = 0
    t0, c0 = time.monotonic(), controller_cpu_s(pid)
    stop = t0 + args.api_seconds
    while time.monotonic() < stop or len(whole_lat) < 3:
        try:
            nodes, first, whole = await list_nodes(stub, args.page_size)
        except grpc.aio.AioRpcError as e:
            errors[f"ListNodes {e.code().name}: {e.details()}"] += 1
            break
        first_lat.append(first)
        whole_lat.append(whole)
        size = len(nodes)
        if len(whole_lat) >= 200:
            break
    list_cores = (controller_cpu_s(pid) - c0) / (time.monotonic() - t0)
    out["list"] = (first_lat, whole_lat, size, list_cores)

    # Said as it begins (the results are printed after every window), so a
    # profiler can be started on it.
    print(
        f"  allocation window begins: {args.alloc_clients} clients for {args.alloc_seconds:g} s",
        flush=True,
    )
    gc_before = await gc_pauses.snapshot()
    out["alloc"] = await alloc_cycles(stub, args.alloc_clients, args.alloc_seconds, pid, errors)
    out["alloc_gc"] = GcPauses.text(gc_before, await gc_pauses.snapshot())
    out["errors"] = errors
    return out


async def quiet_alloc_window(
    stub: Any,
    args: argparse.Namespace,
    pid: int,
    generators: Any,
    probes: Streams,
    gc_pauses: GcPauses,
) -> tuple[float, float]:
    """The allocation window again with every agent quiet (streams open,
    no reports sent): what the allocation path itself does on this fleet,
    apart from the reports that share the controller and the machine with
    it. Returns (admitted allocations a second, the controller's cores)."""
    await generators.ask(60, "pause")
    await probes.pause()
    await asyncio.sleep(2.0)  # the backlog drains
    errors: Counter[str] = Counter()
    print(
        f"  quiet allocation window begins: {args.alloc_clients} clients for "
        f"{args.quiet_alloc_seconds:g} s, no reports",
        flush=True,
    )
    gc_before = await gc_pauses.snapshot()
    t0 = time.process_time()
    quiet = await alloc_cycles(stub, args.alloc_clients, args.quiet_alloc_seconds, pid, errors)
    clients_cpu = (time.process_time() - t0) / args.quiet_alloc_seconds
    gc_text = GcPauses.text(gc_before, await gc_pauses.snapshot())
    await generators.ask(30, "resume")
    probes.resume()
    # The rest of the machine: the stand-ins for the fleet (the generators
    # holding every agent's stream, the BMC responder power sync reads) and
    # anything else running, which a real deployment would not have beside it.
    rest = max(0.0, quiet.machine - quiet.cores - clients_cpu)
    print(
        f"  CreateAllocation+ReleaseAllocation with the agents quiet ({args.alloc_clients} "
        f"clients): {quiet.text()}; {quiet.cpu_text()}, the clients (this process) "
        f"{clients_cpu:.2f} cores, the rest of the machine (the fleet's stand-ins: "
        f"generators holding the streams, the BMC responder) {rest:.2f} cores"
    )
    print(f"    meanwhile {gc_text}")
    for text, count in (quiet.pending + errors).most_common(3):
        print(f"    {count}x {text}")
    return quiet.rate, quiet.cores


# --- one fleet size ---------------------------------------------------------------------------
@dataclass
class Result:
    n: int
    agents: int
    interval: float
    offered: float = 0.0
    processed: float = 0.0
    cores: float = 0.0
    us_per_report: float = float("nan")
    us_net: float = float("nan")
    floor_us: float = float("nan")
    report_p50: float = float("nan")
    report_p99: float = float("nan")
    get_p99: float = float("nan")
    list_p99: float = float("nan")
    alloc_rate: float = 0.0
    alloc_cores: float = 0.0
    alloc_floor: float = 0.0  # cycles/s of the bare gRPC server
    quiet_alloc_rate: float = float("nan")  # allocations/s with no reports sent
    quiet_alloc_cores: float = float("nan")  # the controller's cores meanwhile
    enrolled: int = 0  # nodes enrolled (N with --enrol-all, else the agents')
    rss_mb: float = 0.0
    asked: float = 0.0  # median report interval the controller asked for at the end
    paces: int = 0  # Pace messages the agents received (the controller's backpressure)
    notes: list[str] = field(default_factory=list)

    @property
    def quiet_measured(self) -> bool:
        """Whether the quiet allocation window ran (its rate is NaN until then)."""
        return not math.isnan(self.quiet_alloc_rate)


def _log_digest(path: Path) -> list[str]:
    """Count the controller log's warnings and errors, grouped with node names
    and numbers blanked out."""
    groups: Counter[str] = Counter()
    levels: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(" ", 4)
        if len(parts) < 5:
            if line.startswith("Traceback"):
                levels["Traceback"] += 1
            continue
        level = parts[2]
        if level in ("WARNING", "ERROR", "CRITICAL"):
            levels[level] += 1
            text = re.sub(r"\d+(\.\d+)?", "N", re.sub(r"fs-\d+", "NODE", parts[4]))
            groups[f"{level} {text[:150]}"] += 1
        elif line.startswith("Traceback"):
            levels["Traceback"] += 1
    if not levels:
        return ["controller log: no warnings or errors"]
    lines = ["controller log: " + ", ".join(f"{n} {lvl}" for lvl, n in levels.most_common())]
    lines += [f"    {n}x {text}" for text, n in groups.most_common(6)]
    return lines


def _keep_log(log_path: Path, kept: Path) -> None:
    if log_path.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_bytes(log_path.read_bytes())
        print(f"  controller log kept in {kept}")


async def run_size(n: int, args: argparse.Namespace, log_dir: Path | None) -> Result:
    k = max(1, args.compress)
    agents = max(1, n // k)
    interval = args.interval / k
    res = Result(n=n, agents=agents, interval=interval, offered=agents / interval)
    mode = (
        f"x{k} compressed: {agents} agents at {interval:g} s, offered {res.offered:.0f} "
        f"reports/s as {n} agents at {args.interval:g} s"
        if k > 1
        else f"{agents} agents at {interval:g} s, offered {res.offered:.0f} reports/s"
    )
    print(f"\n== N={n} ({mode}) ==", flush=True)
    # With --enrol-all every one of the N nodes is enrolled; only the first
    # N/K run agents (the others wait for theirs, never ready), so the
    # topology, the store and the BMC loops are the whole fleet's.
    enrolled = [f"fs-{i:05d}" for i in range(n if args.enrol_all else agents)]
    names = enrolled[:agents]
    probes_n = min(args.probes, max(0, agents - 1))
    gen_names, probe_names = names[: agents - probes_n], names[agents - probes_n :]

    with tempfile.TemporaryDirectory(prefix="kiln-fleet-scale-") as tmp:
        workdir = Path(tmp)
        responder: Child | None = None
        generators: Generators | None = None
        proc: subprocess.Popen[bytes] | None = None
        floor: Child | None = None
        probe_streams: Streams | None = None
        log_path: Path | None = None
        try:
            if args.bmc == "responder":
                bmc_port = free_port()
                responder = Child(responder_main, bmc_port)
                responder.recv(30)
            else:
                bmc_port = free_port()  # nothing listens here
            bmc_base = f"redfish+http://127.0.0.1:{bmc_port}"
            port = free_port()
            agent_port = free_port() if args.agent_relays > 0 else port
            relayed_channel: grpc.aio.Channel | None = None
            metrics_port = free_port()
            proc, log_path = start_controller(
                args, workdir, port, interval, agent_port, metrics_port
            )
            gc_pauses = GcPauses(metrics_port)
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=BIG)
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await wait_serving(channel, proc)
            if args.agent_relays > 0 and args.api_via_relays:
                # Every FleetService call from here on goes through the workers.
                relayed_channel = grpc.aio.insecure_channel(f"127.0.0.1:{agent_port}", options=BIG)
                stub = fleet_pb2_grpc.FleetServiceStub(relayed_channel)

            e0 = controller_cpu_s(proc.pid)
            took, failures = await enrol(stub, enrolled, bmc_base, args.enrol_in_flight)
            enrol_cores = (controller_cpu_s(proc.pid) - e0) / took
            total = res.enrolled = len(enrolled)
            print(
                f"  enrolled {total - sum(failures.values())}/{total} nodes in {took:.1f}s "
                + (f"({agents} with agents) " if total > agents else "")
                + f"({total / took:.0f}/s, {args.enrol_in_flight} in flight, controller "
                f"{enrol_cores:.2f} cores); BMCs: "
                + (
                    "stand-in Redfish responder (every system on)"
                    if responder
                    else "dead (nothing listens)"
                )
            )
            for text, count in failures.most_common(3):
                print(f"    {count}x {text}")

            build_started = time.monotonic()
            generators = Generators(gen_names, args.generators, interval)
            probes = Probes(stub)
            probe_streams = Streams(
                probe_names, list(range(10**6, 10**6 + probes_n)), interval, on_sent=probes.sent
            )
            built = await generators.built(timeout=600)
            reg_bytes, report_bytes = built[0][2], built[0][3]
            print(
                f"  {len(generators.children)} generator processes built {len(gen_names)} "
                f"nodes' messages in {time.monotonic() - build_started:.1f}s "
                f"({sum(b[1] for b in built):.1f}s CPU): Register {reg_bytes} B, NodeHealth "
                f"{report_bytes} B (8x H200 from the fake NVML, sampled once per node and "
                f"re-sent with a fresh sampled_at: live sampling costs ~5 ms a report)"
            )

            address = f"127.0.0.1:{agent_port}"  # the relay workers' port, with --agent-relays
            # At the real pace on a slow hour 25,000 streams took over 600 s to register.
            connect_s = args.connect_timeout or max(600.0, agents / 25)
            connected = await generators.ask(connect_s, "connect", address, args.channels)
            p_ok, p_failed, _ = await probe_streams.connect(address, 1)
            ok = sum(c[0] for c in connected) + p_ok
            failed = sum(c[1] for c in connected) + p_failed
            print(
                f"  {ok}/{agents} agent streams registered in "
                f"{max(c[2] for c in connected):.1f}s over {args.channels} channels per "
                f"generator ({failed} refused)"
            )
            if failed:
                stats = await generators.ask(30, "stats", False)
                for text in {t for s in stats for t in s["errors"]}:
                    print(f"    {text}")

            states, reasons, ready_s = await wait_ready(stub, names, args, gc_pauses.url)
            print(
                f"  after {ready_s:.0f}s: " + ", ".join(f"{c} {s}" for s, c in states.most_common())
            )
            for state, reason in reasons.items():
                print(f"    {state}: {reason}")
            ready = states.get("ready", 0)
            if ready < agents and args.bmc == "dead":
                res.notes.append(
                    f"{ready} of {agents} nodes ready: they stay inspecting, as their BMCs "
                    "do not answer"
                )
            elif ready < agents:
                res.notes.append(
                    f"{ready} of {agents} nodes ready after {ready_s:.0f}s (the lifecycle was "
                    "still at work: its CPU is in the idle figure and the window's)"
                )
            if args.hold > 0:
                h0, ht0 = controller_cpu_s(proc.pid), time.monotonic()
                await asyncio.sleep(args.hold)
                held_cores = (controller_cpu_s(proc.pid) - h0) / (time.monotonic() - ht0)
                print(
                    f"  held {args.hold:.0f}s once ready (--hold), the agents reporting: "
                    f"controller {held_cores:.2f} cores over the hold"
                )
            await asyncio.sleep(min(3.0, interval * 2))  # every stream sending
            waited, slowest, eased = await wait_unpaced(generators, interval, args.pace_settle)
            if slowest > interval * 1.001:
                print(
                    f"  the controller had slowed its agents (to one report every "
                    f"{slowest:.2f} s at the median) while the fleet came up; "
                    + (
                        f"the window waited {waited:.0f}s for it to ease back to {interval:g} s"
                        if eased
                        else f"after {waited:.0f}s (--pace-settle) it had not eased back to "
                        f"{interval:g} s: the window measures the paced load"
                    )
                )

            # -- the report window --
            pids = generators.pids
            before = await generators.ask(30, "stats", True)
            main0, helpers0, busy0 = pid_cpu_s(proc.pid), helpers_cpu_s(proc.pid), machine_busy_s()
            c0, g0, m0, t0 = (
                controller_cpu_s(proc.pid),
                cpu_of(pids),
                time.process_time(),
                time.monotonic(),
            )
            p0 = probe_streams.sent
            await asyncio.sleep(args.duration)
            last_maps = await generators.ask(60, "pause")
            last = {**(await probe_streams.pause())}
            for m in last_maps:
                last.update(m)
            main1, helpers1, busy1 = pid_cpu_s(proc.pid), helpers_cpu_s(proc.pid), machine_busy_s()
            c1, g1, m1, t1 = (
                controller_cpu_s(proc.pid),
                cpu_of(pids),
                time.process_time(),
                time.monotonic(),
            )
            window = t1 - t0
            rss = controller_rss_mb(proc.pid)
            after = await generators.ask(30, "stats", False)
            sent = sum(a["sent"] - b["sent"] for a, b in zip(after, before, strict=True))
            sent += probe_streams.sent - p0
            late = sum(a["late"] - b["late"] for a, b in zip(after, before, strict=True))
            lost = sum(a["lost"] for a in after) + probe_streams.lost
            write_p99 = max(a["write_p99"] for a in after)
            window_asked = statistics.median([i for a in after for i in a["asked"]] or [interval])

            # Backlog at the window's end, then until every last report shows.
            listed_at = time.monotonic()
            nodes, _, list_s = await list_nodes(stub, args.page_size)
            visible = {x.name: x.health.sampled_at for x in nodes}
            behind = 0
            for name, ts in last.items():
                shown = visible.get(name, 0.0)
                if ts and shown < ts:
                    behind += max(1, round((ts - shown) / interval)) if shown else 1
            lagging = sum(1 for name, ts in last.items() if ts and visible.get(name, 0.0) < ts)
            lagging_end = lagging
            drained = 0.0
            while lagging and time.monotonic() - listed_at < 15:
                await asyncio.sleep(0.5)
                nodes, _, _ = await list_nodes(stub, args.page_size)
                visible = {x.name: x.health.sampled_at for x in nodes}
                lagging = sum(1 for name, ts in last.items() if ts and visible.get(name, 0.0) < ts)
                drained = time.monotonic() - listed_at
            processed = max(0, sent - behind)
            # Idle: every stream open, nothing sent.
            print(f"  idle for {args.idle_seconds:g}s: every stream open, nothing sent", flush=True)
            await asyncio.sleep(1.0)
            i0, it0 = controller_cpu_s(proc.pid), time.monotonic()
            await asyncio.sleep(args.idle_seconds)
            idle_cores = (controller_cpu_s(proc.pid) - i0) / (time.monotonic() - it0)
            await generators.ask(30, "resume")
            probe_streams.resume()

            # -- report-to-visible latency (GetNode polling: a window of its own) --
            await asyncio.sleep(min(3.0, interval * 2))
            gc_before = await gc_pauses.snapshot()
            probes.recording = True
            await asyncio.sleep(max(args.latency_seconds, 3 * interval))
            probes.recording = False
            gc_probe = GcPauses.text(gc_before, await gc_pauses.snapshot())
            await asyncio.gather(*list(probes.tasks), return_exceptions=True)

            ctl_cpu = c1 - c0
            res.processed = processed / window
            res.cores = ctl_cpu / window
            res.rss_mb = rss
            if processed:
                res.us_per_report = ctl_cpu / processed * 1e6
                if idle_cores < res.cores:
                    res.us_net = (ctl_cpu - idle_cores * window) / processed * 1e6
            res.report_p50, res.report_p99 = pct(probes.latencies, 0.5), pct(probes.latencies, 0.99)
            ncpu = len(os.sched_getaffinity(0))
            print(
                f"  window {window:.1f}s: offered {res.offered:.0f}/s, sent {sent / window:.0f}/s "
                f"({late} late sends, {lost} streams lost, write p99 {ms(write_p99)}), "
                f"visible (processed) {res.processed:.0f}/s"
                + (
                    f"; the controller had slowed its agents to one report every "
                    f"{window_asked:.2f} s (median)"
                    if window_asked > interval * 1.001
                    else ""
                )
            )
            later = (
                ""
                if not lagging_end
                else f"; all visible {drained:.1f}s later"
                if not lagging
                else f"; {lagging} nodes still behind {drained:.0f}s later"
            )
            print(
                f"    method: when the window ended the generators stopped and reported each "
                f"node's last sampled_at; a full ListNodes ({list_s:.2f}s) then showed it on "
                f"{len(last) - lagging_end}/{len(last)} nodes, {behind} reports behind "
                f"(visible = sent - behind){later}"
            )
            print(
                f"  controller: {res.cores:.2f} cores ({idle_cores:.2f} idle with the streams "
                f"open and nothing sent), {res.us_per_report:.0f} us/report "
                f"({us(res.us_net)} without idle), RSS {rss:.0f} MB"
                + (
                    f" (with {helpers(args)}; the controller's own process "
                    f"{(main1 - main0) / window:.2f} cores, "
                    f"{(main1 - main0) / max(1, processed) * 1e6:.0f} us/report"
                    + "".join(
                        f", {role} {(helpers1[role] - helpers0[role]) / window:.2f} cores"
                        for role in helpers1
                        if helpers1[role] > helpers0[role]
                    )
                    + ")"
                    if args.agent_relays > 0 or args.bmc_readers > 0
                    else ""
                )
                + "; generators "
                f"{(g1 - g0) / window:.2f} cores, this process {(m1 - m0) / window:.2f} cores; "
                f"the machine {(busy1 - busy0) / window:.2f} of its {ncpu} cores busy"
            )

            print(
                f"  report-to-visible ({probes_n} probe agents, GetNode every 5 ms): "
                f"p50 {ms(res.report_p50)}, p99 {ms(res.report_p99)} over "
                f"{len(probes.latencies)} reports, {probes.unseen} not visible within 10 s"
            )
            print(f"    meanwhile {gc_probe}")

            # -- API under the report load --
            api = await api_phase(stub, names, args, proc.pid, gc_pauses)
            get_lat, get_rate, get_cores = api["get"]
            first_lat, whole_lat, listed, list_cores = api["list"]
            cycles: Cycles = api["alloc"]
            final = await generators.ask(30, "stats", False)
            res.paces = sum(a["paces"] for a in final)
            res.asked = statistics.median([i for a in final for i in a["asked"]] or [interval])
            if res.paces:
                slowed = max(res.asked, window_asked) > interval * 1.001
                res.notes.append(
                    f"the controller paced its agents ({res.paces} Pace messages): at the "
                    f"report window's end they reported every {window_asked:.2f} s, at the "
                    f"run's end every {res.asked:.2f} s (medians; asked {interval:g} s), "
                    + (
                        "so less than the offered load was taken in"
                        if slowed
                        else "so the window had the whole offered load"
                    )
                )
            res.get_p99 = pct(get_lat, 0.99)
            res.list_p99 = pct(whole_lat, 0.99)
            res.alloc_rate = cycles.rate
            res.alloc_cores = cycles.cores
            print(
                f"  GetNode ({args.clients} clients): p50 {ms(pct(get_lat, 0.5))}, p99 "
                f"{ms(res.get_p99)}, {get_rate:.0f} calls/s, controller {get_cores:.2f} cores"
            )
            paging = f"page_size {args.page_size}" if PAGING and _NEXT else "one call, no paging"
            print(
                f"  ListNodes ({listed} nodes, {paging}): first page p50 "
                f"{ms(pct(first_lat, 0.5))} p99 {ms(pct(first_lat, 0.99))}; whole p50 "
                f"{ms(pct(whole_lat, 0.5))} p99 {ms(res.list_p99)} ({len(whole_lat)} calls, "
                f"controller {list_cores:.2f} cores)"
            )
            print(
                f"  CreateAllocation+ReleaseAllocation ({args.alloc_clients} clients, nodes=1): "
                f"{cycles.text()}; {cycles.cpu_text()}"
            )
            print(f"    meanwhile {api['alloc_gc']}")
            for text, count in cycles.pending.most_common(2):
                print(f"    {count}x {text}")
            for text, count in api["errors"].most_common(3):
                print(f"    {count}x {text}")
            if args.quiet_alloc_seconds > 0 and cycles.rate:
                res.quiet_alloc_rate, res.quiet_alloc_cores = await quiet_alloc_window(
                    stub, args, proc.pid, generators, probe_streams, gc_pauses
                )
            if cycles.admitted == 0:
                res.notes.append(
                    f"0 allocations admitted ({ready} of {agents} nodes ready: "
                    + ", ".join(f"{c} {s}" for s, c in states.most_common())
                    + ")"
                )

            await generators.ask(60, "disconnect")
            await probe_streams.disconnect()
            await channel.close(grace=None)
            if relayed_channel is not None:
                await relayed_channel.close(grace=None)
            stop_s, rc = await asyncio.to_thread(stop_controller, proc)
            print(f"  controller stopped {stop_s:.1f}s after SIGTERM (exit code {rc})")
            for line in _log_digest(log_path):
                print(f"  {line}")

            # -- the floor --
            floor_port = free_port()
            floor = Child(floor_main, floor_port, interval)
            floor.recv(30)
            connected = await generators.ask(
                connect_s, "connect", f"127.0.0.1:{floor_port}", args.channels
            )
            await probe_streams.connect(f"127.0.0.1:{floor_port}", 1)
            await asyncio.sleep(interval + 1.0)
            (r0, _), f0, ft0 = await floor.aask(30, "count"), pid_cpu_s(floor.pid), time.monotonic()
            await asyncio.sleep(args.floor_duration or args.duration)
            (r1, streams_n), f1, ft1 = (
                await floor.aask(30, "count"),
                pid_cpu_s(floor.pid),
                time.monotonic(),
            )
            received = r1 - r0
            if received:
                res.floor_us = (f1 - f0) / received * 1e6
            print(
                f"  floor (bare grpc.aio AgentService.Connect, drops every message): "
                f"{streams_n} streams, {received / (ft1 - ft0):.0f} reports/s received, "
                f"{(f1 - f0) / (ft1 - ft0):.2f} cores, {res.floor_us:.0f} us/report; "
                f"controller/floor {res.us_per_report / res.floor_us:.1f}x"
            )
            # The allocation floor: the same clients' Create+Release cycles
            # against the bare server (streams still open and reporting).
            if res.alloc_rate:
                floor_errors: Counter[str] = Counter()
                async with grpc.aio.insecure_channel(f"127.0.0.1:{floor_port}") as floor_channel:
                    floor_cycles = await alloc_cycles(
                        fleet_pb2_grpc.FleetServiceStub(floor_channel),
                        args.alloc_clients,
                        min(args.alloc_seconds, 5.0),
                        floor.pid,
                        floor_errors,
                    )
                res.alloc_floor, floor_cores = floor_cycles.rate, floor_cycles.cores
                alloc_us = res.alloc_cores / res.alloc_rate * 1e6
                quiet_us = res.quiet_alloc_cores / (res.quiet_alloc_rate or math.nan) * 1e6
                floor_alloc_us = (
                    floor_cores / res.alloc_floor * 1e6 if floor_cycles.admitted else float("nan")
                )
                print(
                    f"  allocation floor (bare grpc.aio CreateAllocation+ReleaseAllocation, "
                    f"answered from memory, {args.alloc_clients} clients): {res.alloc_floor:.0f} "
                    f"cycles/s, {floor_cores:.2f} cores, {floor_alloc_us:.0f} us/cycle; "
                    f"controller {res.alloc_rate:.0f}/s at {alloc_us:.0f} us/cycle "
                    f"({alloc_us / floor_alloc_us:.1f}x the floor's CPU)"
                    + (
                        f"; with the agents quiet {res.quiet_alloc_rate:.0f}/s at {quiet_us:.0f} "
                        f"us/cycle ({quiet_us / floor_alloc_us:.1f}x; the ratio to compare "
                        "across runs, as the machine's speed moves both)"
                        if res.quiet_measured and res.quiet_alloc_rate
                        else ""
                    )
                )
                for text, count in floor_errors.most_common(2):
                    print(f"    {count}x {text}")
            await generators.ask(60, "disconnect")
            await probe_streams.disconnect()
        finally:
            if probe_streams is not None:
                await probe_streams.disconnect()
            if generators is not None:
                generators.stop()
            for child in (floor, responder):
                if child is not None:
                    child.stop()
            if proc is not None:
                await asyncio.to_thread(stop_controller, proc)
            if log_dir is not None and log_path is not None:
                _keep_log(log_path, log_dir / f"controller-N{n}.log")
    if res.processed < 0.98 * res.offered:
        ncpu = len(os.sched_getaffinity(0))
        why = (
            "the controller's event loop is CPU-bound"
            if res.cores > 0.85
            else f"the machine's {ncpu} cores are shared with the generators"
        )
        res.notes.append(f"{res.processed:.0f} of {res.offered:.0f} reports/s visible: {why}")
    return res


def summary(r: Result, args: argparse.Namespace) -> str:
    k = max(1, args.compress)
    mode = f" (x{k} compressed: {r.agents} agents at {r.interval:g} s)" if k > 1 else ""
    if r.enrolled > r.agents:
        mode += f" ({r.enrolled} nodes enrolled)"
    ratio = r.us_per_report / r.floor_us
    return (
        f"fleet_scale: N={r.n}{mode}: {r.processed:.0f}/{r.offered:.0f} reports/s, "
        f"{r.cores:.2f} cores, {r.us_per_report:.0f} us/report (floor {r.floor_us:.0f} us, "
        f"{ratio:.1f}x), report p99 {ms(r.report_p99)}, GetNode p99 {ms(r.get_p99)}, "
        f"ListNodes p99 {ms(r.list_p99)}, {r.alloc_rate:.0f} allocations/s"
        + (f" ({r.quiet_alloc_rate:.0f} with the agents quiet)" if r.quiet_measured else "")
        + f", RSS {r.rss_mb:.0f} MB"
        + (f", agents paced to {r.asked:.2f} s" if r.asked > r.interval * 1.001 else "")
    )


def targets(r: Result) -> list[str]:
    def verdict(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    at_25k = r.us_per_report * 2500 / 1e6  # 25,000 agents at one report per 10 s
    ratio = r.us_per_report / r.floor_us
    return [
        f"  25,000 agents x 10 s on <= 2 cores: {at_25k:.2f} cores projected "
        f"({r.us_per_report:.0f} us/report x 2,500 reports/s; {verdict(at_25k <= 2)}; measured "
        + (
            f"with {r.enrolled} nodes enrolled, {r.agents} of them with agents)"
            if r.enrolled > r.agents
            else f"with {r.agents} nodes, so larger fleets' own costs are not in it)"
        ),
        f"  report p99 < 100 ms: {ms(r.report_p99)} ({verdict(r.report_p99 < 0.1)})",
        f"  GetNode p99 < 50 ms: {ms(r.get_p99)} ({verdict(r.get_p99 < 0.05)})",
        f"  <= 3x floor CPU per report: {ratio:.1f}x ({verdict(ratio <= 3)})",
        f"  >= 500 admitted allocations/s: {r.alloc_rate:.0f}/s beside the reports "
        f"({verdict(r.alloc_rate >= 500)}; bare gRPC with the same clients: "
        f"{r.alloc_floor:.0f} cycles/s)",
        *(
            [
                f"  >= 500 admitted allocations/s with the agents quiet: "
                f"{r.quiet_alloc_rate:.0f}/s ({verdict(r.quiet_alloc_rate >= 500)})"
            ]
            if r.quiet_measured
            else []
        ),
        *_allocation_budget(r),
        *(f"  note: {n}" for n in r.notes),
    ]


# Below this many allocations/s beside the reports, the window's CPU beyond
# the reports' is mostly noise in the reports' own share: no estimate from it.
BUDGET_MIN_RATE = 50.0


def _allocation_budget(r: Result) -> list[str]:
    """What 500 allocations/s would cost in CPU at this run's cycle: from the
    window with the agents quiet where it ran (the controller's CPU there is
    the allocations'), else from the window beside the reports (its CPU
    beyond the reports'), when that window admitted enough to say."""
    if r.alloc_rate >= 500 or (r.quiet_measured and r.quiet_alloc_rate >= 500):
        return []
    if r.quiet_measured and r.quiet_alloc_rate > 0:
        marginal = r.quiet_alloc_cores / r.quiet_alloc_rate
        source = "the controller's CPU with the agents quiet is"
    elif r.alloc_rate >= BUDGET_MIN_RATE:
        marginal = max(0.0, r.alloc_cores - r.cores) / r.alloc_rate
        source = "the allocation window's CPU beyond the reports' is"
    else:
        return [
            f"  what 500/s would take: not estimated (beside the reports only "
            f"{r.alloc_rate:.0f}/s were admitted, too few for their CPU to stand out from "
            f"the reports'; run with --quiet-alloc-seconds for a clean figure)"
        ]
    return [
        f"  what 500/s would take: {source} "
        f"{marginal * 1e3:.1f} ms a cycle, so 500 cycles/s is {500 * marginal:.2f} cores for "
        f"the allocations alone, beside {r.cores:.2f} for the reports, in one interpreter "
        f"(this machine: {os.cpu_count()} cores, shared with the generators and clients)"
    ]


async def amain(args: argparse.Namespace) -> int:
    _raise_fd_limit()
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    k = max(1, args.compress)
    print(
        f"kiln-controller at fleet scale: N = {', '.join(map(str, sizes))} at one report per "
        f"{args.interval:g} s"
        + (
            f", time-compressed x{k} (N/{k} agents at {args.interval / k:g} s: the same offered "
            f"report rate)"
            if k > 1
            else ""
        )
        + f"; {args.generators} generator processes"
        + (f"; {args.bmc_readers} BMC reader processes" if args.bmc_readers > 0 else "")
        + "; power sync every "
        f"{args.power_sync_interval:g} s; intake checks {args.checks}; ListNodes paging "
        + ("on" if PAGING and _NEXT else "absent (plain ListNodes)")
    )
    log_dir = Path(args.log_dir) if args.log_dir else None
    results = [await run_size(n, args, log_dir) for n in sizes]
    print()
    for r in results:
        print(summary(r, args))
        for line in targets(r):
            print(line)
    print(summary(results[-1], args))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1000,5000", help="fleet sizes, comma-separated")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between reports")
    parser.add_argument("--compress", type=int, default=10, help="N/K agents at interval/K")
    parser.add_argument(
        "--enrol-all",
        action="store_true",
        help="enrol all N nodes, not only the N/K with agents: the others never become ready, "
        "but the topology, the store, ListNodes and the BMC loops (power sync, leak "
        "watcher) are the whole fleet's",
    )
    parser.add_argument("--duration", type=float, default=30.0, help="report window, seconds")
    parser.add_argument("--floor-duration", type=float, default=0.0, help="0: --duration")
    parser.add_argument("--generators", type=int, default=4, help="load generator processes")
    parser.add_argument("--channels", type=int, default=4, help="gRPC channels per generator")
    parser.add_argument("--probes", type=int, default=8, help="latency probe agents")
    parser.add_argument(
        "--clients", type=int, default=8, help="concurrent GetNode and ListNodes clients"
    )
    parser.add_argument(
        "--alloc-clients",
        type=int,
        default=32,
        help="concurrent CreateAllocation+ReleaseAllocation clients (a scheduler's submitters)",
    )
    parser.add_argument("--api-seconds", type=float, default=5.0, help="GetNode, ListNodes")
    parser.add_argument("--alloc-seconds", type=float, default=10.0)
    parser.add_argument(
        "--quiet-alloc-seconds",
        type=float,
        default=10.0,
        help="a second allocation window with every agent quiet (0: none)",
    )
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=10.0,
        help="window of GetNode polling by the probe agents",
    )
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--enrol-in-flight", type=int, default=64)
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=0.0,
        help="longest wait for every agent stream to register (0: max(600 s, agents/25 s))",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=0.0,
        help="longest wait for ready nodes (0: max(60 s, nodes/20 s))",
    )
    parser.add_argument(
        "--stall",
        type=float,
        default=60.0,
        help="stop waiting for ready nodes after this long with none becoming ready",
    )
    parser.add_argument(
        "--pace-settle",
        type=float,
        default=120.0,
        help="longest wait, once the nodes are ready, for the controller to stop slowing "
        "the agents down (it may while the fleet comes up) before the report window",
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="seconds to wait once the nodes are ready, before the windows: with --enrol-all "
        "the leak watcher asks the BMCs again after 5-10 minutes, then ever less often up to "
        "hourly, so a hold puts the windows in that steady state rather than the bring-up",
    )
    parser.add_argument(
        "--agent-relays",
        type=int,
        default=0,
        help="the controller's --agent-relays: worker processes serve the agent streams on a "
        "port of their own (default 0: the controller's process serves them)",
    )
    parser.add_argument(
        "--api-via-relays",
        action="store_true",
        help="with --agent-relays: the benchmark's FleetService calls (enrolment, GetNode, "
        "ListNodes, the allocation windows) go to the relay workers' port too",
    )
    parser.add_argument(
        "--bmc-readers",
        type=int,
        default=0,
        help="the controller's --bmc-readers: processes do the power sync's and the leak "
        "watcher's BMC reads (default 0: the controller's process does them)",
    )
    parser.add_argument("--bmc", choices=["responder", "dead"], default="responder")
    parser.add_argument(
        "--checks",
        default="off",
        help="the controller's --checks (default off: the generators run no DCGM or "
        "nvbandwidth, so the intake checks would quarantine every node)",
    )
    parser.add_argument(
        "--power-sync-interval",
        type=float,
        default=3600.0,
        help="the controller's (default here: out of the window; "
        "bench/bmc_power_sync.py measures it)",
    )
    parser.add_argument(
        "--controller-options",
        default="",
        help="more kiln-controller options, as one string (e.g. '--power-sync-spread 0.5')",
    )
    parser.add_argument("--log-dir", help="keep each controller's log here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return asyncio.run(amain(args))
    finally:
        _kill_children()


if __name__ == "__main__":
    sys.exit(main())
