"""``kiln racks list`` and ``kiln topology export``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from controller.cli.client import connect
from controller.cli.output import emit, emit_json, render_table
from kiln.v1 import fleet_pb2

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
