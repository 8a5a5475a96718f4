"""``kiln-controller``: run Kiln's central service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from controller.core.errors import KilnError
from controller.core.preparation import PrepLimits
from controller.core.queues import load_queues
from controller.server import ControllerConfig, ControllerServer
from controller.tls import server_credentials


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln-controller", description=__doc__)
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT to serve gRPC on")
    p.add_argument(
        "--db",
        default=None,
        help="database URL; default SQLite in --state-dir "
        "(PostgreSQL: postgresql+psycopg://USER@HOST/DB)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path("state"),
        help="directory for the SQLite database (default ./state)",
    )
    p.add_argument("--profiles", type=Path, default=None, help="directory of node profiles")
    p.add_argument(
        "--sample-interval", type=float, default=5.0, help="seconds between agent health samples"
    )
    p.add_argument(
        "--rules",
        type=Path,
        default=None,
        help="health policy rules (YAML; default: the built-in rules)",
    )
    p.add_argument(
        "--queues",
        type=Path,
        default=None,
        help="queue quotas (YAML, see docs/placement.md); default: one unlimited queue",
    )
    p.add_argument(
        "--power-sync-interval",
        type=float,
        default=60.0,
        help="seconds between power-state sync passes over every BMC",
    )
    p.add_argument(
        "--agent-silent-after",
        type=float,
        default=15.0,
        help="seconds without an agent report before a powered-on node's "
        "BMC thermal sensors feed the health policies (default 15)",
    )
    p.add_argument(
        "--bmc-thermal-interval",
        type=float,
        default=10.0,
        help="seconds between BMC thermal readings of a silent node (default 10)",
    )
    limits = PrepLimits()
    p.add_argument(
        "--max-preparing",
        type=positive,
        default=limits.prepare_fleet,
        help="nodes prepared at once, fleet-wide (default %(default)s)",
    )
    p.add_argument(
        "--max-preparing-per-rack",
        type=positive,
        default=limits.prepare_per_rack,
        help="nodes prepared at once in one rack (default %(default)s)",
    )
    p.add_argument(
        "--max-firmware-updates",
        type=positive,
        default=limits.firmware_fleet,
        help="firmware updates at once, fleet-wide (default %(default)s)",
    )
    p.add_argument(
        "--max-firmware-updates-per-rack",
        type=positive,
        default=limits.firmware_per_rack,
        help="firmware updates at once in one rack (default %(default)s)",
    )
    p.add_argument(
        "--reconcile-interval",
        type=float,
        default=1.0,
        help="seconds between lifecycle passes over every node",
    )
    p.add_argument(
        "--secret-key-file",
        type=Path,
        default=None,
        help="key that seals BMC passwords in the database (default: "
        "STATE_DIR/secret.key, created on first start; share it between "
        "controllers on one PostgreSQL database)",
    )
    p.add_argument("--mqtt", default=None, help="HOST:PORT of the MQTT broker for events")
    tls = p.add_argument_group(
        "TLS", "serve gRPC over TLS (default: plaintext); see README, Securing the agent stream"
    )
    tls.add_argument("--tls-cert", type=Path, default=None, help="server certificate (PEM)")
    tls.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    tls.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        help="require client certificates signed by this CA (mutual TLS); an agent's "
        "certificate must name its node (CN or DNS SAN)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


async def serve(config: ControllerConfig) -> int:
    """Run until SIGINT/SIGTERM (0) or until the active-controller lock is lost (1)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = ControllerServer(config)
    starting = asyncio.create_task(server.start())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # stopped while waiting as a standby
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 0
        starting.result()
        print(f"kiln-controller listening on {server.address}", flush=True)
        lost = asyncio.create_task(server.lock_lost.wait())
        await asyncio.wait({stopping, lost}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        return 1 if server.lock_lost.is_set() else 0
    finally:
        stopping.cancel()
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        queues = load_queues(args.queues) if args.queues else []
        server_credentials(args.tls_cert, args.tls_key, args.tls_client_ca)  # fail fast
    except KilnError as e:
        print(f"kiln-controller: error: {e}", file=sys.stderr)
        return 2
    config = ControllerConfig(
        queues=queues,
        listen=args.listen,
        db_url=args.db,
        state_dir=args.state_dir,
        profiles_dir=args.profiles,
        sample_interval=args.sample_interval,
        rules_file=args.rules,
        mqtt=args.mqtt,
        power_sync_interval=args.power_sync_interval,
        reconcile_interval=args.reconcile_interval,
        agent_silent_after=args.agent_silent_after,
        bmc_thermal_interval=args.bmc_thermal_interval,
        prep_limits=PrepLimits(
            prepare_fleet=args.max_preparing,
            prepare_per_rack=args.max_preparing_per_rack,
            firmware_fleet=args.max_firmware_updates,
            firmware_per_rack=args.max_firmware_updates_per_rack,
        ),
        secret_key_file=args.secret_key_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
    )
    try:
        return asyncio.run(serve(config))
    except KilnError as e:
        print(f"kiln-controller: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"kiln-controller: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
