"""``kiln events watch``: stream the controller's events.

Table output is one line per event (``seq time kind node/alloc reason``);
JSON output is one compact object per line. Ctrl-C ends the watch quietly
with exit code 0.
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
    p = sub.add_parser("watch", help="print events as they happen")
    p.add_argument("--after", type=_seq, default=0, metavar="SEQ", help="only events after SEQ")
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


def event_line(event: Any) -> str:
    """``seq time kind subject reason`` for one event, on one line."""
    subject = event.node or MISSING
    if event.allocation:
        subject = f"{event.node}/{event.allocation}" if event.node else event.allocation
    reason = event.reason
    if event.rule:
        reason = f"[{event.rule}] {reason}" if reason else f"[{event.rule}]"
    return " ".join((str(event.seq), fmt_time(event.at), cell(event.kind), subject, cell(reason)))


def cmd_watch(args: argparse.Namespace) -> int:
    import grpc  # with the connection, not at start-up (see controller.cli.client)

    request = fleet_pb2.WatchEventsRequest(
        after_seq=args.after, follow=args.follow, node=args.node, allocation=args.alloc
    )
    with connect(args) as session:
        # A followed stream runs until Ctrl-C; only a one-shot read gets a deadline.
        timeout = None if args.follow else session.timeout
        stream = session.stub.WatchEvents(request, timeout=timeout)
        try:
            for event in stream:
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
