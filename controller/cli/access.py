"""``kiln tokens``, ``kiln whoami`` and ``kiln audit``: who may do what, and who did.

``kiln tokens create`` prints the new token's secret once, alone on stdout
(so ``> file`` captures just it), with a note on stderr; ``--out FILE``
writes it to FILE (mode 0600) instead. No other command, and no table or
JSON, ever shows a secret: the controller keeps only a salted hash.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.cli.client import CliError, connect
from controller.cli.output import MISSING, emit, emit_json, fmt_time, render_table
from kiln.v1 import fleet_pb2

ROLES = ("viewer", "operator", "provisioner", "admin")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")


def duration(text: str) -> float:
    """``90s``, ``15m``, ``12h``, ``30d``, ``2w`` or plain seconds, as seconds."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30d, 12h or 90m")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if value <= 0:
        raise argparse.ArgumentTypeError("a duration must be more than 0")
    return value


def moment(text: str) -> float:
    """``--since``: a duration ago (``1h``) or a date and time (ISO 8601, UTC
    unless it says otherwise), as unix seconds."""
    try:
        return time.time() - duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (1h, 7d) nor a time (2026-12-01T08:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def register(subparsers: Any) -> None:
    """Add ``kiln tokens …``, ``kiln whoami`` and ``kiln audit …``."""
    tokens = subparsers.add_parser("tokens", help="create, list and revoke bearer tokens (admin)")
    sub = tokens.add_subparsers(dest="tokens_command", metavar="COMMAND", required=True)

    p = sub.add_parser("create", help="make a token; its secret is printed this once")
    p.add_argument("name")
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument(
        "--ttl", type=duration, default=0.0, metavar="DURATION", help="expire after, e.g. 30d"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the secret to FILE (mode 0600) instead of printing it",
    )
    p.set_defaults(func=cmd_create)

    p = sub.add_parser("list", help="list tokens (never their secrets)")
    p.add_argument("--all", action="store_true", help="revoked tokens too")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("revoke", help="revoke a token at once")
    p.add_argument("name")
    p.set_defaults(func=cmd_revoke)

    p = subparsers.add_parser("whoami", help="who the controller takes you for, and your role")
    p.set_defaults(func=cmd_whoami)

    audit = subparsers.add_parser("audit", help="the audit log of calls (admin)")
    sub = audit.add_subparsers(dest="audit_command", metavar="COMMAND", required=True)
    p = sub.add_parser("list", help="mutating calls and refusals, oldest first")
    p.add_argument(
        "--since", type=moment, default=0.0, metavar="WHEN", help="e.g. 1h, 7d, 2026-12-01T08:00Z"
    )
    p.add_argument("--who", default="", metavar="NAME", help="only calls by NAME")
    p.add_argument("--method", default="", metavar="RPC", help="only calls of RPC, e.g. PowerNode")
    p.add_argument(
        "--limit", type=int, default=0, metavar="N", help="the newest N entries (default 500)"
    )
    p.set_defaults(func=cmd_audit)


def tokens_table(tokens: Any) -> str:
    now = time.time()
    rows = [
        (
            t.name,
            t.role,
            _state(t, now),
            fmt_time(t.created_at),
            fmt_time(t.expires_at) if t.expires_at else "never",
            fmt_time(t.last_used_at),
            t.created_by,
        )
        for t in tokens
    ]
    headers = ("name", "role", "state", "created", "expires", "last used", "created by")
    return render_table(headers, rows)


def _state(token: Any, now: float) -> str:
    if token.revoked:
        return "revoked"
    if token.expires_at and token.expires_at <= now:
        return "expired"
    return "active"


def audit_table(entries: Any) -> str:
    rows = [
        (
            e.seq,
            fmt_time(e.at),
            e.who,
            e.role,
            e.method,
            e.code,
            _short(e.arguments_json),
            e.detail,
        )
        for e in entries
    ]
    headers = ("seq", "time", "who", "role", "method", "code", "arguments", "detail")
    return render_table(headers, rows)


def _short(arguments_json: str, width: int = 60) -> str:
    try:
        text = json.dumps(json.loads(arguments_json or "{}"), separators=(",", ":"))
    except ValueError:
        text = arguments_json
    if text == "{}":
        return MISSING
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_create(args: argparse.Namespace) -> int:
    request = fleet_pb2.CreateTokenRequest(name=args.name, role=args.role, ttl_s=args.ttl)
    with connect(args) as session:
        response = session.stub.CreateToken(request, timeout=session.timeout)
    token = response.token
    expiry = f"expires {fmt_time(token.expires_at)}" if token.expires_at else "never expires"
    if args.out is not None:
        from kiln_common.tokens import write_private

        try:
            write_private(args.out, response.secret)
        except OSError as e:
            raise CliError(
                f"token {token.name} was made, but {args.out} cannot be written: "
                f"{e.strerror or e}; revoke it (kiln tokens revoke {token.name})"
            ) from None
        emit(f"token {token.name} ({token.role}, {expiry}) written to {args.out}")
        return 0
    if session.json:
        emit_json(response)
        return 0
    sys.stderr.write(f"token {token.name} ({token.role}, {expiry}); shown this once:\n")
    sys.stdout.write(response.secret + "\n")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with connect(args) as session:
        response = session.stub.ListTokens(
            fleet_pb2.ListTokensRequest(include_revoked=args.all), timeout=session.timeout
        )
        if session.json:
            emit_json(response)
        else:
            emit(tokens_table(response.tokens))
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    with connect(args) as session:
        token = session.stub.RevokeToken(
            fleet_pb2.RevokeTokenRequest(name=args.name), timeout=session.timeout
        )
        if session.json:
            emit_json(token)
        else:
            emit(f"token {token.name} revoked")
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    with connect(args) as session:
        me = session.stub.WhoAmI(fleet_pb2.WhoAmIRequest(), timeout=session.timeout)
        if session.json:
            emit_json(me)
        elif me.method == "none":
            emit(f"{me.identity} ({me.role}): this controller does not authenticate callers")
        else:
            emit(f"{me.identity} ({me.role}, by {me.method})")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise CliError("--limit must be 0 or more", exit_code=2)
    request = fleet_pb2.ListAuditRequest(
        since=args.since, who=args.who, method=args.method, limit=args.limit
    )
    with connect(args) as session:
        response = session.stub.ListAudit(request, timeout=session.timeout)
        if session.json:
            emit_json(response)
        else:
            emit(audit_table(response.entries))
    return 0
