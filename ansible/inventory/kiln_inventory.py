#!/usr/bin/env python3
"""Ansible dynamic inventory: the Kiln fleet, read from a Kiln controller.

Protocol (Ansible's "inventory script" contract):

- ``--list`` prints one JSON object: every group with its ``hosts``, the
  ``all`` group's ``children``, and ``_meta.hostvars`` with each node's
  variables, so Ansible never needs to call ``--host``.
- ``--host NAME`` prints the variables of node ``NAME`` as a JSON object.

The controller is ``$KILN_CONTROLLER`` (HOST:PORT, default 127.0.0.1:50051),
reached over gRPC (``kiln.v1.FleetService``); ``$KILN_INVENTORY_TIMEOUT`` is
the deadline of each call in seconds (default 10). Nodes are read a page
of 1000 at a time, every page.

Groups (names lower-cased, anything but ``[a-z0-9_]`` replaced by ``_``):
``kiln_nodes`` (every node), ``rack_<rack>``, ``leaf_<leaf>``,
``spine_<spine>``, ``state_<state>`` (``state_ready``), ``gpu_<model>``
(``gpu_h200``) and ``nvlink_<domain>``; a node without a value (no GPUs
reported yet, no NVLink domain) is in no group of that kind.

Host variables: ``rack``, ``leaf``, ``spine``, ``gpu_model``, ``gpu_count``,
``nvlink_domain``, ``state``, ``power``, ``schedulable``, ``allocation``,
``profile`` and ``bmc_url``. Never credentials: no BMC user name or
password, and any user information in a BMC URL is removed.

Failures print one line, ``kiln_inventory: error: <what>``, on stderr and
exit 1 (2 for a malformed ``$KILN_CONTROLLER``); nothing goes to stdout then.

Needs only the standard library, ``grpcio`` and the generated ``kiln.v1``
stubs: from the installed ``kiln`` package, else from this checkout's
``proto/`` directory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PROG = "kiln_inventory"
CONTROLLER_ENV = "KILN_CONTROLLER"
TIMEOUT_ENV = "KILN_INVENTORY_TIMEOUT"
TOKEN_ENV = "KILN_TOKEN"  # a viewer token, for a controller with authentication on
DEFAULT_CONTROLLER = "127.0.0.1:50051"
DEFAULT_TIMEOUT = 10.0
PAGE_SIZE = 1000  # nodes per ListNodes call; every page is read
ALL_NODES_GROUP = "kiln_nodes"
EXIT_FAILURE = 1
EXIT_USAGE = 2

# How grpc-core words a failure to reach the peer at all, as opposed to a
# controller that answered UNAVAILABLE itself.
_CONNECT_FAILURES = (
    "failed to connect to all addresses",
    "dns resolution failed",
    "connections to all backends failing",
    "empty address list",
    "socket closed",
    "connection reset",
)
_UNSAFE_NAME = re.compile(r"[^a-z0-9_]")


class InventoryError(Exception):
    """A failure to report; ``str(err)`` is the whole one-line message (no secrets)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def group_name(kind: str, value: str) -> str:
    """``kind_value`` as a valid Ansible group name: ``group_name("gpu", "H200") == "gpu_h200"``."""
    return _UNSAFE_NAME.sub("_", f"{kind}_{value}".lower())


def redact_url(url: str) -> str:
    """``url`` without user information (``user:pass@``); other parts unchanged."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def parse_target(text: str) -> str:
    """Check ``HOST:PORT``; raises InventoryError (exit 2) when malformed."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InventoryError(
            f"{CONTROLLER_ENV}={text!r} is not HOST:PORT (e.g. 127.0.0.1:50051)", EXIT_USAGE
        )
    return text.strip()


def _enum_short(enum: Any, value: int, prefix: str) -> str:
    """``NODE_STATE_POWERED_OFF`` → ``powered_off``; an unknown number → its digits."""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return str(value)
    return name.removeprefix(prefix).lower()


class Inventory:
    """Builds inventory JSON from ``kiln.v1.Node`` messages (no I/O)."""

    def __init__(self, types_pb2: Any) -> None:
        self._types = types_pb2

    def host_vars(self, node: Any) -> dict[str, Any]:
        """The Ansible variables of one node; never carries credentials."""
        return {
            "rack": node.rack,
            "leaf": node.leaf,
            "spine": node.spine,
            "gpu_model": node.gpu_model,
            "gpu_count": int(node.gpu_count),
            "nvlink_domain": node.nvlink_domain,
            "state": _enum_short(self._types.NodeState, node.state, "NODE_STATE_"),
            "power": _enum_short(self._types.PowerState, node.power, "POWER_STATE_"),
            "schedulable": bool(node.schedulable),
            "allocation": node.allocation,
            "profile": node.profile,
            "bmc_url": redact_url(node.bmc_url),
        }

    def groups_of(self, hostvars: dict[str, Any]) -> list[str]:
        """Every group a node with ``hostvars`` belongs to, ``kiln_nodes`` first."""
        groups = [ALL_NODES_GROUP]
        for kind, key in (
            ("rack", "rack"),
            ("leaf", "leaf"),
            ("spine", "spine"),
            ("state", "state"),
            ("gpu", "gpu_model"),
            ("nvlink", "nvlink_domain"),
        ):
            if hostvars[key]:
                groups.append(group_name(kind, str(hostvars[key])))
        return groups

    def listing(self, nodes: list[Any]) -> dict[str, Any]:
        """The ``--list`` answer for ``nodes``; hosts in each group sorted by name."""
        hostvars: dict[str, dict[str, Any]] = {}
        members: dict[str, list[str]] = {ALL_NODES_GROUP: []}
        for node in sorted(nodes, key=lambda n: n.name):
            hostvars[node.name] = self.host_vars(node)
            for group in self.groups_of(hostvars[node.name]):
                members.setdefault(group, []).append(node.name)
        out: dict[str, Any] = {group: {"hosts": hosts} for group, hosts in members.items()}
        out["all"] = {"children": sorted(["ungrouped", *members])}
        out["_meta"] = {"hostvars": hostvars}
        return out


def _load_api() -> tuple[Any, Any, Any, Any]:
    """``(grpc, fleet_pb2, fleet_pb2_grpc, types_pb2)``; InventoryError when missing."""
    try:
        import grpc
    except ModuleNotFoundError as e:
        raise InventoryError("grpcio is not installed (pip install grpcio)") from e
    try:
        from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2
    except ModuleNotFoundError:
        proto = Path(__file__).resolve().parents[2] / "proto"
        if not (proto / "kiln" / "v1" / "fleet_pb2.py").is_file():
            raise InventoryError(
                "the kiln.v1 API stubs are not importable: install the kiln package "
                "or run this script from a Kiln checkout"
            ) from None
        sys.path.insert(0, str(proto))
        from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2
    return grpc, fleet_pb2, fleet_pb2_grpc, types_pb2


def _rpc_message(grpc: Any, err: Any, target: str) -> str:
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else ""
    details = " ".join(str(details or "").split())
    if code is grpc.StatusCode.UNAVAILABLE and details.lower().startswith(_CONNECT_FAILURES):
        return f"cannot reach controller at {target} (UNAVAILABLE)"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"DEADLINE_EXCEEDED: no answer from controller at {target} in time"
    name = code.name if code is not None else "UNKNOWN"
    return f"{name}: {details}" if details else name


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise InventoryError(f"{TIMEOUT_ENV}={text!r} is not a positive number", EXIT_USAGE)
    return value


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Answer ``--list`` or ``--host`` from the controller; raises InventoryError."""
    target = parse_target(os.environ.get(CONTROLLER_ENV) or DEFAULT_CONTROLLER)
    timeout = _timeout()
    grpc, fleet_pb2, fleet_pb2_grpc, types_pb2 = _load_api()
    inventory = Inventory(types_pb2)
    token = os.environ.get(TOKEN_ENV, "").strip()
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(target) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        try:
            if args.host is not None:
                request = fleet_pb2.GetNodeRequest(name=args.host)
                node = stub.GetNode(request, timeout=timeout, metadata=metadata)
                return inventory.host_vars(node)
            nodes = _every_node(stub, fleet_pb2, timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise InventoryError(_rpc_message(grpc, e, target)) from None
    return inventory.listing(nodes)


def _every_node(stub: Any, fleet_pb2: Any, **call: Any) -> list[Any]:
    """Every node, page after page (ListNodes answers at most PAGE_SIZE at a time)."""
    request = fleet_pb2.ListNodesRequest(page_size=PAGE_SIZE)
    nodes: list[Any] = []
    seen: set[str] = set()
    while True:
        response = stub.ListNodes(request, **call)
        nodes.extend(response.nodes)
        token = response.next_page_token
        if not token:
            return nodes
        if token in seen:
            raise InventoryError("the controller's node list never ends (a page token repeated)")
        seen.add(token)
        request.page_token = token


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Ansible dynamic inventory of a Kiln fleet "
        f"(controller: ${CONTROLLER_ENV}, default {DEFAULT_CONTROLLER}).",
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="every group and host (JSON)")
    mode.add_argument("--host", metavar="NAME", help="the variables of one node (JSON)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the inventory script; returns the exit code and never raises."""
    args = build_parser().parse_args(argv)
    try:
        answer = run(args)
    except InventoryError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: error: interrupted\n")
        return EXIT_FAILURE
    sys.stdout.write(json.dumps(answer, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
