"""Benchmark: healthy BMCs beside 1,000 dead IPMI and 1,000 dead Redfish BMCs.

What is measured:

1. **Healthy power-read latency**, through Kiln's production BMC path --
   ``controller.bmc.gateway.PoolGateway`` over a ``BmcPool`` with the
   controller's defaults (256 threads per protocol, IPMI capped at 32; 10 s
   hard deadline per call; 3 attempts), what ``kiln nodes power NODE status``
   and the core's power sync call. ``--healthy`` Redfish BMCs are served by
   sushy-tools' emulator (one emulator process, one system each). ``--readers``
   loops read their power one after another for ``--window`` seconds, first
   alone (baseline), then while the power sync's bulk read
   (``poll_power``, concurrency ``--concurrency`` like
   ``controller/core/power_sync.py``) runs over every BMC, dead ones included.
   Dead BMCs live in a helper process on loopback: an IPMI one is a UDP socket
   that takes packets and never answers; a Redfish one is a TCP listener that
   never accepts (the connection opens, no answer comes) -- the worst kind, as
   each call holds its thread for the whole deadline. The window starts once
   every dead call is in flight and ends long before their breakers open.
   Prints p50/p99 for both and the ratio (goal: under 1.5x).

2. **SIGTERM under that load**: a real ``kiln-controller`` process (SQLite in
   a temporary directory, loopback, so no authentication) gets every dead BMC
   enrolled over gRPC (its lifecycle starts inspecting them at once) and a
   ``PowerNodes --all status`` stream; once their calls are in flight it gets
   SIGTERM, and the time to exit is measured (goal: under 5 s).

Prints what it measured and a one-line summary last. About two minutes with
the defaults on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from controller.bmc import BmcPool  # noqa: E402
from controller.bmc.gateway import PoolGateway  # noqa: E402
from controller.core.errors import KilnError  # noqa: E402
from controller.core.model import BmcTarget  # noqa: E402
from controller.sim.ports import free_port  # noqa: E402
from controller.sim.redfish_emulator import RedfishEmulator, make_systems  # noqa: E402

USER, PASSWORD = "bench", "bench-password"  # IPMI 2.0: at most 20 bytes


# --- the dead BMCs (a child process, so their sockets are not ours) ------------
def _serve_dead(n_ipmi: int, n_redfish: int) -> None:
    """Bind the dead BMCs, print their ports as JSON, hold them until stdin closes."""
    _raise_fd_limit()
    udp, tcp = [], []
    for _ in range(n_ipmi):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        udp.append(sock)
    for _ in range(n_redfish):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # never accepted: connections open, nothing answers
        tcp.append(sock)
    ports = {
        "ipmi": [s.getsockname()[1] for s in udp],
        "redfish": [s.getsockname()[1] for s in tcp],
    }
    print(json.dumps(ports), flush=True)
    sys.stdin.read()  # until the parent goes


def start_dead(n_ipmi: int, n_redfish: int) -> tuple[subprocess.Popen[str], list[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-dead", str(n_ipmi), str(n_redfish)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ports = json.loads(proc.stdout.readline())
    ipmi = [f"ipmi://127.0.0.1:{p}" for p in ports["ipmi"]]
    redfish = [f"redfish+http://127.0.0.1:{p}/redfish/v1/Systems/dead" for p in ports["redfish"]]
    return proc, ipmi, redfish


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def interleave(*groups: list[BmcTarget]) -> list[BmcTarget]:
    """Mix the groups as a database's order would (no group all first)."""
    out: list[BmcTarget] = []
    longest = max(len(g) for g in groups)
    for i in range(longest):
        out.extend(g[i] for g in groups if i < len(g))
    return out


# --- 1. healthy latency ------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def read_loop(
    gateway: PoolGateway, targets: list[BmcTarget], readers: int, seconds: float
) -> tuple[list[float], int]:
    """``readers`` loops, each reading the targets' power in turn; returns
    per-read latencies (successful reads) and the number of failed reads."""
    latencies: list[float] = []
    failures = 0
    stop = time.monotonic() + seconds

    async def reader(offset: int) -> None:
        nonlocal failures
        i = offset
        while time.monotonic() < stop:
            target = targets[i % len(targets)]
            i += 1
            started = time.monotonic()
            try:
                await gateway.power_state(target)
            except KilnError as e:
                failures += 1
                if failures <= 3:
                    print(f"    healthy read failed: {target.node}: {e}")
                continue
            latencies.append(time.monotonic() - started)

    await asyncio.gather(*(reader(k * len(targets) // readers) for k in range(readers)))
    return latencies, failures


async def latency(
    args: argparse.Namespace, emu: RedfishEmulator, ipmi: list[str], redfish: list[str]
) -> dict[str, float]:
    pool = BmcPool()  # the controller's defaults (controller/server.py)
    gateway = PoolGateway(pool)
    healthy = [
        BmcTarget(f"healthy-{i:03d}", emu.system_url(s.uuid), USER, PASSWORD)
        for i, s in enumerate(emu.systems)
    ]
    dead_ipmi = [BmcTarget(f"dead-ipmi-{i:04d}", u, USER, PASSWORD) for i, u in enumerate(ipmi)]
    dead_rf = [BmcTarget(f"dead-rf-{i:04d}", u, USER, PASSWORD) for i, u in enumerate(redfish)]
    everyone = interleave(dead_ipmi, dead_rf, healthy)
    try:
        await read_loop(gateway, healthy, args.readers, 2.0)  # connect, warm up
        cpu = time.process_time()
        base, base_failed = await read_loop(gateway, healthy, args.readers, args.window)
        print(
            f"  without dead BMCs: {len(base)} reads, p50 {pct(base, 0.5) * 1e3:.1f} ms, "
            f"p99 {pct(base, 0.99) * 1e3:.1f} ms, {base_failed} failed; "
            f"controller-side CPU {time.process_time() - cpu:.1f}s"
        )
        sync = asyncio.create_task(gateway.poll_power(everyone, args.concurrency))
        await asyncio.sleep(args.settle)
        stats = pool.worker_stats() if hasattr(pool, "worker_stats") else {}
        print(
            "  dead load in flight: "
            + "; ".join(
                f"{p} {s.running} running ({s.untrusted_running} for unanswering BMCs), "
                f"{s.queued_trusted + s.queued_untrusted} queued, {s.threads} threads"
                for p, s in sorted(stats.items())
            )
        )
        cpu = time.process_time()
        loaded, loaded_failed = await read_loop(gateway, healthy, args.readers, args.window)
        cpu = time.process_time() - cpu
        if sync.done():
            print("  (the power sync pass finished inside the window)")
        sync.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sync
        print(
            f"  with {len(ipmi)} dead IPMI + {len(redfish)} dead Redfish: {len(loaded)} reads, "
            f"p50 {pct(loaded, 0.5) * 1e3:.1f} ms, p99 {pct(loaded, 0.99) * 1e3:.1f} ms, "
            f"{loaded_failed} failed; controller-side CPU {cpu:.1f}s"
        )
        started = time.monotonic()
        await gateway.close()
        closed = time.monotonic() - started
        print(f"  gateway close with the dead calls in flight: {closed:.2f}s")
    finally:
        await gateway.close()
    return {
        "base_p50": pct(base, 0.5),
        "base_p99": pct(base, 0.99),
        "p50": pct(loaded, 0.5),
        "p99": pct(loaded, 0.99),
        "mean_ratio": statistics.mean(loaded) / statistics.mean(base),
        "failed": float(loaded_failed + base_failed),
        "close": closed,
    }


# --- 2. SIGTERM ----------------------------------------------------------------
def sigterm(args: argparse.Namespace, urls: list[str], workdir: Path) -> tuple[float, int, str]:
    """Returns (seconds from SIGTERM to exit, exit code, last log lines)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "proto"), env.get("PYTHONPATH", "")])
    log_path = args.controller_log or workdir / "controller.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "controller.main",
                "--listen", f"127.0.0.1:{port}",
                "--state-dir", str(workdir / "state"),
                "--power-sync-interval", "3600",
            ],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )  # fmt: skip
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _wait_serving(channel, proc, health_pb2, health_pb2_grpc)
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            started = time.monotonic()
            _enrol(stub, fleet_pb2, urls)
            print(f"  enrolled {len(urls)} dead BMCs in {time.monotonic() - started:.1f}s")
            request = fleet_pb2.PowerNodesRequest(all=True, action=types_pb2.POWER_ACTION_STATUS)
            stream = stub.PowerNodes(request, timeout=600)
            answered = {"n": 0}

            def drain() -> None:
                with contextlib.suppress(grpc.RpcError):
                    for _ in stream:
                        answered["n"] += 1

            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
            time.sleep(args.sigterm_after)
            print(
                f"  PowerNodes --all status in flight for {args.sigterm_after:.0f}s "
                f"({answered['n']} of {len(urls)} answered); sending SIGTERM"
            )
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            took = time.monotonic() - sent
            stream.cancel()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    tail = log_path.read_text(errors="replace").splitlines()[-5:]
    return took, proc.returncode, "\n".join(tail)


def _wait_serving(
    channel: object, proc: subprocess.Popen[bytes], health_pb2: object, health_pb2_grpc: object
) -> None:
    import grpc

    health = health_pb2_grpc.HealthStub(channel)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while True:
        try:
            health.Check(health_pb2.HealthCheckRequest(), timeout=2)  # type: ignore[attr-defined]
            return
        except grpc.RpcError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("kiln-controller did not start") from None
            time.sleep(0.2)


def _enrol(stub: object, fleet_pb2: object, urls: list[str], in_flight: int = 64) -> None:
    import grpc

    def request(i: int, url: str) -> object:
        kind = "ipmi" if url.startswith("ipmi") else "rf"
        return fleet_pb2.EnrollNodeRequest(  # type: ignore[attr-defined]
            name=f"dead-{kind}-{i:04d}", bmc_url=url, username=USER, password=PASSWORD
        )

    todo = list(enumerate(urls))
    while todo:
        batch, todo = todo[:in_flight], todo[in_flight:]
        calls = [(i, u, stub.EnrollNode.future(request(i, u), timeout=30)) for i, u in batch]  # type: ignore[attr-defined]
        for i, url, call in calls:
            try:
                call.result()
            except grpc.RpcError as e:
                if e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:  # the per-client rate
                    todo.append((i, url))
                    time.sleep(0.05)
                else:
                    raise


# --- main ----------------------------------------------------------------------
async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--healthy", type=int, default=40)
    parser.add_argument("--dead-ipmi", type=int, default=1000)
    parser.add_argument("--dead-redfish", type=int, default=1000)
    parser.add_argument("--window", type=float, default=15.0, help="seconds of reads per phase")
    parser.add_argument("--readers", type=int, default=4, help="concurrent healthy readers")
    parser.add_argument(
        "--concurrency", type=int, default=256, help="power sync's bulk concurrency"
    )
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds before the loaded window"
    )
    parser.add_argument("--sigterm-after", type=float, default=3.0)
    parser.add_argument("--no-sigterm", action="store_true", help="skip the controller process")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency phases")
    parser.add_argument("--controller-log", type=Path, help="keep the controller's log here")
    parser.add_argument("--serve-dead", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_dead:
        _serve_dead(*args.serve_dead)
        return 0
    logging.basicConfig(level=logging.ERROR)
    _raise_fd_limit()
    print(
        f"{args.healthy} healthy Redfish BMCs (sushy-tools emulator) beside {args.dead_ipmi} dead "
        f"IPMI and {args.dead_redfish} dead Redfish BMCs on loopback"
    )
    dead, ipmi, redfish = start_dead(args.dead_ipmi, args.dead_redfish)
    figures: dict[str, float] | None = None
    stop: float | None = None
    try:
        if not args.no_latency:
            async with RedfishEmulator(make_systems(args.healthy)) as emu:
                figures = await latency(args, emu, ipmi, redfish)
        if not args.no_sigterm:
            with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
                stop, rc, tail = await asyncio.to_thread(sigterm, args, ipmi + redfish, Path(tmp))
            print(f"  kiln-controller stopped {stop:.2f}s after SIGTERM (exit code {rc})")
            if rc != 0 or "Traceback" in tail:
                print("  its last log lines:\n    " + tail.replace("\n", "\n    "))
    finally:
        if dead.stdin is not None:
            dead.stdin.close()
        dead.wait(timeout=10)
    latency_text = "latency not measured"
    if figures is not None:
        r50 = figures["p50"] / figures["base_p50"]
        r99 = figures["p99"] / figures["base_p99"]
        verdict = "MET" if max(r50, r99) < 1.5 and not figures["failed"] else "MISSED"
        mean = figures["mean_ratio"]
        print(f"  ratio loaded/baseline: p50 {r50:.2f}x, p99 {r99:.2f}x, mean {mean:.2f}x")
        latency_text = (
            f"healthy read p50 {figures['base_p50'] * 1e3:.1f} -> {figures['p50'] * 1e3:.1f} ms "
            f"({r50:.2f}x), p99 {figures['base_p99'] * 1e3:.1f} -> {figures['p99'] * 1e3:.1f} ms "
            f"({r99:.2f}x), 1.5x goal {verdict}"
        )
    sigterm_text = "SIGTERM not measured"
    if stop is not None:
        sigterm_text = f"SIGTERM stop {stop:.2f}s (5s goal {'MET' if stop < 5 else 'MISSED'})"
    print(
        f"SUMMARY: {args.healthy} healthy beside {args.dead_ipmi} dead IPMI + "
        f"{args.dead_redfish} dead Redfish: {latency_text}; {sigterm_text}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
