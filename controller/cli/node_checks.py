"""``kiln nodes check`` and ``kiln nodes checks``: run the health-check suite
on nodes now, and read a node's check history (docs/health-checks.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from controller.cli.client import connect
from controller.cli.output import emit, emit_json, emit_table, fmt_when, render_table
from kiln.v1 import fleet_pb2

LEVELS = ("quick", "medium", "long")


def register(sub: Any) -> None:
    """Add ``check`` and ``checks`` under ``kiln nodes``."""
    p = sub.add_parser(
        "check",
        help="run a level of the health-check suite on ready nodes now",
        description="Run a level of the check suite now on ready nodes no allocation holds "
        "(all of them or none). They are testing (not schedulable) until it ends, then ready "
        "again, or quarantined with the failed check's words. With --rack, every node of the "
        "rack runs it, and rack-scoped checks (an NVL72's NVLink check) run on all trays "
        "together.",
    )
    p.add_argument("names", nargs="*", metavar="NODE")
    p.add_argument("--rack", default="", help="every node of this rack")
    p.add_argument("--level", default="quick", choices=LEVELS, help="default %(default)s")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("checks", help="a node's check history, newest last")
    p.add_argument("name")
    p.add_argument("--limit", type=int, default=20, help="runs shown (default %(default)s)")
    p.add_argument("--verbose", "-v", action="store_true", help="every check's figures too")
    p.set_defaults(func=cmd_checks)


def cmd_check(args: argparse.Namespace) -> int:
    request = fleet_pb2.RunChecksRequest(nodes=args.names, rack=args.rack, level=args.level)
    with connect(args) as session:
        started = session.stub.RunChecks(request, timeout=session.timeout)
        if session.json:
            emit_json(started)
        else:
            emit(
                f"{args.level} checks started on {len(started.started)} node(s): "
                + ", ".join(started.started)
            )
            emit("next: kiln nodes checks NODE (the results), kiln events watch --kind node.check")
    return 0


def cmd_checks(args: argparse.Namespace) -> int:
    request = fleet_pb2.ListChecksRequest(node=args.name, limit=args.limit)
    with connect(args) as session:
        answer = session.stub.ListChecks(request, timeout=session.timeout)
        if session.json:
            emit_json(answer)
        elif not answer.runs:
            emit(f"no checks have run on {args.name}")
        else:
            emit_table(checks_table(answer.runs, verbose=args.verbose))
    return 0


def checks_table(runs: Any, *, verbose: bool = False, now: float | None = None) -> str:
    """One line per run (then, verbose, one per check with its figures)."""
    rows: list[tuple[Any, ...]] = []
    for run in runs:
        rows.append(
            (
                fmt_when(run.started_at, now),
                run.level,
                run.trigger,
                "passed" if run.passed else "failed",
                f"{run.duration_s:.1f}s",
                run.suite_version,
                run.reason or "-",
            )
        )
        if verbose:
            for check in run.checks:
                figures = _short(check.figures_json)
                baseline = _short(check.baseline_json)
                words = check.reason or ("passed" if check.passed else "failed")
                rows.append(
                    (
                        "",
                        f"  {check.name}",
                        check.kind,
                        "passed" if check.passed else "failed",
                        f"{check.duration_s:.1f}s",
                        f"baseline {baseline}" if baseline != "{}" else "",
                        f"{words}; {figures}" if figures != "{}" else words,
                    )
                )
    headers = ("started", "level", "trigger", "result", "took", "suite", "reason")
    return render_table(headers, rows)


def _short(text: str, limit: int = 160) -> str:
    try:
        compact = json.dumps(json.loads(text or "{}"), separators=(",", ":"))
    except ValueError:
        compact = text
    return compact if len(compact) <= limit else compact[: limit - 1] + "…"
