"""``kiln certs``: a fleet CA, and the certificates the controller reads identities from.

Offline: nothing here dials a controller. ``kiln certs init`` makes the CA
(``DIR/ca.pem``, ``DIR/ca.key``; ``DIR`` is ``./kiln-ca`` unless ``--dir``
says otherwise); ``kiln certs issue controller|agent|operator`` signs a
certificate with it into ``DIR/<kind>-<name>.pem`` and ``.key`` (or
``--out PREFIX``). Keys are made 0600; nothing is replaced without
``--force``. The certificates are built by ``kiln_common.fleet_ca``, imported
only when a command runs (``kiln --help`` loads no cryptography), and so are
the controller's role names and name rules.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.cli.client import CliError
from controller.cli.output import emit

if TYPE_CHECKING:
    from kiln_common.fleet_ca import Issued, Leaf

DEFAULT_DIR = Path("kiln-ca")
CA_NAME = "Kiln fleet CA"
CA_DAYS = 3650
LEAF_DAYS = 365
CONTROLLER_HOSTS = ("localhost", "127.0.0.1")
CONTROLLER_NAME = "kiln-controller"  # when the first --san cannot name the files
EXIT_USAGE = 2


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if days < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return days


def register(subparsers: Any) -> None:
    """Add ``kiln certs init`` and ``kiln certs issue …``."""
    certs = subparsers.add_parser(
        "certs", help="a fleet CA, and certificates for the controller, agents and operators"
    )
    sub = certs.add_subparsers(dest="certs_command", metavar="COMMAND", required=True)

    p = sub.add_parser("init", help="make the fleet CA: DIR/ca.pem and DIR/ca.key (0600)")
    _dir_option(p)
    p.add_argument("--name", default=CA_NAME, help=f"the CA's common name (default: {CA_NAME})")
    _days_option(p, CA_DAYS)
    p.add_argument("--force", action="store_true", help="replace the CA in DIR")
    p.set_defaults(func=cmd_init)

    issue = sub.add_parser("issue", help="sign a certificate and key with the fleet CA")
    kinds = issue.add_subparsers(dest="certs_kind", metavar="KIND", required=True)

    p = kinds.add_parser("controller", help="the controller's server certificate")
    p.add_argument(
        "name",
        nargs="?",
        default=None,
        help="its common name and file name (default: the first --san)",
    )
    p.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="DNS_OR_IP",
        help="a name or address clients dial it by (repeatable; "
        f"default: {' and '.join(CONTROLLER_HOSTS)})",
    )
    _issue_options(p)
    p.set_defaults(func=cmd_issue_controller)

    p = kinds.add_parser("agent", help="an agent's client certificate, for its node only")
    p.add_argument("node", help="the node it may register (its CN and DNS name)")
    _issue_options(p)
    p.set_defaults(func=cmd_issue_agent)

    p = kinds.add_parser("operator", help="a person's or pipeline's client certificate")
    p.add_argument("name", help="who holds it (its CN; the audit log names it)")
    p.add_argument(
        "--role",
        required=True,
        help="the role it carries: any role but agent (the roles of kiln tokens create)",
    )
    _issue_options(p)
    p.set_defaults(func=cmd_issue_operator)


def _dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        metavar="DIR",
        help=f"the CA's directory (default: ./{DEFAULT_DIR})",
    )


def _days_option(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument(
        "--days", type=_days, default=default, metavar="N", help=f"valid for N days ({default})"
    )


def _issue_options(parser: argparse.ArgumentParser) -> None:
    _dir_option(parser)
    _days_option(parser, LEAF_DAYS)
    parser.add_argument(
        "--out",
        default=None,
        metavar="PREFIX",
        help="write PREFIX.pem and PREFIX.key (default: DIR/<kind>-<name>)",
    )
    parser.add_argument("--force", action="store_true", help="replace files already there")


def _usage(message: str) -> CliError:
    return CliError(message, exit_code=EXIT_USAGE)


def _check_name(kind: str, name: str) -> None:
    """A node's rules (``controller.core.nodes.validate_name``) for every name
    that becomes a file name."""
    from controller.core.errors import InvalidArgument
    from controller.core.nodes import validate_name

    try:
        validate_name(kind, name)
    except InvalidArgument as e:
        raise _usage(str(e)) from None


def _outputs(args: argparse.Namespace, kind: str, name: str) -> tuple[Path, Path]:
    if args.out is None:
        stem = Path(args.dir) / f"{kind}-{name}"
    else:
        stem = Path(args.out)
        if args.out.endswith(("/", "\\")) or stem.is_dir():
            raise _usage(f"--out takes a path prefix such as {stem / name}, not a directory")
    return stem.with_name(stem.name + ".pem"), stem.with_name(stem.name + ".key")


def _written(args: argparse.Namespace, issued: Issued, what: str) -> None:
    expires = f"{issued.not_after:%Y-%m-%dT%H:%M:%SZ}"
    if args.output == "json":
        emit(
            json.dumps(
                {
                    "cert": str(issued.cert),
                    "key": str(issued.key),
                    "subject": issued.subject,
                    "names": list(issued.names),
                    "not_after": expires,
                },
                indent=2,
            )
        )
        return
    names = f", {', '.join(issued.names)}" if issued.names else ""
    emit(
        f"wrote {issued.cert} and its key {issued.key} (0600): {what} {issued.subject}{names}; "
        f"expires {expires}"
    )


def cmd_init(args: argparse.Namespace) -> int:
    from kiln_common import fleet_ca

    try:
        issued = fleet_ca.init_ca(Path(args.dir), args.name, args.days, replace=args.force)
    except fleet_ca.CaExists as e:
        raise CliError(
            f"{e}; --force replaces it, and the controller then trusts no certificate "
            "the old CA signed"
        ) from None
    except fleet_ca.InvalidValue as e:
        raise _usage(str(e)) from None
    except OSError as e:
        raise CliError(_os_message(e, args.dir)) from None
    _written(args, issued, "the fleet CA")
    if args.output != "json":
        emit(
            f"give {issued.cert} to the controller (--tls-client-ca) and to its clients "
            f"(--tls-ca); keep {issued.key} off the fleet"
        )
    return 0


def _issue(args: argparse.Namespace, kind: str, name: str, leaf: Leaf, what: str) -> int:
    from kiln_common import fleet_ca

    cert, key = _outputs(args, kind, name)
    try:
        ca = fleet_ca.load_ca(Path(args.dir))
        issued = ca.issue(leaf, cert, key, args.days, replace=args.force)
    except fleet_ca.CaMissing as e:
        raise CliError(f"{e}; make one with: kiln certs init --dir {args.dir}") from None
    except fleet_ca.FilesExist as e:
        raise CliError(f"{e}; --force replaces them") from None
    except fleet_ca.InvalidValue as e:
        raise _usage(str(e)) from None
    except fleet_ca.FleetCaError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(_os_message(e, cert)) from None
    _written(args, issued, what)
    return 0


def _os_message(error: OSError, fallback: Path | str) -> str:
    return f"cannot write {error.filename or fallback}: {error.strerror or error}"


def cmd_issue_controller(args: argparse.Namespace) -> int:
    from kiln_common import fleet_ca

    hosts = list(dict.fromkeys(args.san)) or list(CONTROLLER_HOSTS)
    name = args.name
    if name is None:
        name = hosts[0] if _is_name(hosts[0]) else CONTROLLER_NAME
    _check_name("controller", name)
    try:
        leaf = fleet_ca.controller_leaf(name, hosts)
    except fleet_ca.InvalidValue as e:
        raise _usage(str(e)) from None
    return _issue(args, "controller", name, leaf, "controller (serverAuth)")


def _is_name(text: str) -> bool:
    try:
        _check_name("controller", text)
    except CliError:
        return False
    return True


def cmd_issue_agent(args: argparse.Namespace) -> int:
    from kiln_common import fleet_ca

    _check_name("node", args.node)
    return _issue(args, "agent", args.node, fleet_ca.agent_leaf(args.node), "agent (clientAuth)")


def cmd_issue_operator(args: argparse.Namespace) -> int:
    from controller.core.identity import OPERATOR_ROLES, Role
    from kiln_common import fleet_ca

    _check_name("operator", args.name)
    roles = [str(role) for role in OPERATOR_ROLES]
    if args.role == Role.AGENT:
        raise _usage("an agent's certificate carries no role: kiln certs issue agent NODE")
    if args.role not in roles:
        raise _usage(
            f"--role {args.role[:64]!r} is no role: use {', '.join(roles[:-1])} or {roles[-1]}"
        )
    leaf = fleet_ca.operator_leaf(args.name, args.role)
    return _issue(args, "operator", args.name, leaf, f"{args.role} (clientAuth)")
