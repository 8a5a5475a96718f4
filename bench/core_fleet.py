"""A fleet through the core alone, for the in-process benchmarks
(``allocation_core.py``, ``node_pages.py``): no gRPC, no processes."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "proto"), str(ROOT / "tests" / "core"), str(ROOT / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from core_builders import Racks  # noqa: E402

from controller.core.fleet import Fleet  # noqa: E402

RACK_SIZE = 32


async def ready_nodes(fleet: Fleet, stack: contextlib.AsyncExitStack, count: int) -> list[str]:
    """``count`` 8-GPU H200 nodes, ``RACK_SIZE`` a rack, enrolled and brought
    to ready through the core's own steps (the ``tests/core`` fakes play the
    BMCs and the agents); returns their names."""
    racks = Racks(fleet, stack)
    names = [f"n{i:05d}" for i in range(count)]
    for start in range(0, len(names), RACK_SIZE):
        await racks.add(
            names[start : start + RACK_SIZE],
            rack=f"r{start // RACK_SIZE}",
            gpu_count=8,
            model="NVIDIA H200",
        )
    return names
