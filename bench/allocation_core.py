"""Allocation cycles through the core alone, on SQLite: no gRPC, no processes.

The controller's allocation figure (``fleet_scale.py``) swings about 2x
between runs on a shared 2-core machine, and half of its CPU is gRPC. This
measures the other half, steadier, for A/B work on the core and the store:
``--nodes`` 8-GPU nodes are enrolled and brought to ready through the core's
own steps on a real ``SqlStore`` (SQLite in a temporary directory; the
``tests/core`` fakes play the BMCs and the agents, answering every command at
once), the fleet's loops are started, and ``--clients`` tasks loop the
cycle an API call makes: ``create_allocation`` (one node) and its audit
entry, ``release`` and its audit entry; the lifecycle resets each released
node and makes it ready again, as in production.

The floor, in the same run: the same clients sending the same number of
units of work a cycle (five: the admitting pass, two audits, the release,
the reset) through the same store, each writing one event: the group
commit's own cost, with none of the core's reads, rules or rows.

Printed per round: cycles/s, CPU per cycle (process, and per thread: the
event loop and the database thread), SQL statements and commits per cycle;
the floor's units/s and CPU per unit; and the ratio.

    python bench/allocation_core.py [--nodes 100] [--clients 8] [--seconds 5] [--rounds 3]
                                    [--held 0]

``--held N`` opens N one-node allocations first and keeps them through the
round: running jobs, which every scheduling pass walks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "proto"), str(ROOT / "tests" / "core"), str(ROOT / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from core_fakes import FakeBmc  # noqa: E402
from core_fleet import ready_nodes  # noqa: E402
from sqlalchemy import event  # noqa: E402

from controller.core.audit import AuditEntry  # noqa: E402
from controller.core.eventlog import record  # noqa: E402
from controller.core.fleet import Fleet  # noqa: E402
from controller.core.kinds import EventKind  # noqa: E402
from controller.core.model import AllocationSpec  # noqa: E402
from controller.store.engine import default_sqlite_url, open_engine  # noqa: E402
from controller.store.sql_store import SqlStore, SqlTx  # noqa: E402

UNITS_PER_CYCLE = 5  # the pass, two audits, the release, the reset after it
ENTRY = AuditEntry(
    who="bench",
    role="admin",
    method="CreateAllocation",
    code="OK",
    arguments={"key": "k", "spec": {"nodes": 1}},
    via="token",
    peer="ipv4:127.0.0.1:1",
)


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's threads, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


class Statements:
    """SQL statements and commits sent on ``engine`` while counting."""

    def __init__(self, engine: Any) -> None:
        self.counts: Counter[str] = Counter()
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, *_: Any) -> None:
        self.counts["statements"] += 1

    def _commit(self, *_: Any) -> None:
        self.counts["commits"] += 1


async def timed(clients: int, seconds: float, body: Any) -> tuple[int, float, float, list[float]]:
    """Run ``clients`` loops of ``body`` for ``seconds``: (loops, wall, process
    CPU, the two busiest threads' CPU)."""
    done = 0
    stop = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await body()
            done += 1

    t0, c0, th0 = time.monotonic(), time.process_time(), thread_cpu()
    await asyncio.gather(*(client() for _ in range(clients)))
    t1, c1, th1 = time.monotonic(), time.process_time(), thread_cpu()
    busiest = sorted((th1[k] - th0.get(k, 0.0) for k in th1), reverse=True)[:2]
    return done, t1 - t0, c1 - c0, busiest


async def hold(fleet: Fleet, count: int) -> int:
    """Open ``count`` one-node allocations that stay held through the round
    (jobs running beside the cycles, which every scheduling pass sees)."""
    gate = asyncio.Semaphore(16)

    async def one() -> None:
        async with gate:
            await fleet.create_allocation(uuid.uuid4().hex, AllocationSpec(nodes=1))

    await asyncio.gather(*(one() for _ in range(count)))
    return count


async def one_round(args: argparse.Namespace) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="kiln-alloc-core-") as tmp:
        engine = open_engine(default_sqlite_url(Path(tmp)))
        store = SqlStore(engine)
        fleet = Fleet(store, FakeBmc())
        try:
            async with contextlib.AsyncExitStack() as stack:
                await ready_nodes(fleet, stack, args.nodes)
                await fleet.start()
                await asyncio.sleep(0.5)
                await fleet.lifecycle.settle()
                held = await hold(fleet, args.held)
                print(
                    f"  {args.nodes} nodes ready, {held} held by open allocations; cycling",
                    flush=True,
                )

                async def cycle() -> None:
                    alloc = await fleet.create_allocation(uuid.uuid4().hex, AllocationSpec(nodes=1))
                    await fleet.record_audit(ENTRY)
                    await fleet.release(alloc.id)
                    await fleet.record_audit(ENTRY)

                counting = Statements(engine)
                cycles, wall, cpu, threads = await timed(args.clients, args.seconds, cycle)
                sql = counting.counts

                def one_event(tx: SqlTx) -> None:
                    record(tx, EventKind.AUDIT_CALL, reason="floor", who="bench")

                async def floor_cycle() -> None:
                    for _ in range(UNITS_PER_CYCLE):
                        await store.tx(one_event)

                await fleet.lifecycle.settle()
                f_cycles, f_wall, f_cpu, _ = await timed(args.clients, args.seconds, floor_cycle)
                await fleet.stop()
        finally:
            store.close()
    rate, per_cycle = cycles / wall, cpu / cycles * 1e6
    f_rate, f_per_cycle = f_cycles / f_wall, f_cpu / f_cycles * 1e6
    print(
        f"  core: {rate:.0f} cycles/s, {per_cycle:.0f} us CPU a cycle (threads: "
        + ", ".join(f"{t / cycles * 1e6:.0f}" for t in threads)
        + f" us), {sql['statements'] / cycles:.1f} statements and "
        f"{sql['commits'] / cycles:.2f} commits a cycle; floor ({UNITS_PER_CYCLE} one-event "
        f"units a cycle through the same store): {f_rate:.0f} cycles/s, {f_per_cycle:.0f} us "
        f"a cycle; core/floor CPU {per_cycle / f_per_cycle:.1f}x",
        flush=True,
    )
    return rate, per_cycle / f_per_cycle


async def amain(args: argparse.Namespace) -> None:
    print(
        f"allocation cycles through the core on SQLite: {args.nodes} nodes, {args.clients} "
        f"clients, {args.seconds:g} s a round, {args.rounds} rounds, {args.held} allocations "
        "held (no gRPC: the fakes of "
        "tests/core play BMCs and agents)",
        flush=True,
    )
    results = [await one_round(args) for _ in range(args.rounds)]
    rates = [r for r, _ in results]
    ratios = [x for _, x in results]
    print(
        f"allocation_core: median {statistics.median(rates):.0f} cycles/s "
        f"(rounds {min(rates):.0f}-{max(rates):.0f}), median "
        f"{statistics.median(ratios):.1f}x the floor's CPU a cycle"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--held", type=int, default=0, help="one-node allocations held open through each round"
    )
    asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
