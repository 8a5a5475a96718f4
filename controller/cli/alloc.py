"""``kiln alloc``: create (optionally wait for), list, show and release
allocations, and read a released one's health report."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from controller.cli.client import CliError, Session, connect
from controller.cli.output import (
    MISSING,
    emit,
    emit_json,
    emit_table,
    fmt_duration,
    fmt_list,
    fmt_opt,
    fmt_time,
    fmt_when,
    render_fields,
    render_table,
    short_enum,
    use_colour,
)
from controller.cli.pages import every_page
from kiln.v1 import fleet_pb2

TOPOLOGIES: dict[str, int] = {
    "nvlink": fleet_pb2.TOPOLOGY_LEVEL_NVLINK,
    "leaf": fleet_pb2.TOPOLOGY_LEVEL_LEAF,
    "spine": fleet_pb2.TOPOLOGY_LEVEL_SPINE,
    "any": fleet_pb2.TOPOLOGY_LEVEL_ANY,
}

_FINAL = (fleet_pb2.ALLOCATION_STATE_READY, fleet_pb2.ALLOCATION_STATE_FAILED)
_POLL_START_S = 0.2
_POLL_MAX_S = 2.0


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def register(subparsers: Any) -> None:
    """Add ``kiln alloc …`` to the top-level subparsers."""
    alloc = subparsers.add_parser("alloc", help="allocate, inspect and release nodes")
    sub = alloc.add_subparsers(dest="alloc_command", metavar="COMMAND", required=True)

    p = sub.add_parser("create", help="ask for N nodes or K racks (all or nothing)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--nodes", type=_positive, metavar="N", help="N whole nodes")
    size.add_argument("--racks", type=_positive, metavar="K", help="K whole NVLink racks")
    p.add_argument("--gpu", default="", metavar="MODEL", help='GPU model, e.g. "H200"')
    p.add_argument("--topology", choices=list(TOPOLOGIES), default="any")
    p.add_argument("--preferred", action="store_true", help="topology is a preference only")
    p.add_argument(
        "--segment",
        type=_count,
        default=0,
        metavar="M",
        help="chunks of M nodes, each in one NVLink domain",
    )
    p.add_argument("--spares", type=_count, default=0, metavar="N", help="hot spares per domain")
    p.add_argument("--exclusive", action="store_true")
    p.add_argument("--queue", default="", metavar="Q")
    p.add_argument("--priority", type=int, default=0, metavar="P")
    p.add_argument("--profile", default="", metavar="NAME")
    p.add_argument(
        "--key", default="", help="idempotency key: the same key gives the same allocation"
    )
    p.add_argument("--wait", action="store_true", help="wait until ready or failed")
    p.add_argument(
        "--wait-timeout",
        type=_seconds,
        default=600.0,
        metavar="S",
        help="give up waiting after S seconds (default 600)",
    )
    p.set_defaults(func=cmd_create)

    p = sub.add_parser("list", help="list allocations")
    p.add_argument("--all", action="store_true", help="include released allocations")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="show an allocation, its state and why")
    p.add_argument("id")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("release", help="give an allocation's nodes back")
    p.add_argument("id")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser(
        "report", help="what a released allocation's GPUs went through while it held them"
    )
    p.add_argument("id")
    p.set_defaults(func=cmd_report)


def build_spec(args: argparse.Namespace) -> Any:
    """The AllocationSpec that ``alloc create``'s options describe."""
    return fleet_pb2.AllocationSpec(
        nodes=args.nodes or 0,
        racks=args.racks or 0,
        gpu_model=args.gpu,
        topology=TOPOLOGIES[args.topology],
        preferred=args.preferred,
        segment=args.segment,
        spares_per_domain=args.spares,
        exclusive=args.exclusive,
        queue=args.queue,
        priority=args.priority,
        profile=args.profile,
    )


def cmd_create(args: argparse.Namespace) -> int:
    request = fleet_pb2.CreateAllocationRequest(key=args.key, spec=build_spec(args))
    with connect(args) as session:
        existed = bool(args.key) and _exists(session, args.key)
        alloc = session.stub.CreateAllocation(request, timeout=session.timeout)
        if existed:  # the same key and request again: the controller returned the first
            note(f"key {args.key!r} was used before: this is its allocation {alloc.id}, not new")
        if args.wait:
            alloc = wait_for(session, alloc, args.wait_timeout)
        _emit_alloc(session, alloc)
        if alloc.state == fleet_pb2.ALLOCATION_STATE_FAILED:
            raise CliError(f"allocation {alloc.id} failed: {alloc.reason or 'no reason given'}")
    return 0


def wait_for(session: Session, alloc: Any, limit_s: float) -> Any:
    """Poll GetAllocation until ``alloc`` is READY or FAILED.

    :raises CliError: still not there after ``limit_s`` seconds; the message
        carries the last state and its reason.
    """
    deadline = time.monotonic() + limit_s
    delay = _POLL_START_S
    while alloc.state not in _FINAL:
        left = deadline - time.monotonic()
        if left <= 0:
            reason = f" ({alloc.reason})" if alloc.reason else ""
            raise CliError(
                f"allocation {alloc.id} not ready after {limit_s:g}s: "
                f"still {short_enum(alloc, 'state')}{reason}"
            )
        time.sleep(min(delay, left))
        delay = min(delay * 2, _POLL_MAX_S)
        request = fleet_pb2.GetAllocationRequest(id=alloc.id)
        alloc = session.stub.GetAllocation(request, timeout=session.timeout)
    return alloc


def cmd_list(args: argparse.Namespace) -> int:
    request = fleet_pb2.ListAllocationsRequest(include_released=args.all)
    with connect(args) as session:
        # Every page, as one response: the JSON is the shape it always was.
        allocs = every_page(
            session.stub.ListAllocations, request, "allocations", timeout=session.timeout
        )
        response = fleet_pb2.ListAllocationsResponse(allocations=allocs)
        if session.json:
            emit_json(response)
        else:
            emit_table(allocations_table(response.allocations))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with connect(args) as session:
        alloc = session.stub.GetAllocation(
            fleet_pb2.GetAllocationRequest(id=args.id), timeout=session.timeout
        )
        _emit_alloc(session, alloc)
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    with connect(args) as session:
        before = session.stub.GetAllocation(
            fleet_pb2.GetAllocationRequest(id=args.id), timeout=session.timeout
        )
        already = before.state == fleet_pb2.ALLOCATION_STATE_RELEASED
        alloc = session.stub.ReleaseAllocation(
            fleet_pb2.ReleaseAllocationRequest(id=args.id), timeout=session.timeout
        )
        if session.json:
            emit_json(alloc)
        elif already:
            emit(f"allocation {alloc.id}: already released (nothing to do)")
        else:
            emit(f"allocation {alloc.id}: {short_enum(alloc, 'state')}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    with connect(args) as session:
        report = session.stub.GetAllocationReport(
            fleet_pb2.GetAllocationReportRequest(id=args.id), timeout=session.timeout
        )
        if session.json:
            emit_json(report)
        else:
            emit(report_text(report))
    return 0


def _exists(session: Session, key: str) -> bool:
    """Whether an allocation already has idempotency key ``key``."""
    import grpc  # with the connection (see controller.cli.client)

    try:
        session.stub.GetAllocation(fleet_pb2.GetAllocationRequest(id=key), timeout=session.timeout)
    except grpc.RpcError as e:
        if e.code() is grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


def note(text: str) -> None:
    """A remark for the person at the terminal (stderr: never in the output a pipe reads)."""
    sys.stderr.write(f"kiln: {text}\n")


def _emit_alloc(session: Session, alloc: Any) -> None:
    if session.json:
        emit_json(alloc)
    else:
        emit(allocation_detail(alloc))


def spec_summary(spec: Any) -> str:
    """``4 nodes H200 nvlink`` / ``2 racks any (preferred)``."""
    size = f"{spec.racks} racks" if spec.racks else f"{spec.nodes} nodes"
    parts = [size]
    if spec.gpu_model:
        parts.append(spec.gpu_model)
    topology = short_enum(spec, "topology")
    parts.append("any" if topology == MISSING else topology)
    if spec.preferred:
        parts.append("(preferred)")
    return " ".join(parts)


def allocations_table(allocs: Any) -> str:
    """The ``kiln alloc list`` table."""
    headers = ("id", "state", "request", "queue", "prio", "nodes", "created", "reason")
    rows = [
        (
            a.id,
            short_enum(a, "state"),
            spec_summary(a.spec),
            a.spec.queue,
            a.spec.priority,
            len(a.nodes) or MISSING,
            fmt_time(a.created_at),
            a.reason,
        )
        for a in allocs
    ]
    return render_table(headers, rows, state_column="state", colour=use_colour())


def allocation_detail(alloc: Any) -> str:
    """The ``kiln alloc show`` text: state and reason first, then the request."""
    spec = alloc.spec
    fields: list[tuple[str, Any]] = [
        ("id", alloc.id),
        ("state", short_enum(alloc, "state")),
        ("reason", alloc.reason),
        ("key", alloc.key),
        ("request", spec_summary(spec)),
        ("segment", spec.segment or MISSING),
        ("spares/domain", spec.spares_per_domain or MISSING),
        ("exclusive", spec.exclusive),
        ("queue", spec.queue),
        ("priority", spec.priority),
        ("profile", spec.profile),
        ("nodes", fmt_list(alloc.nodes, sep=" ")),
        ("spares", fmt_list(alloc.spares, sep=" ")),
        ("domains", fmt_list(alloc.domains, sep=" ")),
        ("created", fmt_when(alloc.created_at)),
        ("updated", fmt_when(alloc.updated_at)),
    ]
    return render_fields(fields)


# Throttle reasons in the order a report lists them (the API's map keys).
THROTTLE_ORDER = (
    "hw_thermal",
    "hw_slowdown",
    "sw_thermal",
    "hw_power_brake",
    "sw_power_cap",
    "sync_boost",
)
_KWH_J = 3.6e6


def fmt_energy(joules: float) -> str:
    """``950 J``, ``12.3 kJ``, ``4.56 kWh``: kJ under a kilowatt-hour."""
    if joules <= 0:
        return MISSING
    if joules < 1000:
        return f"{joules:.0f} J"
    if joules < _KWH_J:
        return f"{joules / 1000:.1f} kJ"
    return f"{joules / _KWH_J:.2f} kWh"


def fmt_seconds(seconds: float) -> str:
    """``7.5s`` under ten seconds, else ``fmt_duration``'s ``42s``, ``3m``, ``5h12m``."""
    return f"{seconds:.1f}s" if seconds < 10 else fmt_duration(seconds)


def fmt_throttled(throttled: Any) -> str:
    """``hw_thermal 7.5s, sw_power_cap 3m``: the reasons a GPU ran throttled for,
    in THROTTLE_ORDER (hardware first), then any other a newer controller
    sends; ``-`` when never."""
    known = [r for r in THROTTLE_ORDER if throttled.get(r, 0) > 0]
    other = sorted(r for r in throttled if r not in THROTTLE_ORDER and throttled[r] > 0)
    return ", ".join(f"{r} {fmt_seconds(throttled[r])}" for r in known + other) or MISSING


def report_text(report: Any) -> str:
    """The ``kiln alloc report`` text: the span and its sources, a table per GPU,
    then the nodes replaced while it ran."""
    held = MISSING
    if report.started_at and report.ended_at:
        span = fmt_duration(report.ended_at - report.started_at)
        held = f"{fmt_time(report.started_at)} for {span}"
    fields: list[tuple[str, Any]] = [
        ("allocation", report.allocation),
        ("held", held),
        ("released", fmt_when(report.ended_at)),
        ("reports", report.reports),
        ("GPUs", len(report.gpus)),
    ]
    if report.partial:
        fields.append(("partial", "yes: held across a controller restart; counts from its start"))
    parts = [render_fields(fields)]
    if report.gpus:
        parts.append(gpus_table(report.gpus))
    else:
        parts.append("no health reports came from its nodes while it held them")
    if report.replacements:
        parts.append(replacements_table(report.replacements))
    return "\n\n".join(parts)


def gpus_table(gpus: Any) -> str:
    headers = (
        "node",
        "gpu",
        "max temp",
        "throttled",
        "energy",
        "ecc sbe/dbe",
        "xids",
        "remaps",
        "nvlink errs",
    )
    rows = [
        (
            g.node,
            g.index,
            fmt_opt(g, "max_temp_c", "C"),
            fmt_throttled(g.throttled_s),
            fmt_energy(g.energy_j),
            f"{g.ecc_sbe}/{g.ecc_dbe}",
            fmt_list(g.xids),
            g.rows_remapped,
            g.nvlink_errors,
        )
        for g in gpus
    ]
    return render_table(headers, rows)


def replacements_table(replacements: Any) -> str:
    headers = ("replaced", "by", "at", "reason")
    rows = [
        (r.failed, r.replacement or "none free", fmt_time(r.at), r.reason) for r in replacements
    ]
    return render_table(headers, rows)
