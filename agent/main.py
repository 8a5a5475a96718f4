"""``kiln-agent``: the per-node agent (real NVML, or a simulated node)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from pathlib import Path

from agent.client import DEFAULT_SAMPLE_INTERVAL, Agent
from agent.metrics import AgentMetrics
from agent.nvml import open_backend
from kiln_common.tls import channel_credentials
from kiln_common.tokens import read_token_file


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln-agent", description=__doc__)
    p.add_argument(
        "--controller",
        required=True,
        help="controller HOST:PORT (several, comma-separated: the active one and standbys)",
    )
    p.add_argument(
        "--node-name",
        default=socket.gethostname(),
        help="the node's enrolled name (default: the hostname)",
    )
    p.add_argument(
        "--nvml",
        default="real",
        help="real (default), or a simulated node: fake:h100, fake:h200, fake:gb200",
    )
    p.add_argument(
        "--cluster-uuid",
        default=None,
        help="fake:gb200 only: the NVLink fabric cluster UUID shared by a rack",
    )
    p.add_argument("--clique-id", type=int, default=0, help="fake:gb200 only: the clique id")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics (dcgm-exporter names) on this port",
    )
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument(
        "--sample-interval",
        type=float,
        default=DEFAULT_SAMPLE_INTERVAL,
        metavar="SECONDS",
        help="seconds between samples while no controller has the node registered "
        f"(default {DEFAULT_SAMPLE_INTERVAL:g}; a controller sets its own)",
    )
    tls = p.add_argument_group("TLS", "dial the controller over TLS (default: plaintext)")
    tls.add_argument(
        "--tls-ca", type=Path, default=None, help="CA that signed the controller's certificate"
    )
    tls.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        help="this node's client certificate (CN or a DNS SAN = the node name)",
    )
    tls.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="this node's agent token (kiln nodes enroll --agent-token-file), for a "
        "controller with authentication on and no client certificate",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


async def run(args: argparse.Namespace) -> None:
    credentials = channel_credentials(args.tls_ca, args.tls_cert, args.tls_key)
    token = read_token_file(args.token_file) if args.token_file is not None else None
    nvml = open_backend(
        args.nvml,
        node_name=args.node_name,
        cluster_uuid=args.cluster_uuid,
        clique_id=args.clique_id,
    )
    metrics = AgentMetrics(args.node_name) if args.metrics_port is not None else None
    agent = Agent(
        args.controller,
        args.node_name,
        nvml,
        backend=args.nvml,
        metrics=metrics,
        channel_credentials=credentials,
        token=token,
        sample_interval=args.sample_interval,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(agent.stop()))
    if metrics is not None:
        port = await metrics.start(args.metrics_host, args.metrics_port)
        print(f"kiln-agent metrics on http://{args.metrics_host}:{port}/metrics", flush=True)
    try:
        await agent.run()
    finally:
        if metrics is not None:
            await metrics.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(run(args))
    except ValueError as e:
        print(f"kiln-agent: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # e.g. NVML library not found on this machine
        print(f"kiln-agent: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
