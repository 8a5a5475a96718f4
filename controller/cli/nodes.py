"""``kiln nodes``: list, show, enroll, drain, undrain, provision, clear a node's leak.

Power lives in ``controller.cli.power``; ``register`` wires both under
``kiln nodes``. Each handler takes the parsed arguments and returns an exit
code; gRPC errors propagate to ``main``, which prints them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from controller.cli import node_checks, power
from controller.cli.client import CliError, connect
from controller.cli.output import (
    MISSING,
    emit,
    emit_json,
    emit_json_line,
    emit_table,
    fmt_list,
    fmt_mib,
    fmt_opt,
    fmt_time,
    fmt_when,
    render_fields,
    render_table,
    short_enum,
    short_enum_name,
    use_colour,
)
from controller.cli.pages import every_page
from kiln.v1 import fleet_pb2, types_pb2

NODE_STATES: dict[str, int] = {
    short_enum_name(value.name, "NodeState"): value.number
    for value in types_pb2.NodeState.DESCRIPTOR.values
    if value.number != 0
}
"""``--state`` choices: ``ready`` → ``NODE_STATE_READY`` and so on."""


def register(subparsers: Any) -> None:
    """Add ``kiln nodes …`` to the top-level subparsers."""
    nodes = subparsers.add_parser("nodes", help="list, inspect, enroll and power nodes")
    sub = nodes.add_subparsers(dest="nodes_command", metavar="COMMAND", required=True)

    p = sub.add_parser("list", help="list nodes")
    p.add_argument("--rack", default="", help="only nodes in this rack")
    p.add_argument("--state", type=_node_state, help="only nodes in this state, e.g. ready")
    p.add_argument(
        "--gpu-model", default="", metavar="MODEL", help='only nodes with this GPU, e.g. "H200"'
    )
    p.add_argument(
        "--allocation", default="", metavar="ID", help="only the nodes this allocation holds"
    )
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="show one node, its GPUs and their latest health")
    p.add_argument("name")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("enroll", help="enroll a node by its BMC")
    p.add_argument("name")
    p.add_argument(
        "--bmc", required=True, metavar="URL", help="redfish://, redfish+http://, ipmi://"
    )
    p.add_argument("--username", required=True)
    p.add_argument(
        "--password-file",
        required=True,
        metavar="FILE",
        help="file holding the BMC password ('-': standard input); never printed",
    )
    p.add_argument("--rack", default="")
    p.add_argument("--leaf", default="")
    p.add_argument("--spine", default="")
    p.add_argument("--insecure", action="store_true", help="skip TLS verification of the BMC")
    p.add_argument("--ca-bundle", default="", metavar="FILE", help="CA bundle for the BMC's TLS")
    p.add_argument("--profile", default="", help="node profile to prepare to")
    p.add_argument(
        "--kind",
        choices=("compute", "switch_tray", "power_shelf"),
        default="compute",
        help="a rack member Kiln powers but never allocates, or a compute node (default)",
    )
    p.add_argument(
        "--agent-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="then issue the node's agent token and write it to FILE (mode 0600), "
        "for kiln-agent --token-file; never printed",
    )
    p.set_defaults(func=cmd_enroll)

    p = sub.add_parser(
        "set-credentials",
        help="replace a node's BMC username and password (admin)",
        description="Replace the BMC credentials Kiln uses for a node (after they were "
        "rotated on the BMC). The password is read from a file, never the command line, "
        "and stored sealed; the next BMC call uses it.",
    )
    p.add_argument("name")
    p.add_argument("--username", required=True)
    p.add_argument(
        "--password-file",
        required=True,
        metavar="FILE",
        help="file holding the new BMC password ('-': standard input); never printed",
    )
    p.set_defaults(func=cmd_set_credentials)

    p = sub.add_parser(
        "agent-token", help="issue a node's agent token (replacing its last) into a file"
    )
    p.add_argument("name")
    p.add_argument("--out", type=Path, required=True, metavar="FILE", help="written mode 0600")
    p.set_defaults(func=cmd_agent_token)

    p = sub.add_parser("drain", help="stop placing work on a node")
    p.add_argument("name")
    p.add_argument("--reason", default="", metavar="TEXT")
    p.set_defaults(func=cmd_drain)

    p = sub.add_parser("undrain", help="let a drained node take work again")
    p.add_argument("name")
    p.set_defaults(func=cmd_undrain)

    p = sub.add_parser(
        "remove",
        help="retire a node that is not allocated (its events stay)",
        description="Forget a node: its record, GPUs and agent tokens. Refused while the node "
        "is allocated (the allocation is named) unless --force, which takes it out of its "
        "allocation as a failed node (a replacement if one is free). Its events stay.",
    )
    p.add_argument("name")
    p.add_argument(
        "--force", action="store_true", help="also when allocated, or when its BMC is gone"
    )
    p.add_argument("--reason", default="", metavar="TEXT")
    p.set_defaults(func=cmd_remove)

    node_checks.register(sub)
    p = sub.add_parser(
        "clear-leak",
        help="lift the power block a coolant leak put on a node (operator)",
        description="After a tray's coolant leak was repaired, lift the block that keeps "
        "the node from being powered on. Refused while a leak detector of the node still "
        "reports Critical. The node stays powered off and out of service: undrain it to "
        "bring it back. See docs/leaks.md.",
    )
    p.add_argument("name")
    p.add_argument(
        "--reason", default="", metavar="TEXT", help="e.g. the repair ticket (kept in the event)"
    )
    p.set_defaults(func=cmd_clear_leak)

    power.register(sub)
    p = sub.add_parser(
        "provision",
        help="install an OS image from the controller's catalogue on nodes",
        description="Insert a catalogue image through each node's BMC (Redfish virtual "
        "media), boot it once from it, power-cycle, and wait for the node's agent to "
        "register again; then the node is inspected as usual. Progress goes to stderr, "
        "a summary to stdout; exit 1 if any node failed. See docs/provisioning.md.",
    )
    p.add_argument("names", nargs="*", metavar="NODE", help="node names")
    p.add_argument("--rack", default="", help="every node in this rack")
    p.add_argument("--image", required=True, metavar="NAME", help="a catalogue image name")
    p.add_argument(
        "--image-server",
        default="",
        metavar="URL",
        help="base URL the BMCs fetch the image from (default: the controller's)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        metavar="N",
        help="nodes of this request provisioning at once (default: controller's)",
    )
    p.set_defaults(func=cmd_provision, parser=p)


def _node_state(text: str) -> int:
    key = text.strip().lower().replace("-", "_")
    if key not in NODE_STATES:
        choices = ", ".join(NODE_STATES)
        raise argparse.ArgumentTypeError(f"unknown state {text!r} (choose from {choices})")
    return NODE_STATES[key]


def read_password(path: str) -> str:
    """The password in ``path`` (``-``: stdin) with trailing newlines stripped.

    :raises CliError: the file cannot be read or holds no password. The
        message names the file, never its content.
    """
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except FileNotFoundError:
        raise CliError(f"password file {path!r} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise CliError(f"cannot read password file {path!r}: {reason}") from None
    password = text.rstrip("\r\n")
    if not password:
        source = "standard input" if path == "-" else f"password file {path!r}"
        raise CliError(f"{source} holds no password")
    return password


def cmd_list(args: argparse.Namespace) -> int:
    request = fleet_pb2.ListNodesRequest(
        rack=args.rack,
        state=args.state or 0,
        gpu_model=args.gpu_model,
        allocation=args.allocation,
    )
    with connect(args) as session:
        # Every page, as one response: the JSON is the shape it always was.
        nodes = every_page(session.stub.ListNodes, request, "nodes", timeout=session.timeout)
        response = fleet_pb2.ListNodesResponse(nodes=nodes)
        if session.json:
            emit_json(response)
        else:
            emit_table(nodes_table(response.nodes))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with connect(args) as session:
        node = session.stub.GetNode(
            fleet_pb2.GetNodeRequest(name=args.name), timeout=session.timeout
        )
        if session.json:
            emit_json(node)
        else:
            emit(node_detail(node))
    return 0


def cmd_enroll(args: argparse.Namespace) -> int:
    request = fleet_pb2.EnrollNodeRequest(
        name=args.name,
        bmc_url=args.bmc,
        username=args.username,
        password=read_password(args.password_file),
        rack=args.rack,
        leaf=args.leaf,
        spine=args.spine,
        insecure=args.insecure,
        ca_bundle=args.ca_bundle,
        profile=args.profile,
        kind=types_pb2.NodeKind.Value(f"NODE_KIND_{args.kind.upper()}"),
    )
    with connect(args) as session:
        node = session.stub.EnrollNode(request, timeout=session.timeout)
        if args.agent_token_file is not None:
            _write_agent_token(session, node.name, args.agent_token_file)
        _emit_node_line(session.json, node, "enrolled")
    return 0


def cmd_set_credentials(args: argparse.Namespace) -> int:
    request = fleet_pb2.SetNodeCredentialsRequest(
        name=args.name, username=args.username, password=read_password(args.password_file)
    )
    with connect(args) as session:
        node = session.stub.SetNodeCredentials(request, timeout=session.timeout)
        _emit_node_line(session.json, node, f"BMC credentials replaced (user {node.bmc_username})")
    return 0


def _write_agent_token(session: Any, node: str, path: Path) -> None:
    """Issue ``node``'s agent token and write it to ``path`` (0600)."""
    from kiln_common.tokens import write_private

    issued = session.stub.IssueAgentToken(
        fleet_pb2.IssueAgentTokenRequest(node=node), timeout=session.timeout
    )
    try:
        write_private(path, issued.token)
    except OSError as e:
        raise CliError(
            f"node {node}'s agent token was issued but cannot be written to {path}: "
            f"{e.strerror or e}; issue another: kiln nodes agent-token {node} --out FILE"
        ) from None


def cmd_agent_token(args: argparse.Namespace) -> int:
    with connect(args) as session:
        _write_agent_token(session, args.name, args.out)
    emit(f"node {args.name}: agent token written to {args.out}")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    request = fleet_pb2.DrainNodeRequest(name=args.name, reason=args.reason)
    with connect(args) as session:
        node = session.stub.DrainNode(request, timeout=session.timeout)
        _emit_node_line(session.json, node, "drained")
    return 0


def cmd_undrain(args: argparse.Namespace) -> int:
    with connect(args) as session:
        node = session.stub.UndrainNode(
            fleet_pb2.UndrainNodeRequest(name=args.name), timeout=session.timeout
        )
        _emit_node_line(session.json, node, "undrained")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    request = fleet_pb2.RemoveNodeRequest(name=args.name, force=args.force, reason=args.reason)
    with connect(args) as session:
        removed = session.stub.RemoveNode(request, timeout=session.timeout)
        if session.json:
            emit_json(removed)
        elif removed.allocation:
            emit(f"node {removed.name} removed (taken out of allocation {removed.allocation})")
        else:
            emit(f"node {removed.name} removed")
    return 0


def cmd_clear_leak(args: argparse.Namespace) -> int:
    request = fleet_pb2.ClearLeakRequest(name=args.name, reason=args.reason)
    with connect(args) as session:
        node = session.stub.ClearLeak(request, timeout=session.timeout)
        _emit_node_line(session.json, node, "leak cleared (power-on no longer blocked)")
    return 0


def _emit_node_line(as_json: bool, node: Any, verb: str) -> None:
    if as_json:
        emit_json(node)
        return
    reason = f" ({node.state_reason})" if node.state_reason else ""
    emit(f"node {node.name} {verb}: state {short_enum(node, 'state')}{reason}")


def gpu_summary(node: Any) -> str:
    """``4x GB200`` style, or ``-`` when the node has not reported GPUs."""
    if not node.gpu_count:
        return MISSING
    return f"{node.gpu_count}x {node.gpu_model}" if node.gpu_model else str(node.gpu_count)


def nodes_table(nodes: Any) -> str:
    """The ``kiln nodes list`` table."""
    rows = [
        (
            n.name,
            n.rack,
            short_enum(n, "state"),
            short_enum(n, "power"),
            n.bmc_health,
            "up" if n.agent_connected else "down",
            gpu_summary(n),
            n.allocation,
            _reason(n),
        )
        for n in nodes
    ]
    headers = ("name", "rack", "state", "power", "bmc", "agent", "gpus", "alloc", "reason")
    return render_table(headers, rows, state_column="state", colour=use_colour())


def _reason(node: Any) -> str:
    """The table's reason column: the state's reason, and a power block first."""
    block = node.power_block
    if not block:
        return str(node.state_reason)
    return f"POWER BLOCKED: {block}" + (f"; {node.state_reason}" if node.state_reason else "")


def power_block_text(node: Any) -> str:
    """``nodes show``'s power block line: why, and how to lift it (``-``: none)."""
    block = node.power_block
    if not block:
        return MISSING
    return f"{block} (after the repair: kiln nodes clear-leak {node.name})"


def node_detail(node: Any) -> str:
    """The ``kiln nodes show`` text: fields, the GPU table and the health table."""
    fields: list[tuple[str, Any]] = [
        ("name", node.name),
        ("state", short_enum(node, "state")),
        ("reason", node.state_reason),
        ("schedulable", node.schedulable),
        ("power", short_enum(node, "power")),
        ("power block", power_block_text(node)),
        ("rack", node.rack),
        ("leaf", node.leaf),
        ("spine", node.spine),
        ("nvlink domain", node.nvlink_domain),
        ("bmc", node.bmc_url),
        ("bmc user", node.bmc_username),
        ("bmc health", node.bmc_health),
        ("agent", "connected" if node.agent_connected else "disconnected"),
        ("agent last seen", fmt_when(node.agent_last_seen)),
        ("agent cert", cert_expiry(node.agent_cert_expires_at)),
        ("gpus", gpu_summary(node)),
        ("profile", node.profile),
        ("allocation", node.allocation),
        ("updated", fmt_when(node.updated_at)),
    ]
    parts = [render_fields(fields)]
    if node.gpus:
        parts.append("GPUs:\n" + gpus_table(node.gpus))
    if node.HasField("health") and node.health.gpus:
        health = node.health
        title = f"Health ({health.source or 'unknown source'}, {fmt_time(health.sampled_at)}):"
        parts.append(title + "\n" + health_table(health.gpus))
        errors = [f"  gpu {g.index}: {e}" for g in health.gpus for e in g.errors]
        if errors:
            parts.append("Readings that failed:\n" + "\n".join(errors))
    if node.HasField("health") and node.health.bmc_temps_c:
        temps = fmt_list((f"{t:.0f}C" for t in node.health.bmc_temps_c), sep=" ")
        parts.append(f"BMC temperatures: {temps}")
    return "\n\n".join(parts)


def cert_expiry(expires_at: float, now: float | None = None) -> str:
    """``expires 2027-12-01 13:00 UTC (in 364 days)``, ``EXPIRED …``, or ``-``
    (no certificate: plaintext, a token, or no agent connected)."""
    if not expires_at:
        return MISSING
    left = expires_at - (time.time() if now is None else now)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expires_at))
    if left <= 0:
        return f"EXPIRED {when}"
    days = left / 86400
    soon = f"in {days:.0f} days" if days >= 2 else f"in {left / 3600:.0f} hours"
    return f"expires {when} ({soon})"


def gpus_table(gpus: Any) -> str:
    rows = [
        (
            g.index,
            g.model,
            g.uuid,
            g.serial,
            g.pci_bus_id,
            fmt_mib(g.memory_mib),
            g.clique,
        )
        for g in gpus
    ]
    return render_table(("gpu", "model", "uuid", "serial", "pci", "memory", "clique"), rows)


def health_table(gpus: Any) -> str:
    """One row per GPU health sample; absent readings show as ``-``."""
    headers = (
        "gpu",
        "temp",
        "slowdown",
        "shutdown",
        "power",
        "limit",
        "sm",
        "mem",
        "ecc sbe/dbe vol",
        "ecc sbe/dbe agg",
        "remap c/u",
        "remap pend/fail",
        "xids",
        "nvlink down",
        "fabric",
    )
    return render_table(headers, [_health_row(g) for g in gpus])


def _health_row(g: Any) -> tuple[Any, ...]:
    remap = f"{fmt_opt(g, 'remap_correctable')}/{fmt_opt(g, 'remap_uncorrectable')}"
    remap_flags = f"{fmt_opt(g, 'remap_pending')}/{fmt_opt(g, 'remap_failure')}"
    fabric = "healthy" if g.fabric_healthy else f"state {g.fabric_state}"
    return (
        f"{g.index} (lost)" if g.lost else g.index,
        fmt_opt(g, "temp_c", "C"),
        fmt_opt(g, "slowdown_c", "C"),
        fmt_opt(g, "shutdown_c", "C"),
        fmt_opt(g, "power_w", "W"),
        fmt_opt(g, "power_limit_w", "W"),
        fmt_opt(g, "sm_clock_mhz", "MHz"),
        fmt_opt(g, "mem_clock_mhz", "MHz"),
        f"{g.ecc_sbe_volatile}/{g.ecc_dbe_volatile}",
        f"{g.ecc_sbe_aggregate}/{g.ecc_dbe_aggregate}",
        remap,
        remap_flags,
        fmt_list(g.xids),
        fmt_list(g.nvlink_down),
        fabric,
    )


def cmd_provision(args: argparse.Namespace) -> int:
    if bool(args.names) == bool(args.rack):
        args.parser.error("give NODE names or --rack R (one of them)")
    if args.concurrency < 0:
        args.parser.error("--concurrency must be 0 or more")
    request = fleet_pb2.ProvisionNodesRequest(
        names=args.names,
        rack=args.rack,
        image=args.image,
        image_server=args.image_server,
        concurrency=args.concurrency,
    )
    result = power.BulkResult()
    with connect(args) as session:
        # No deadline: booting an image takes minutes; the controller times
        # out each node's agent itself, Ctrl-C stops following (not the nodes).
        stream = session.stub.ProvisionNodes(request)
        progress = power.ProgressLine(sys.stderr, enabled=not session.json)
        try:
            for message in stream:
                result.total = max(result.total, int(message.total))
                if message.phase == "inspecting":
                    result.ok.append(message.node)
                elif message.phase == "failed":
                    result.failed.append((message.node, message.error or "no reason given"))
                if session.json:
                    emit_json_line(message)
                progress.update(provision_text(message), keep=not message.ok)
        finally:
            progress.finish()
            stream.cancel()
        if not session.json:
            emit(provision_summary(args.image, result))
    return 1 if result.failed else 0


def provision_text(message: Any) -> str:
    """``[1/4] h200-n01 power_cycled (12.3 s)`` or ``[2/4] h200-n02 FAILED: <why>``."""
    head = f"[{message.done}/{message.total}] {message.node}"
    if not message.ok:
        return f"{head} FAILED: {message.error or 'no reason given'}"
    return f"{head} {message.phase} ({message.elapsed_s:.1f} s)"


def provision_summary(image: str, result: power.BulkResult) -> str:
    done = len(result.ok) + len(result.failed)
    total = max(result.total, done)
    line = (
        f"provision {image}: {total} nodes, {len(result.ok)} booted and inspecting, "
        f"{len(result.failed)} failed"
    )
    if done < total:
        line += f", {total - done} still provisioning (kiln nodes list --state provisioning)"
    if not result.failed:
        return line
    return line + "\n" + render_table(("node", "error"), sorted(result.failed))
