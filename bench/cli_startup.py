"""Benchmark: how long ``kiln`` takes to start, against bare Python.

Runs each command 15 times in a fresh interpreter and prints the median wall
time, beside the floor (``python -c pass``, the interpreter and ``site``
alone) measured in the same run:

- ``kiln --help`` (no grpc, no protobuf messages loaded);
- ``kiln nodes list`` itself, against a loopback port where nothing listens
  with a 50 ms deadline: its start-up, its imports (grpc and the stubs) and
  one refused dial (a connection refused at once: well under the deadline);
- what ``kiln nodes list`` imports before it dials, alone.

Target: under 0.3 s in Python start-up and imports for both. How long it
takes: about 15 s.

    python bench/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time

NODES_LIST_IMPORTS = (
    "import controller.cli.main, controller.cli.nodes, grpc; "
    "from kiln.v1 import fleet_pb2, fleet_pb2_grpc"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def median_seconds(argv: list[str], runs: int, *, check: bool = True) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    python = sys.executable
    floor = median_seconds([python, "-c", "pass"], args.runs)
    help_s = median_seconds([python, "-m", "controller.cli.main", "--help"], args.runs)
    imports_s = median_seconds([python, "-c", NODES_LIST_IMPORTS], args.runs)
    dead = f"127.0.0.1:{free_port()}"
    kiln = [python, "-m", "controller.cli.main", "--controller", dead, "--timeout", "0.05"]
    list_s = median_seconds(
        [*kiln, "nodes", "list"],
        args.runs,
        check=False,
    )
    print(f"python -c pass (floor):          {floor * 1000:6.0f} ms")
    print(f"kiln --help:                     {help_s * 1000:6.0f} ms ({help_s / floor:.1f}x)")
    print(f"kiln nodes list (refused dial):  {list_s * 1000:6.0f} ms ({list_s / floor:.1f}x)")
    print(f"  of which its imports alone:    {imports_s * 1000:6.0f} ms")
    verdict = "MET" if max(help_s, list_s) < 0.3 else "MISSED"
    print(
        f"cli_startup: --help {help_s * 1000:.0f} ms, nodes list {list_s * 1000:.0f} ms "
        f"(floor {floor * 1000:.0f} ms); < 300 ms: {verdict}"
    )


if __name__ == "__main__":
    main()
