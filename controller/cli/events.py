"""``kiln events watch``: stream the controller's events.

It starts from now (``--after SEQ`` or ``--from-start`` replay what is
kept; ``--no-follow`` prints the events kept so far and exits, so it starts
from the first). Table output is one line per event in aligned columns
(``seq time kind node/alloc reason``); JSON output is one compact object per
line. ``--kind`` and ``--node`` filter. Ctrl-C ends the watch quietly with
exit code 0.
"""

from __future__ import annotations

import argparse
from typing import Any

from controller.cli.client import connect
from controller.cli.output import MISSING, cell, emit, emit_json_line, fmt_time
from kiln.v1 import fleet_pb2


def register(subparsers: Any) -> None:
    """Add ``kiln events …`` to the top-level subparsers."""
    events = subparsers.add_parser("events", help="watch the event stream")
    sub = events.add_subparsers(dest="events_command", metavar="COMMAND", required=True)
    p = sub.add_parser("watch", help="print events as they happen (from now, by default)")
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--after", type=_seq, default=None, metavar="SEQ", help="replay the events after SEQ"
    )
    start.add_argument(
        "--from-start", action="store_true", help="replay every event kept, then follow"
    )
    p.add_argument(
        "--kind",
        action="append",
        default=[],
        metavar="KIND",
        help="only events of KIND (e.g. node.transition), or of a family (node., allocation.); "
        "may be repeated",
    )
    p.add_argument("--node", default="", metavar="N", help="only events about node N")
    p.add_argument("--alloc", default="", metavar="ID", help="only events about allocation ID")
    p.add_argument(
        "--no-follow",
        dest="follow",
        action="store_false",
        help="print the events so far and exit",
    )
    p.set_defaults(func=cmd_watch)


def _seq(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


# Column widths, so that a stream lines up without knowing what comes next:
# the widest kind (allocation.node_replaced) and a node/allocation subject.
SEQ_WIDTH, KIND_WIDTH, SUBJECT_WIDTH = 6, 24, 28


def event_line(event: Any) -> str:
    """``seq time kind subject reason`` for one event, in aligned columns."""
    subject = event.node or MISSING
    if event.allocation:
        subject = f"{event.node}/{event.allocation}" if event.node else event.allocation
    reason = event.reason
    if event.rule:
        reason = f"[{event.rule}] {reason}" if reason else f"[{event.rule}]"
    return "  ".join(
        (
            str(event.seq).rjust(SEQ_WIDTH),
            fmt_time(event.at),
            cell(event.kind).ljust(KIND_WIDTH),
            cell(subject).ljust(SUBJECT_WIDTH),
            cell(reason),
        )
    )


def wanted(kinds: list[str], kind: str) -> bool:
    """Whether ``kind`` is one of ``kinds`` (a name ending in "." is a family)."""
    return not kinds or any(kind == k or (k.endswith(".") and kind.startswith(k)) for k in kinds)


def cmd_watch(args: argparse.Namespace) -> int:
    import grpc  # with the connection, not at start-up (see controller.cli.client)

    from_now = args.after is None and not args.from_start and args.follow
    request = fleet_pb2.WatchEventsRequest(
        after_seq=args.after or 0,
        follow=args.follow,
        node=args.node,
        allocation=args.alloc,
        from_now=from_now,
    )
    with connect(args) as session:
        # A followed stream runs until Ctrl-C; only a one-shot read gets a deadline.
        timeout = None if args.follow else session.timeout
        stream = session.stub.WatchEvents(request, timeout=timeout)
        try:
            for event in stream:
                if not wanted(args.kind, event.kind):
                    continue
                if session.json:
                    emit_json_line(event)
                else:
                    emit(event_line(event))
        except KeyboardInterrupt:
            stream.cancel()
            return 0
        except grpc.RpcError as e:
            if e.code() is grpc.StatusCode.CANCELLED and not args.follow:
                return 0
            raise
    return 0
