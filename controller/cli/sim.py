"""``kiln sim fault``: inject a fault into a simulated node's fake NVML.

The fault is a JSON object: ``{"kind": ...}`` plus the explicit flags
(``--gpu``, ``--target-c``, ``--code``, ``--watts``, ``--link``) plus any
``--set key=value`` pairs, whose values are read as JSON when they parse
(``3``, ``true``, ``[1,2]``) and as strings otherwise. ``--set`` wins over a
flag naming the same key.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from controller.cli.client import CliError, connect
from controller.cli.output import emit, emit_json
from kiln.v1 import fleet_pb2

# flag dest → key in the fault JSON
_FLAG_KEYS = {
    "gpu": "gpu",
    "target_c": "target_c",
    "code": "code",
    "watts": "watts",
    "link": "link",
}


def register(subparsers: Any) -> None:
    """Add ``kiln sim …`` to the top-level subparsers."""
    sim = subparsers.add_parser("sim", help="simulated fleets: inject faults")
    sub = sim.add_subparsers(dest="sim_command", metavar="COMMAND", required=True)
    p = sub.add_parser("fault", help="inject a fault into a simulated node")
    p.add_argument("node")
    p.add_argument("--kind", required=True, help="fault kind, e.g. heat, xid, ecc, power")
    p.add_argument("--gpu", type=int, help="GPU index")
    p.add_argument("--target-c", type=float, help="target temperature in Celsius")
    p.add_argument("--code", type=int, help="XID or error code")
    p.add_argument("--watts", type=float, help="power draw in watts")
    p.add_argument("--link", type=int, help="NVLink index")
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        type=_setting,
        metavar="KEY=VALUE",
        help="any other field of the fault (repeatable)",
    )
    p.set_defaults(func=cmd_fault)


def _setting(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def build_fault(args: argparse.Namespace) -> dict[str, Any]:
    """The fault object ``kiln sim fault``'s options describe."""
    fault: dict[str, Any] = {"kind": args.kind}
    for dest, key in _FLAG_KEYS.items():
        value = getattr(args, dest)
        if value is not None:
            fault[key] = value
    for key, value in args.settings:
        fault[key] = value
    return fault


def cmd_fault(args: argparse.Namespace) -> int:
    fault = build_fault(args)
    request = fleet_pb2.InjectFaultRequest(node=args.node, fault_json=json.dumps(fault))
    with connect(args) as session:
        response = session.stub.InjectFault(request, timeout=session.timeout)
        if session.json:
            emit_json(response)
        elif response.ok:
            emit(f"fault injected into {args.node}: {response.message or json.dumps(fault)}")
        if not response.ok:
            raise CliError(
                f"fault not injected into {args.node}: {response.message or 'no reason'}"
            )
    return 0
