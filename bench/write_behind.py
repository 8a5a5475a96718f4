"""The health write-behind's cost per row: the controller's own flush
(``controller/core/live.py`` ``LiveHealth.flush`` into a real ``SqlStore`` on
a SQLite file, its writing thread and all) against the database's own
floor, measured in the same run: bare ``sqlite3`` writing the same
documents with the same UPDATE, 250 rows a transaction, rows in the order
they sit in the table.

Each round has half the fleet report, in a random order (25,000 agents at
10 s: 12,500 reports between two flushes 5 s apart), then times one flush:
CPU (both threads, ``process_time``) and wall time per row written. The
reports are the benchmark generators' (``fleet_load.node_messages``: 8
H200s from the fake NVML), digested as a relay worker digests them. What
it leaves out: the event loop's other work beside the flush, and the rest
of the write thread's queue (a real controller's flush shares the thread
with allocations and transitions: ``fleet_scale.py`` measures it all).

    python bench/write_behind.py [--nodes 25000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto"), str(ROOT / "bench")]

from fleet_load import node_messages  # noqa: E402

from controller.api.relay.digest import ReportDigest  # noqa: E402
from controller.core.health import PackedReport, unpack_report  # noqa: E402
from controller.core.live import LiveHealth  # noqa: E402
from controller.core.records import NodeRecord  # noqa: E402
from controller.store.engine import open_engine  # noqa: E402
from controller.store.repositories import packed_to_json  # noqa: E402
from controller.store.sql_store import SqlStore, SqlTx  # noqa: E402

BATCH = 250


def reports(count: int) -> list[PackedReport]:
    """``count`` distinct reports as a relay worker packs them."""
    digest = ReportDigest()
    packed = []
    for i in range(count):
        _, message = node_messages(f"wb-{i:05d}", i)
        one = digest.packed(message.SerializeToString())
        assert one is not None
        packed.append(one)
    return packed


async def controller_rounds(
    path: str, names: list[str], packed: list[PackedReport], rounds: int, rng: random.Random
) -> list[tuple[float, float, int]]:
    """(CPU s, wall s, rows) of each round's flush."""
    store = SqlStore(open_engine(f"sqlite:///{path}"))
    try:

        def enrol(tx: SqlTx) -> None:
            for name in names:
                tx.nodes.add(
                    NodeRecord(name=name, bmc_url=f"redfish+http://127.0.0.1:9/{name}"), ""
                )

        await store.tx(enrol)
        live = LiveHealth(store, batch=BATCH)
        typed = [unpack_report(p) for p in packed]
        figures = []
        for r in range(rounds):
            for i, name in enumerate(rng.sample(names, len(names) // 2)):
                live.note(name, typed[i % len(typed)], 1000.0 + r, packed=packed[i % len(packed)])
            cpu, wall = time.process_time(), time.perf_counter()
            written = await live.flush()
            figures.append((time.process_time() - cpu, time.perf_counter() - wall, written))
        return figures
    finally:
        store.close()


def floor_rounds(
    path: str, names: list[str], packed: list[PackedReport], rounds: int, rng: random.Random
) -> list[tuple[float, float, int]]:
    """The same documents written by bare sqlite3, in table order."""
    documents = [packed_to_json(p) for p in packed]
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    figures = []
    try:
        for r in range(rounds):
            chosen = sorted(rng.sample(names, len(names) // 2))
            cpu, wall = time.process_time(), time.perf_counter()
            for start in range(0, len(chosen), BATCH):
                rows = [
                    (documents[i % len(documents)], 2000.0 + r, name)
                    for i, name in enumerate(chosen[start : start + BATCH], start)
                ]
                connection.execute("BEGIN")
                connection.executemany(
                    "UPDATE nodes SET health_json = ?, agent_last_seen = ? WHERE name = ?", rows
                )
                connection.execute("COMMIT")
            figures.append((time.process_time() - cpu, time.perf_counter() - wall, len(chosen)))
    finally:
        connection.close()
    return figures


def per_row(figures: list[tuple[float, float, int]]) -> tuple[float, float]:
    """Median CPU and wall microseconds per row over the rounds."""
    cpu = statistics.median(c / n * 1e6 for c, _, n in figures)
    wall = statistics.median(w / n * 1e6 for _, w, n in figures)
    return cpu, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=25000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    names = [f"wb-{i:05d}" for i in range(args.nodes)]
    packed = reports(64)
    with tempfile.TemporaryDirectory(prefix="kiln-wb-") as folder:
        path = f"{folder}/kiln.db"
        rng = random.Random(args.seed)
        ours = asyncio.run(controller_rounds(path, names, packed, args.rounds, rng))
        floor = floor_rounds(path, names, packed, args.rounds, rng)
    (cpu, wall), (floor_cpu, floor_wall) = per_row(ours), per_row(floor)
    rows = ours[0][2]
    print(
        f"{args.nodes} nodes, {rows} reports a flush (half the fleet, in arrival order), "
        f"{args.rounds} rounds, medians:"
    )
    print(
        f"  controller's flush: {cpu:.1f} us CPU a row, {wall:.1f} us wall "
        f"({1e6 / wall:.0f} rows/s)"
    )
    print(
        f"  bare sqlite3, same rows in table order: {floor_cpu:.1f} us CPU, "
        f"{floor_wall:.1f} us wall"
    )
    print(
        f"write_behind: {cpu:.1f} us CPU a row against the bare database's {floor_cpu:.1f} "
        f"({cpu / floor_cpu:.1f}x); at 2,500 reports/s (25,000 agents at 10 s) "
        f"{cpu * 2500 / 1e6:.2f} cores"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
