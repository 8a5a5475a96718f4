"""The controller's CPU for one agent report's first steps, made in the
controller (parse, check against the request limits, convert, pack) against
made in a relay worker (``controller/api/relay/digest.py``: the controller
only unpacks), on the same report.

The report is the benchmark generators' (``fleet_load.node_messages``: 8
H200s from the fake NVML, 1,096 bytes). Only these steps are timed: the
report's later steps (the policies, the in-memory view, the event loop's
turn) are the same either way; ``fleet_scale.py`` measures the whole path
in a real controller. Timings are the best of several rounds.

    python bench/report_digest.py [--reports 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "proto"), str(ROOT / "bench")]

from fleet_load import node_messages  # noqa: E402

from controller.api.convert import health_from_pb  # noqa: E402
from controller.api.limits import Checker, _checked  # noqa: E402
from controller.api.relay.digest import ReportDigest  # noqa: E402
from controller.core.health import pack_report, unpack_report  # noqa: E402
from kiln.v1 import agent_pb2  # noqa: E402


def best_us(body: Callable[[], object], reports: int, rounds: int) -> float:
    """The best round's CPU per call, in microseconds."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(reports):
            body()
        best = min(best, time.process_time() - started)
    return best / reports * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    _, message = node_messages("fs-00001", 7)
    raw = message.SerializeToString()
    checker = Checker()
    digest = ReportDigest()
    packed = digest.packed(raw)
    assert packed is not None
    parse = agent_pb2.AgentMessage.FromString

    def in_controller() -> object:
        # What the controller did with each message: the request limits'
        # parse and check (controller/api/limits.py), then AgentService's
        # conversion and LiveHealth's packing.
        msg = _checked(checker, parse(raw))
        return pack_report(health_from_pb(msg.health))

    def digested() -> object:
        # What it does now: the typed report from the worker's packed one.
        return unpack_report(packed)

    assert unpack_report(packed) == health_from_pb(message.health)
    before = best_us(in_controller, args.reports, args.rounds)
    after = best_us(digested, args.reports, args.rounds)
    worker = best_us(lambda: digest.packed(raw), args.reports, args.rounds)
    print(f"report: {len(raw)} bytes, 8 GPUs; best of {args.rounds} rounds of {args.reports}")
    print(f"  in the controller, parse + check + convert + pack: {before:.1f} us")
    print(f"  digested by a relay worker, the controller unpacks: {after:.1f} us")
    print(f"  the worker's digest (parse + check + convert + pack): {worker:.1f} us")
    print(
        f"report_digest: the controller's CPU for a report's first steps {after:.1f} us "
        f"against {before:.1f} us ({before / after:.1f}x less; {before - after:.1f} us a "
        f"report, {(before - after) * 2500 / 1e6:.2f} of a core at 2,500 reports/s), "
        f"the worker {worker:.1f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
