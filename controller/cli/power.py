"""``kiln nodes power``: one node through PowerNode, many through PowerNodes.

Many nodes (``--rack``, ``--all`` or several names) stream one progress
message per finished node. Progress goes to stderr: one line rewritten in
place when stderr is a terminal, one line per node otherwise. At the end,
stdout gets a summary of what failed and why, and the exit code is 1 if any
node failed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from controller.cli.client import connect
from controller.cli.output import (
    emit,
    emit_json,
    emit_json_line,
    render_table,
    short_enum,
    terminal_safe,
)
from kiln.v1 import fleet_pb2, types_pb2

ACTIONS: dict[str, int] = {
    "on": types_pb2.POWER_ACTION_ON,
    "off": types_pb2.POWER_ACTION_OFF,
    "force-off": types_pb2.POWER_ACTION_FORCE_OFF,
    "cycle": types_pb2.POWER_ACTION_CYCLE,
    "restart": types_pb2.POWER_ACTION_RESTART,
    "status": types_pb2.POWER_ACTION_STATUS,
}


def register(sub: Any) -> None:
    """Add ``power`` to the ``kiln nodes`` subparsers."""
    p = sub.add_parser(
        "power",
        help="power one node, a rack or the whole fleet",
        description="Power nodes through their BMCs. ACTION is one of: " + ", ".join(ACTIONS),
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="node names")
    p.add_argument("action", choices=list(ACTIONS), metavar="ACTION")
    p.add_argument("--rack", default="", help="every node in this rack")
    p.add_argument("--all", action="store_true", help="every node in the fleet")
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        metavar="N",
        help="BMCs at once (default: controller's)",
    )
    p.set_defaults(func=cmd_power, parser=p)


def cmd_power(args: argparse.Namespace) -> int:
    selectors = sum((bool(args.names), bool(args.rack), bool(args.all)))
    if selectors != 1:
        args.parser.error("give node NAMEs, --rack R or --all (exactly one of them)")
    if args.concurrency < 0:
        args.parser.error("--concurrency must be 0 or more")
    action = ACTIONS[args.action]
    if len(args.names) == 1:
        return _power_one(args, args.names[0], action)
    return _power_many(args, action)


def _power_one(args: argparse.Namespace, name: str, action: int) -> int:
    with connect(args) as session:
        request = fleet_pb2.PowerNodeRequest(name=name, action=action)
        response = session.stub.PowerNode(request, timeout=session.timeout)
        if session.json:
            emit_json(response)
        else:
            row = (response.name, short_enum(response, "power"), response.bmc_health)
            emit(render_table(("name", "power", "bmc"), [row]))
    return 0


@dataclass
class BulkResult:
    """What a PowerNodes stream reported, in arrival order."""

    ok: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    total: int = 0


def _power_many(args: argparse.Namespace, action: int) -> int:
    request = fleet_pb2.PowerNodesRequest(
        names=args.names,
        rack=args.rack,
        all=args.all,
        action=action,
        concurrency=args.concurrency,
    )
    result = BulkResult()
    with connect(args) as session:
        # No deadline: a bulk operation over thousands of BMCs outlives any
        # per-call timeout; the controller bounds each BMC itself, Ctrl-C stops us.
        stream = session.stub.PowerNodes(request)
        progress = ProgressLine(sys.stderr, enabled=not session.json)
        try:
            for message in stream:
                _record(result, message)
                if session.json:
                    emit_json_line(message)
                progress.update(progress_text(message), keep=not message.ok)
        finally:
            progress.finish()
            stream.cancel()
        if not session.json:
            emit(bulk_summary(args.action, result))
    return 1 if result.failed else 0


def _record(result: BulkResult, message: Any) -> None:
    result.total = max(result.total, int(message.total))
    if message.ok:
        result.ok.append(message.node)
    else:
        result.failed.append((message.node, message.error or "failed, no reason given"))


def progress_text(message: Any) -> str:
    """``[12/36] gb200-r01-t05 ok on`` or ``[13/36] gb200-r01-t06 FAILED: <why>``."""
    head = f"[{message.done}/{message.total}] {message.node}"
    if message.ok:
        return f"{head} ok {short_enum(message, 'power')}"
    return f"{head} FAILED: {message.error or 'no reason given'}"


def bulk_summary(action: str, result: BulkResult) -> str:
    """The final report: counts, then one row per failed node with the reason."""
    done = len(result.ok) + len(result.failed)
    total = max(result.total, done)
    line = f"power {action}: {total} nodes, {len(result.ok)} ok, {len(result.failed)} failed"
    if done < total:
        line += f", {total - done} without an answer"
    if not result.failed:
        return line
    rows = sorted(result.failed)
    return line + "\n" + render_table(("node", "error"), rows)


class ProgressLine:
    """A status line on ``stream``: rewritten in place on a TTY, appended otherwise."""

    def __init__(self, stream: TextIO, enabled: bool = True) -> None:
        self._stream = stream
        self._enabled = enabled
        self._tty = _isatty(stream)
        self._width = 0

    def update(self, text: str, keep: bool = False) -> None:
        """Show ``text``; with ``keep`` (a failure) it stays on screen after later updates."""
        if not self._enabled:
            return
        text = terminal_safe(text)
        if self._tty:
            if not keep:  # a wrapped line cannot be rewritten with \r: fit the terminal
                text = text[: max(20, shutil.get_terminal_size().columns - 1)]
            pad = " " * max(0, self._width - len(text))
            self._stream.write("\r" + text + pad)
            self._width = len(text)
            if keep:
                self._stream.write("\n")
                self._width = 0
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def finish(self) -> None:
        """End the in-place line so later output starts on a fresh one."""
        if self._enabled and self._tty and self._width:
            self._stream.write("\n")
            self._stream.flush()
            self._width = 0


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
