"""``kiln racks list``, ``kiln racks bring-up`` and ``kiln topology export``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from controller.cli import power
from controller.cli.client import CliError, connect
from controller.cli.nodes import read_password
from controller.cli.output import emit, emit_json, emit_json_line, render_table, short_enum
from kiln.v1 import fleet_pb2, types_pb2

MEMBER_KINDS: dict[str, int] = {
    "compute": types_pb2.NODE_KIND_COMPUTE,
    "switch_tray": types_pb2.NODE_KIND_SWITCH_TRAY,
    "power_shelf": types_pb2.NODE_KIND_POWER_SHELF,
}
MEMBER_KEYS = frozenset(
    {
        "name",
        "kind",
        "bmc_url",
        "username",
        "password_env",
        "password_file",
        "leaf",
        "spine",
        "insecure",
        "ca_bundle",
    }
)

FORMATS: dict[str, int] = {
    "slurm": fleet_pb2.TOPOLOGY_FORMAT_SLURM,
    "k8s": fleet_pb2.TOPOLOGY_FORMAT_K8S_LABELS,
}


def register(subparsers: Any) -> None:
    """Add ``kiln racks …`` and ``kiln topology …`` to the top-level subparsers."""
    racks = subparsers.add_parser("racks", help="NVLink racks and their nodes")
    sub = racks.add_subparsers(dest="racks_command", metavar="COMMAND", required=True)
    p = sub.add_parser("list", help="list racks with node and GPU counts")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser(
        "bring-up",
        help="bring an NVL72 rack into service as one step (docs/bring-up.md)",
        description=(
            "Enrol or adopt the rack's members, power on its power shelves, then its "
            "switch trays, then its compute trays; provision (--image) or inspect the "
            "trays, hold them to one firmware baseline and one fabric clique, prepare "
            "and gate them, and print a report per member. The rack takes work, as a "
            "whole, only when every tray is ready. Exit status 1 when it is not."
        ),
    )
    p.add_argument("rack")
    p.add_argument(
        "--members",
        type=Path,
        metavar="FILE",
        help="YAML: the members to enrol or adopt (see docs/bring-up.md); "
        "without it, the rack's enrolled members",
    )
    p.add_argument("--image", default="", metavar="NAME", help="provision this catalogue image")
    p.add_argument("--profile", default="", help="the trays' baseline profile (its firmware pins)")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="give up on trays not ready after this long (default 3600)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        metavar="N",
        help="trays provisioned at once (default: all of the rack's)",
    )
    p.set_defaults(func=cmd_bring_up, parser=p)

    topology = subparsers.add_parser("topology", help="export the fleet's topology")
    sub = topology.add_subparsers(dest="topology_command", metavar="COMMAND", required=True)
    p = sub.add_parser("export", help="print topology for a scheduler")
    p.add_argument(
        "--format",
        choices=list(FORMATS),
        required=True,
        help="slurm: topology.conf (block plugin); k8s: node labels",
    )
    p.set_defaults(func=cmd_export)


def cmd_list(args: argparse.Namespace) -> int:
    with connect(args) as session:
        response = session.stub.ListRacks(fleet_pb2.ListRacksRequest(), timeout=session.timeout)
        if session.json:
            emit_json(response)
        else:
            emit(racks_table(response.racks))
    return 0


def racks_table(racks: Any) -> str:
    """The ``kiln racks list`` table."""
    headers = ("name", "domain", "gpu", "nodes", "gpus", "ready", "allocated", "leaf", "spine")
    rows = [
        (
            r.name,
            r.nvlink_domain,
            r.gpu_model,
            r.nodes,
            r.gpus,
            r.ready,
            r.allocated,
            r.leaf,
            r.spine,
        )
        for r in racks
    ]
    return render_table(headers, rows)


def cmd_export(args: argparse.Namespace) -> int:
    request = fleet_pb2.ExportTopologyRequest(format=FORMATS[args.format])
    with connect(args) as session:
        response = session.stub.ExportTopology(request, timeout=session.timeout)
        if session.json:
            emit_json(response)
        else:
            sys.stdout.write(
                response.text
                if response.text.endswith("\n") or not response.text
                else response.text + "\n"
            )
    return 0


def load_members(path: Path, rack: str) -> list[fleet_pb2.EnrollNodeRequest]:
    """The members file: ``defaults`` (any member key) and ``members``, a list
    of {name, kind, bmc_url, username, password_env | password_file, leaf,
    spine, insecure, ca_bundle}. Passwords come from the environment variable
    or the file named, never from this file. Raises ValueError naming what is
    wrong (never a password)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("members"), list):
        raise ValueError(f"{path}: expected a mapping with a 'members' list")
    unknown = sorted(set(doc) - {"rack", "defaults", "members"})
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}")
    if doc.get("rack", rack) != rack:
        raise ValueError(f"{path} describes rack {doc['rack']!r}, not {rack!r}")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError(f"{path}: 'defaults' must be a mapping")
    requests = []
    for i, entry in enumerate(doc["members"], start=1):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: member {i} is not a mapping")
        member = {**defaults, **entry}
        where = f"{path}: member {i} ({member.get('name', 'no name')})"
        bad = sorted(set(member) - MEMBER_KEYS)
        if bad:
            raise ValueError(f"{where}: unknown key(s) {', '.join(bad)}")
        for key in ("name", "bmc_url", "username"):
            if not member.get(key):
                raise ValueError(f"{where}: {key} is required")
        if bool(member.get("password_env")) == bool(member.get("password_file")):
            raise ValueError(f"{where}: give password_env or password_file (one of them)")
        kind = member.get("kind", "compute")
        if kind not in MEMBER_KINDS:
            raise ValueError(f"{where}: kind {kind!r} is not one of {', '.join(MEMBER_KINDS)}")
        if member.get("password_file"):
            try:
                password = read_password(str(member["password_file"]))
            except CliError as e:
                raise ValueError(f"{where}: {e}") from None
        else:
            password = os.environ.get(str(member["password_env"]), "")
            if not password:
                raise ValueError(
                    f"{where}: environment variable {member['password_env']} is not set"
                )
        requests.append(
            fleet_pb2.EnrollNodeRequest(
                name=str(member["name"]),
                bmc_url=str(member["bmc_url"]),
                username=str(member["username"]),
                password=password,
                rack=rack,
                leaf=str(member.get("leaf", "")),
                spine=str(member.get("spine", "")),
                insecure=bool(member.get("insecure", False)),
                ca_bundle=str(member.get("ca_bundle", "")),
                kind=MEMBER_KINDS[kind],
            )
        )
    return requests


def cmd_bring_up(args: argparse.Namespace) -> int:
    if args.wait < 0 or args.concurrency < 0:
        args.parser.error("--wait and --concurrency must be 0 or more")
    try:
        members = load_members(args.members, args.rack) if args.members else []
    except ValueError as e:
        args.parser.error(str(e))
    request = fleet_pb2.BringUpRackRequest(
        rack=args.rack,
        members=members,
        image=args.image,
        profile=args.profile,
        timeout_s=args.wait,
        concurrency=args.concurrency,
    )
    last: Any = None
    with connect(args) as session:
        # No deadline: a rack takes minutes; the controller bounds it (--wait).
        stream = session.stub.BringUpRack(request)
        progress = power.ProgressLine(sys.stderr, enabled=not session.json)
        try:
            for message in stream:
                if session.json:
                    emit_json_line(message)
                progress.update(bring_up_text(message), keep=not message.ok)
                last = message
        finally:
            progress.finish()
            stream.cancel()
    if last is None or not last.HasField("report"):
        sys.stderr.write(f"rack {args.rack}: the bring-up ended without a report\n")
        return 1
    if not session.json:
        emit(bring_up_summary(last.report))
    return 0 if last.report.rack_ready else 1


def bring_up_text(message: Any) -> str:
    """``[3/18] gb200-r01-t04 preparing (12.3 s)`` or ``… FAILED: <why>``."""
    head = f"[{message.ready}/{message.total}]" if message.total else f"[{message.rack}]"
    who = f" {message.node}" if message.node else ""
    if not message.ok:
        return f"{head}{who} FAILED: {message.message or 'no reason given'}"
    return f"{head}{who} {message.phase} ({message.elapsed_s:.1f} s)"


def bring_up_summary(report: Any) -> str:
    """The per-member table, then one line for the rack."""
    rows = [
        (
            t.node,
            short_enum(t, "kind"),
            short_enum(t, "state"),
            "ok" if t.ok else "FAILED",
            f"{t.ready_s:.1f}" if t.ready_s else "-",
            ",".join(f"{k}={v}" for k, v in sorted(t.firmware.items())) or "-",
            t.reason or "",
        )
        for t in report.trays
    ]
    headers = ("member", "kind", "state", "result", "ready_s", "firmware", "reason")
    table = render_table(headers, rows)
    if report.rack_ready:
        verdict = (
            f"rack {report.rack}: ready in {report.elapsed_s:.1f} s (slowest tray "
            f"{report.slowest_tray_s:.1f} s); it takes work as a whole"
        )
    else:
        verdict = f"rack {report.rack}: NOT ready: {report.reason}"
    return table + "\n" + verdict
