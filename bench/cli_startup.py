"""Benchmark: how long ``kiln`` takes to start, against bare Python.

Runs each command 15 times in a fresh interpreter and prints the median wall
time, beside the floor (``python -c pass``, the interpreter and ``site``
alone) measured in the same run:

- ``kiln --help`` (no grpc, no protobuf messages loaded);
- what ``kiln nodes list`` imports before it dials: the CLI, grpc and the
  generated stubs (the call itself is left out: it is the controller's time).

Target: under 0.3 s in Python start-up and imports for both. How long it
takes: about 15 s.

    python bench/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

NODES_LIST_IMPORTS = (
    "import controller.cli.main, controller.cli.nodes, grpc; "
    "from kiln.v1 import fleet_pb2, fleet_pb2_grpc"
)


def median_seconds(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    python = sys.executable
    floor = median_seconds([python, "-c", "pass"], args.runs)
    help_s = median_seconds([python, "-m", "controller.cli.main", "--help"], args.runs)
    list_s = median_seconds([python, "-c", NODES_LIST_IMPORTS], args.runs)
    print(f"python -c pass (floor):          {floor * 1000:6.0f} ms")
    print(f"kiln --help:                     {help_s * 1000:6.0f} ms ({help_s / floor:.1f}x)")
    print(f"kiln nodes list, before dialing: {list_s * 1000:6.0f} ms ({list_s / floor:.1f}x)")
    verdict = "MET" if max(help_s, list_s) < 0.3 else "MISSED"
    print(
        f"cli_startup: --help {help_s * 1000:.0f} ms, nodes list imports {list_s * 1000:.0f} ms "
        f"(floor {floor * 1000:.0f} ms); < 300 ms: {verdict}"
    )


if __name__ == "__main__":
    main()
