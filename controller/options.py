"""``kiln-controller``'s options, parsed and checked in one place before anything starts.

Every problem is an ``OptionError``: one line naming the option and what is
wrong with it, on which ``kiln-controller`` exits 2 (``docs/operations.md``).
A value is named ``--option VALUE: problem``; a file's contents
``FILE (--option): problem``. The checks run in two steps:

1. ``parse(argv)`` reads and validates every value and file and changes
   nothing: intervals and caps above zero, ``--listen`` a HOST:PORT, the
   profiles directory (every profile valid, no name twice), queues, rules,
   TLS files and the secret key's format;
2. ``check_store(config)`` then proves the database answers, takes writes,
   and that the secret key opens the BMC passwords sealed in it (this may
   create the state directory and the SQLite file, and may block for up to
   ``CONNECT_TIMEOUT_S``).

The port is proven by binding it, the first thing ``ControllerServer.start``
does (``ListenError``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from controller.api.keepalive import DEFAULT_KEEPALIVE_S
from controller.api.limits import DEFAULT_MAX_STREAMS, DEFAULT_RATE
from controller.bmc.image_check import MODES
from controller.checks import Suite, load_default_suite, load_suite
from controller.core.errors import InvalidArgument, KilnError
from controller.core.power_sync import (
    DEFAULT_POWER_SYNC_RATE,
    DEFAULT_POWER_SYNC_SPREAD,
    DEFAULT_POWER_SYNC_VOUCHED_EVERY,
)
from controller.core.preparation import PrepLimits
from controller.core.profiles import ProfileCatalog
from controller.core.provisioning import ProvisionLimits
from controller.core.queues import load_queues
from controller.core.report_pace import DEFAULT_LONGEST_INTERVAL, PaceRules
from controller.events.broker import BrokerAccess, BrokerTls, read_password_file
from controller.placement import QueueConfig
from controller.policies import RuleSet, load_rules
from controller.server import ControllerConfig
from controller.store.engine import default_sqlite_url
from controller.store.secrets import SecretBox
from controller.store.startup_checks import check_database, check_secret_key
from controller.tls import server_credentials
from images.catalog import DEFAULT_PATH as DEFAULT_CATALOG
from images.catalog import Catalog, CatalogError, load_catalog


class OptionError(InvalidArgument):
    """A controller option is unusable; the message (one line) names it and the problem."""

    @classmethod
    def value(cls, option: str, value: object, problem: str) -> OptionError:
        return cls(f"{option} {value}: {problem}")

    @classmethod
    def file(cls, option: str, path: Path | str, problem: str) -> OptionError:
        return cls(f"{path} ({option}): {problem}")


@dataclass(frozen=True)
class Options:
    config: ControllerConfig
    verbose: bool = False


# -- value types: argparse names the option in front of their messages -----------


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _positive_number(text: str, what: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0{unit}, not {text}")
    return value


def seconds(text: str) -> float:
    """A positive, finite number of seconds (0 would spin a loop on a core)."""
    return _positive_number(text, "a number of seconds", " seconds")


def seconds_or_off(text: str) -> float:
    """A positive, finite number of seconds, or 0 for off."""
    try:
        if float(text) == 0:
            return 0.0
    except ValueError:
        pass  # refused below, with the same words
    return _positive_number(text, "a number of seconds (or 0: off)", " seconds (or 0: off)")


def rate(text: str) -> float:
    """A positive, finite number (of requests a second)."""
    return _positive_number(text, "a number", "")


def share(text: str) -> float:
    """A share from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share from 0 to 1") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a share from 0 to 1, not {text}")
    return value


def host_port(text: str) -> str:
    """HOST:PORT with PORT 0-65535 (0: any free port); IPv6 hosts in brackets."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"wants HOST:PORT, not {text!r}")
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"port must be a number from 0 to 65535, not {port!r}")
    if host.startswith("[") != host.endswith("]"):
        raise argparse.ArgumentTypeError(f"unbalanced brackets in {host!r}")
    return text


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is an OptionError (one line, exit 2), not usage text."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument "):  # "argument --x: problem" names the option
            raise OptionError(message.removeprefix("argument "))
        raise OptionError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kiln-controller", description="Run Kiln's central service.")
    p.add_argument(
        "--listen",
        type=host_port,
        default="127.0.0.1:50051",
        help="HOST:PORT to serve gRPC on (refused when anything already listens there)",
    )
    p.add_argument(
        "--agent-listen",
        type=host_port,
        default=None,
        help="HOST:PORT (a fixed port) where --agent-relays worker processes serve Kiln's "
        "services: the agents' streams and FleetService calls (health and reflection stay on "
        "--listen, which still serves everything too)",
    )
    p.add_argument(
        "--agent-relays",
        type=int,
        default=0,
        help="worker processes serving the agent streams and FleetService calls on "
        "--agent-listen (default 0: the controller's own process serves them): at fleet size, "
        "their gRPC work then takes another core's time, not the controller's",
    )
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
        "--sample-interval", type=seconds, default=5.0, help="seconds between agent health samples"
    )
    p.add_argument(
        "--health-flush-interval",
        type=seconds,
        default=5.0,
        help="seconds between writes of the agents' latest health to the database: the "
        "most samples a crash loses, never a transition or event (default %(default)s)",
    )
    p.add_argument(
        "--max-health-reports-per-second",
        type=rate,
        default=5000.0,
        help="health reports a second the controller asks of all agents together; beyond "
        "it, registering agents are told to sample less often (default %(default)s)",
    )
    p.add_argument(
        "--max-report-interval",
        type=seconds_or_off,
        default=DEFAULT_LONGEST_INTERVAL,
        help="while the controller's event loop lags (median over 3 s above 0.1 s), every "
        "agent is asked to report 1.5x less often, up to this many seconds between "
        "reports, and more often again once it keeps up; 0: never (default %(default)s)",
    )
    p.add_argument(
        "--rules",
        type=Path,
        default=None,
        help="health policy rules (YAML; default: the built-in rules)",
    )
    p.add_argument(
        "--checks",
        default="default",
        metavar="FILE|default|off",
        help="health-check suite (YAML, see docs/health-checks.md): intake and repair "
        "burn-in and periodic checks; 'default' the built-in suite, 'off' none "
        "(default %(default)s)",
    )
    p.add_argument(
        "--queues",
        type=Path,
        default=None,
        help="queue quotas (YAML, see docs/placement.md); default: one unlimited queue",
    )
    p.add_argument(
        "--power-sync-interval",
        type=seconds,
        default=60.0,
        help="seconds between power-state sync passes over every BMC",
    )
    p.add_argument(
        "--power-sync-rate",
        type=rate,
        default=None,
        help="BMCs power sync reads a second at most; a fleet larger than the interval "
        f"allows at this rate is read over a longer pass (default {DEFAULT_POWER_SYNC_RATE:g}; "
        "with --bmc-readers, no cap)",
    )
    p.add_argument(
        "--power-sync-spread",
        type=share,
        default=None,
        help="share of the interval over which a pass's BMC reads begin, past the first "
        f"32 (default {DEFAULT_POWER_SYNC_SPREAD:g}; with --bmc-readers, 0: all at once, as "
        "many at a time as the BMC concurrency allows)",
    )
    p.add_argument(
        "--power-sync-vouched-every",
        type=int,
        default=DEFAULT_POWER_SYNC_VOUCHED_EVERY,
        help="a node whose agent is connected, powered on as Kiln expects, has its BMC read "
        "by power sync every N passes instead of every pass (default %(default)d; 1: every "
        "BMC every pass)",
    )
    p.add_argument(
        "--bmc-readers",
        type=int,
        default=0,
        help="processes doing the periodic BMC reads (power sync, leak detectors, BMC "
        "thermal poll), each with its own BMC pool (default 0: the controller's own process "
        "reads): at fleet size, those reads then take another core's time, not the "
        "controller's",
    )
    p.add_argument(
        "--leak-interval",
        type=seconds,
        default=5.0,
        help="seconds between reads of every node's coolant leak detectors through its "
        "BMC; a tray with a Critical detector is powered off right after the read that "
        "finds it (default 5, see docs/leaks.md)",
    )
    p.add_argument(
        "--agent-silent-after",
        type=seconds,
        default=15.0,
        help="seconds without an agent report before a powered-on node's "
        "BMC thermal sensors feed the health policies (default 15)",
    )
    p.add_argument(
        "--agent-keepalive",
        type=seconds,
        default=DEFAULT_KEEPALIVE_S,
        help="seconds between the gRPC pings on every connection (agents' and clients'); one "
        "unanswered for 10 s is closed, so the agent of a node that lost power or its network "
        "counts as gone within about this plus 10 s (default 30)",
    )
    p.add_argument(
        "--bmc-thermal-interval",
        type=seconds,
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
        "--prepare-boot-timeout",
        type=seconds,
        default=limits.boot_timeout_s,
        help="seconds from preparation's power cycle (after firmware or BIOS changes) "
        "until the node's agent must register again; else the attempt fails and "
        "is retried (default %(default)g)",
    )
    provision = ProvisionLimits()
    p.add_argument(
        "--images",
        type=Path,
        default=None,
        metavar="FILE",
        help="OS image catalogue for `kiln nodes provision` (default: the packaged "
        "images/catalog.yaml; format in images/README.md)",
    )
    p.add_argument(
        "--image-server",
        default=None,
        metavar="URL",
        help="base URL of the image server BMCs fetch images from (overrides the "
        "catalogue's image_server)",
    )
    p.add_argument(
        "--image-verify",
        choices=MODES,
        default="fetch",
        help="how an image is checked against its pinned sha256 before provisioning: "
        "'fetch' downloads and hashes it, 'sidecar' compares URL.sha256 on the image "
        "server (default %(default)s)",
    )
    p.add_argument(
        "--provision-agent-timeout",
        type=seconds,
        default=provision.agent_timeout_s,
        help="seconds from a provisioned node's power cycle until its agent must "
        "register; then it is quarantined (default %(default)g)",
    )
    p.add_argument(
        "--max-provisioning",
        type=positive,
        default=provision.fleet,
        help="nodes booting an image at once, fleet-wide (default %(default)s)",
    )
    p.add_argument(
        "--max-provisioning-per-rack",
        type=positive,
        default=provision.per_rack,
        help="nodes booting an image at once in one rack (default %(default)s)",
    )
    p.add_argument(
        "--reconcile-interval",
        type=seconds,
        default=1.0,
        help="seconds between lifecycle passes over every node",
    )
    p.add_argument(
        "--max-streams-per-client",
        type=positive,
        default=DEFAULT_MAX_STREAMS,
        help="FleetService streams (event watches, bulk power) one client (IP address) "
        "may hold open at once (default %(default)s)",
    )
    p.add_argument(
        "--max-requests-per-second-per-client",
        type=rate,
        default=DEFAULT_RATE,
        help="FleetService requests a second one client (IP address) may make, in bursts "
        "of up to twice that (default %(default)s)",
    )
    p.add_argument(
        "--secret-key-file",
        type=Path,
        default=None,
        help="key that seals BMC passwords in the database (default: "
        "STATE_DIR/secret.key, created on first start; share it between "
        "controllers on one PostgreSQL database)",
    )
    p.add_argument(
        "--mqtt", type=host_port, default=None, help="HOST:PORT of the MQTT broker for events"
    )
    p.add_argument(
        "--http-listen",
        type=host_port,
        default=None,
        help="HOST:PORT for the read-only HTTP port: the fleet dashboard at / and "
        "Prometheus metrics at /metrics (default: none)",
    )
    mqtt = p.add_argument_group("MQTT broker", "how the controller signs in to --mqtt")
    mqtt.add_argument("--mqtt-username", default=None, help="broker user name")
    mqtt.add_argument(
        "--mqtt-password-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="file holding the broker password (first line); never on the command line",
    )
    mqtt.add_argument(
        "--mqtt-tls", action="store_true", help="TLS to the broker, verified by the system CAs"
    )
    mqtt.add_argument(
        "--mqtt-tls-ca", type=Path, default=None, help="TLS, verified by this CA (PEM)"
    )
    mqtt.add_argument("--mqtt-tls-cert", type=Path, default=None, help="client certificate (PEM)")
    mqtt.add_argument("--mqtt-tls-key", type=Path, default=None, help="its private key (PEM)")
    bmc = p.add_argument_group("BMCs", "how the controller talks to BMCs (docs/bmc.md)")
    bmc.add_argument(
        "--bmc-call-timeout",
        type=seconds,
        default=10.0,
        help="hard deadline of one BMC call, each retry its own (default %(default)s)",
    )
    bmc.add_argument(
        "--bmc-power-timeout",
        type=seconds,
        default=120.0,
        help="seconds a power change may take to show before it fails (default %(default)s)",
    )
    bmc.add_argument(
        "--bmc-power-resend-after",
        type=seconds,
        default=30.0,
        help="seconds after which an accepted power command that changed nothing is sent "
        "once more (default %(default)s)",
    )
    bmc.add_argument(
        "--bmc-workers",
        type=positive,
        default=256,
        help="threads for blocking BMC calls, split per protocol (IPMI at most 32) so "
        "one protocol's dead BMCs cannot starve another's (default %(default)s)",
    )
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
    auth = p.add_argument_group(
        "authentication", "who may call what; see README, Securing a fleet"
    ).add_mutually_exclusive_group()
    auth.add_argument(
        "--auth",
        dest="auth",
        action="store_const",
        const=True,
        default=None,
        help="require a bearer token or client certificate on every call, and check roles "
        "(default: on unless --listen is a loopback address)",
    )
    auth.add_argument(
        "--insecure-no-auth",
        dest="auth",
        action="store_const",
        const=False,
        help="serve every caller as an admin, even off loopback (logged as a warning)",
    )
    p.add_argument(
        "--bootstrap-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="when the fleet has no usable admin token, make one ('bootstrap-admin') and "
        "write it to FILE (mode 0600); a no-op once an admin token exists",
    )
    p.add_argument(
        "--simulation",
        action="store_true",
        help="a simulated fleet: serve InjectFault (every other controller answers UNIMPLEMENTED)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


# -- step 1: values and files ------------------------------------------------------


def parse(argv: list[str] | None = None) -> Options:
    """Parse and validate ``argv``; reads the files it names, changes nothing.

    Raises OptionError, or TlsConfigError for the TLS files.
    """
    args = build_parser().parse_args(argv)
    server_credentials(args.tls_cert, args.tls_key, args.tls_client_ca)
    if args.mqtt is not None and args.mqtt.endswith(":0"):
        raise OptionError.value("--mqtt", args.mqtt, "the broker's port cannot be 0")
    mqtt_access = _broker_access(args)
    if args.db is not None:
        _check_url(args.db)
    key_file = args.secret_key_file or args.state_dir / "secret.key"
    _check_key_format(key_file)
    if args.bootstrap_token_file is not None:
        _check_writable_file("--bootstrap-token-file", args.bootstrap_token_file)
    if args.power_sync_vouched_every < 1:
        raise OptionError.value(
            "--power-sync-vouched-every",
            args.power_sync_vouched_every,
            "must be 1 or more (1: every BMC every pass)",
        )
    if args.bmc_readers < 0:
        raise OptionError.value("--bmc-readers", args.bmc_readers, "cannot be negative")
    if args.agent_relays < 0:
        raise OptionError.value("--agent-relays", args.agent_relays, "cannot be negative")
    if (args.agent_relays > 0) != (args.agent_listen is not None):
        raise OptionError(
            "--agent-relays N and --agent-listen HOST:PORT go together: the relay workers "
            "serve the agents on that address"
        )
    if args.agent_listen is not None:
        if args.agent_listen.endswith(":0"):
            raise OptionError.value(
                "--agent-listen", args.agent_listen, "needs a fixed port: the workers share it"
            )
        if args.agent_listen == args.listen:
            raise OptionError.value("--agent-listen", args.agent_listen, "is --listen's address")
    config = ControllerConfig(
        listen=args.listen,
        agent_listen=args.agent_listen,
        agent_relays=args.agent_relays,
        bmc_readers=args.bmc_readers,
        db_url=args.db,
        state_dir=args.state_dir,
        profiles_dir=args.profiles,
        profiles=load_profiles(args.profiles),
        queues=load_queue_file(args.queues),
        rules_file=args.rules,
        rules=load_rule_file(args.rules),
        checks=load_check_suite(args.checks),
        sample_interval=args.sample_interval,
        health_flush_interval=args.health_flush_interval,
        max_health_reports_per_second=args.max_health_reports_per_second,
        pace=PaceRules(longest=args.max_report_interval),
        mqtt=args.mqtt,
        http_listen=args.http_listen,
        mqtt_access=mqtt_access,
        power_sync_interval=args.power_sync_interval,
        power_sync_rate=args.power_sync_rate,
        power_sync_spread=args.power_sync_spread,
        power_sync_vouched_every=args.power_sync_vouched_every,
        leak_interval=args.leak_interval,
        bmc_call_timeout=args.bmc_call_timeout,
        bmc_power_timeout=args.bmc_power_timeout,
        bmc_power_resend_after=args.bmc_power_resend_after,
        bmc_workers=args.bmc_workers,
        reconcile_interval=args.reconcile_interval,
        agent_silent_after=args.agent_silent_after,
        agent_keepalive=args.agent_keepalive,
        bmc_thermal_interval=args.bmc_thermal_interval,
        prep_limits=PrepLimits(
            prepare_fleet=args.max_preparing,
            prepare_per_rack=args.max_preparing_per_rack,
            firmware_fleet=args.max_firmware_updates,
            firmware_per_rack=args.max_firmware_updates_per_rack,
            boot_timeout_s=args.prepare_boot_timeout,
        ),
        images=load_image_catalog(args.images),
        images_file=args.images,
        image_server=args.image_server,
        image_verify=args.image_verify,
        provision_limits=ProvisionLimits(
            fleet=args.max_provisioning,
            per_rack=args.max_provisioning_per_rack,
            agent_timeout_s=args.provision_agent_timeout,
        ),
        secret_key_file=key_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        auth=args.auth,
        simulation=args.simulation,
        bootstrap_token_file=args.bootstrap_token_file,
        max_streams_per_client=args.max_streams_per_client,
        max_requests_per_second_per_client=args.max_requests_per_second_per_client,
    )
    return Options(config=config, verbose=args.verbose)


def _check_writable_file(option: str, path: Path) -> None:
    """``path`` can be written: its directory exists, and it is not a directory."""
    if path.is_dir():
        raise OptionError.value(option, path, "is a directory, not a file")
    if not path.parent.is_dir():
        raise OptionError.value(option, path, f"no such directory {path.parent}")


def read_text(option: str, path: Path) -> str:
    """The UTF-8 text of ``path``; OptionError when it cannot be read or decoded."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise OptionError.value(option, path, "no such file") from None
    except IsADirectoryError:
        raise OptionError.value(option, path, "is a directory, not a file") from None
    except OSError as e:
        raise OptionError.value(option, path, f"cannot read it: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise OptionError.file(option, path.name, _not_utf8(e)) from e


def _not_utf8(e: UnicodeDecodeError) -> str:
    return f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"


def load_image_catalog(path: Path | None) -> Catalog:
    """``--images``: the catalogue file (None: the packaged one), every problem named."""
    try:
        return load_catalog(path or DEFAULT_CATALOG)
    except CatalogError as e:
        name = path.name if path is not None else DEFAULT_CATALOG.name
        raise OptionError.file("--images", name, "; ".join(e.problems)) from None


def load_profiles(directory: Path | None) -> ProfileCatalog:
    if directory is None:
        return ProfileCatalog()
    if not directory.exists():
        raise OptionError.value("--profiles", directory, "no such directory")
    if not directory.is_dir():
        raise OptionError.value("--profiles", directory, "is a file; give the directory of *.yaml")
    try:
        return ProfileCatalog.load(directory, origin=lambda p: f"{p.name} (--profiles)")
    except InvalidArgument as e:
        raise OptionError(str(e)) from e


def load_queue_file(path: Path | None) -> list[QueueConfig]:
    if path is None:
        return []
    read_text("--queues", path)  # a missing or unreadable file is about the option's value
    try:
        return load_queues(path, origin=f"{path.name} (--queues)")
    except InvalidArgument as e:
        raise OptionError(str(e)) from e


def load_check_suite(value: str) -> Suite | None:
    """``--checks``: a suite file, the built-in one ("default"), or none ("off")."""
    if value == "off":
        return None
    if value == "default":
        return load_default_suite()
    path = Path(value)
    text = read_text("--checks", path)
    try:
        return load_suite(text)
    except InvalidArgument as e:
        raise OptionError.file("--checks", path.name, str(e)) from e


def load_rule_file(path: Path | None) -> RuleSet | None:
    if path is None:
        return None
    text = read_text("--rules", path)
    try:
        return load_rules(text)
    except InvalidArgument as e:
        raise OptionError.file("--rules", path.name, str(e)) from e


def _broker_access(args: argparse.Namespace) -> BrokerAccess | None:
    """The MQTT broker's credentials and TLS, every file read and loaded now."""
    tls_files = (args.mqtt_tls_ca, args.mqtt_tls_cert, args.mqtt_tls_key)
    given = args.mqtt_username is not None or args.mqtt_password_file is not None
    if not (given or args.mqtt_tls or any(f is not None for f in tls_files)):
        return None
    if args.mqtt is None:
        raise OptionError("--mqtt-* options need --mqtt HOST:PORT")
    if (args.mqtt_username is None) != (args.mqtt_password_file is None):
        raise OptionError("--mqtt-username and --mqtt-password-file go together")
    password = None
    if args.mqtt_password_file is not None:
        password = read_password_file(args.mqtt_password_file)
    tls = None
    if args.mqtt_tls or any(f is not None for f in tls_files):
        tls = BrokerTls(*tls_files)
        tls.context()  # loads every file: a bad one stops the start here
    return BrokerAccess(username=args.mqtt_username, password=password, tls=tls)


def check_db_url(url: str) -> None:
    """``url`` names a database Kiln runs on (OptionError naming --db if not)."""
    _check_url(url)


def _check_url(url: str) -> None:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise OptionError.value("--db", url, "not a database URL") from None
    if not parsed.drivername.startswith(("sqlite", "postgresql")):
        raise OptionError.value(
            "--db",
            _shown(url),
            "Kiln runs on SQLite or PostgreSQL (postgresql+psycopg://USER@HOST/DB)",
        )


def _shown(url: str) -> str:
    """``url`` as given, unless it holds a password, which is masked."""
    parsed = make_url(url)
    return parsed.render_as_string(hide_password=True) if parsed.password else url


def _check_key_format(key_file: Path) -> None:
    """A key file that exists must hold a key (a missing one is made at start)."""
    if not key_file.exists():
        return
    try:
        SecretBox.from_key_file(key_file, create=False)
    except OSError as e:
        raise OptionError.value(
            "--secret-key-file", key_file, f"cannot read it: {e.strerror or e}"
        ) from e
    except InvalidArgument as e:
        raise OptionError.value("--secret-key-file", key_file, "does not hold a Fernet key") from e


# -- step 2: the database ----------------------------------------------------------


def check_store(config: ControllerConfig) -> None:
    """Prove the database answers and takes writes, and the key opens its secrets.

    May create the state directory and its SQLite file; may block for up to
    ``CONNECT_TIMEOUT_S``. Raises OptionError naming --db (or --state-dir)
    or --secret-key-file.
    """
    if config.db_url:
        option, value, url = "--db", _shown(config.db_url), config.db_url
    else:
        assert config.state_dir is not None
        option, value = "--state-dir", str(config.state_dir)
        try:
            url = default_sqlite_url(config.state_dir)
        except OSError as e:
            raise OptionError.value(option, value, f"cannot create it: {e.strerror or e}") from e
    try:
        check_database(url)
    except KilnError as e:
        raise OptionError.value(option, value, str(e)) from e
    key_file = config.secret_key_file or config.state_dir / "secret.key"  # type: ignore[operator]
    try:
        check_secret_key(url, key_file)
    except OSError as e:
        raise OptionError.value(
            "--secret-key-file", key_file, f"cannot read it: {e.strerror or e}"
        ) from e
    except KilnError as e:
        raise OptionError.value("--secret-key-file", key_file, str(e)) from e
