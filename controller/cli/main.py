"""``kiln``: the operator CLI, a synchronous gRPC client of FleetService.

Contract:

- ``main(argv)`` returns the exit code and never raises (tests call it
  in-process): 0 on success, 2 for a usage error, 1 for anything else; 130
  when interrupted (``events watch`` exits 0 on Ctrl-C).
- A failure is one line on stderr, ``kiln: error: <CODE_NAME>: <details>``
  or ``kiln: error: cannot reach controller at HOST:PORT (UNAVAILABLE)``;
  never a traceback.
- Each command module exposes ``register(subparsers)``; each leaf parser sets
  ``func``, a callable taking the parsed ``argparse.Namespace`` and returning
  an exit code. The global options (``--controller``, ``-o``, ``--timeout``,
  ``-v``, ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--token-file``) are
  accepted before the command and after it.
- Plug-ins (``_PLUGINS``): commands whose module is imported only when the
  command is chosen, because ``controller.cli.demo`` starts a whole
  controller. ``kiln --help`` lists them from their entry alone; ``kiln demo
  …`` imports the module and calls its ``register(subparsers)``, the same
  way. A plug-in whose module is not installed is left out. Nothing else here
  imports server code, and grpc is imported only when a command dials, so
  ``kiln --help`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# grpc-core writes some failures (a refused TLS handshake, say) to stderr
# itself; the CLI reports every failure in one line of its own. It reads
# GRPC_VERBOSITY once, when grpc is first imported (when a command dials),
# hence here, first; an operator's own setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from controller.cli.client import (
    CONTROLLER_ENV,
    DEFAULT_CONTROLLER,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    CliError,
    is_rpc_error,
    rpc_error_message,
    uses_tls,
)
from controller.cli.output import terminal_safe
from controller.cli.parser import KilnParser

logger = logging.getLogger(__name__)

PROG = "kiln"
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Plugin:
    """A command added by ``module``'s ``register(subparsers)``, imported only when chosen.

    ``help`` is the line ``kiln --help`` shows for ``command`` without importing
    ``module``; it must match the ``help`` the module's parser is added with.
    """

    command: str
    module: str
    help: str


# Every command, in ``kiln --help`` order. Each module is imported only when
# one of its commands is chosen (``kiln nodes list`` loads the nodes module
# alone), so start-up pays for one command, not all of them.
_PLUGINS: tuple[Plugin, ...] = (
    Plugin("nodes", "controller.cli.nodes", "list, inspect, enroll and power nodes"),
    Plugin("racks", "controller.cli.racks", "NVLink racks and their nodes"),
    Plugin("topology", "controller.cli.racks", "export the fleet's topology"),
    Plugin("alloc", "controller.cli.alloc", "allocate, inspect and release nodes"),
    Plugin("events", "controller.cli.events", "watch the event stream"),
    Plugin("sim", "controller.cli.sim", "simulated fleets: inject faults"),
    Plugin("tokens", "controller.cli.access", "create, list and revoke bearer tokens (admin)"),
    Plugin("whoami", "controller.cli.access", "who the controller takes you for, and your role"),
    Plugin("audit", "controller.cli.access", "the audit log of calls (admin)"),
    Plugin(
        "certs",
        "controller.cli.certs",
        "a fleet CA, and certificates for the controller, agents and operators",
    ),
    Plugin("completion", "controller.cli.completion", "print a shell completion script (bash/zsh)"),
    Plugin("demo", "controller.cli.demo", "run a simulated fleet end to end"),
)


def _timeout(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (no deadline) or more")
    return value


def _no_token(_text: str) -> None:
    raise argparse.ArgumentTypeError(
        "kiln never takes a token on the command line (it would stay in your shell "
        "history and the process list); use $KILN_TOKEN, --token-file or the config file"
    )


def _add_global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes; ``suppress``: leave unset unless given here.

    An option whose name ``parser`` already defines (a plug-in's own
    ``--timeout``, say) is left to that parser.
    """

    def add(*flags: str, default: Any, **kwargs: Any) -> None:
        if any(flag in parser._option_string_actions for flag in flags):
            return
        parser.add_argument(*flags, default=argparse.SUPPRESS if suppress else default, **kwargs)

    add(
        "--controller",
        metavar="HOST:PORT",
        default=os.environ.get(CONTROLLER_ENV) or DEFAULT_CONTROLLER,
        help=f"controller address (default: ${CONTROLLER_ENV} or {DEFAULT_CONTROLLER})",
    )
    add(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="table for people, json (the API's messages) for scripts",
    )
    add(
        "--timeout",
        type=_timeout,
        default=30.0,
        metavar="SECONDS",
        help="deadline for each call (default 30; 0: none)",
    )
    add("-v", "--verbose", action="count", default=0, help="log what the CLI does")
    for flag, env, what in (
        ("--tls-ca", TLS_CA_ENV, "CA that signed the controller's certificate"),
        ("--tls-cert", TLS_CERT_ENV, "client certificate for mutual TLS"),
        ("--tls-key", TLS_KEY_ENV, "the client certificate's private key"),
    ):
        add(
            flag,
            type=Path,
            metavar="FILE",
            default=Path(os.environ[env]) if os.environ.get(env) else None,
            help=f"{what} (PEM; default: ${env}); any TLS option dials TLS",
        )
    add(
        "--token-file",
        type=Path,
        metavar="FILE",
        default=None,
        help="file holding your bearer token (default: $KILN_TOKEN, else the token_file "
        "of ~/.config/kiln/config.toml); never give a token on the command line",
    )
    # Said exactly, --token would otherwise abbreviate --token-file; it is refused
    # without echoing what followed it.
    add("--token", type=_no_token, default=None, help=argparse.SUPPRESS)


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``kiln`` argument parser: whole by default (every command loaded).

    With ``load``, only the commands named are imported and registered in
    full; every other one gets a placeholder with its help line and no
    options, which accepts anything (``parse_known_args`` hands it back) so
    that ``main`` can tell which command was chosen before importing it.
    """
    if load is None:
        load = {p.command for p in _PLUGINS}
    parser = KilnParser(prog=PROG, description="Operate a Kiln GPU fleet through its controller.")
    _add_global_options(parser, suppress=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    placeholders: set[int] = set()
    loading = {p.module for p in _PLUGINS if p.command in load}
    registered: set[str] = set()
    for plugin in _PLUGINS:
        if not _installed(plugin.module):
            continue
        if plugin.module in loading:  # all of the module's commands, once
            if plugin.module not in registered:
                importlib.import_module(plugin.module).register(subparsers)
                registered.add(plugin.module)
        else:
            placeholder = subparsers.add_parser(plugin.command, help=plugin.help, add_help=False)
            placeholders.add(id(placeholder))
    for leaf in _leaf_parsers(parser):
        if id(leaf) not in placeholders:
            _add_global_options(leaf, suppress=True)
    return parser


def _installed(module: str) -> bool:
    """Whether plug-in ``module`` exists, found without importing it."""
    if module in sys.modules:  # already imported (find_spec refuses one without __spec__)
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``, importing a plug-in only when it is the chosen command.

    Exits (SystemExit) as ``parse_args`` does for ``--help`` and usage errors.
    """
    parser = build_parser(load=())
    chosen, _ = parser.parse_known_args(argv)
    if any(plugin.command == chosen.command for plugin in _PLUGINS):
        parser = build_parser(load={chosen.command})
    return parser.parse_args(argv)


def _leaf_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser under ``parser`` that has no subcommands of its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for child in action.choices.values():
                if id(child) in seen:  # aliases map several names to one parser
                    continue
                seen.add(id(child))
                has_sub = any(isinstance(a, argparse._SubParsersAction) for a in child._actions)
                if has_sub:
                    yield from _leaf_parsers(child)
                else:
                    yield child


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kiln`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    try:
        args = _parse(argv)
    except SystemExit as e:  # --help, or a usage error argparse already printed
        return _exit_code(e)
    _configure_logging(args.verbose)
    try:
        return int(args.func(args))
    except SystemExit as e:  # a handler's parser.error(): usage
        return _exit_code(e)
    except CliError as e:
        return _fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_FAILURE
    except OSError as e:
        return _fail(e.strerror or str(e))
    except ValueError as e:  # a value the API's message types refuse (out of range)
        return _fail(f"invalid value: {e}")
    except Exception as e:  # grpc.RpcError, named without importing grpc before a command dials
        if is_rpc_error(e):
            return _fail(rpc_error_message(e, args.controller, args.verbose, uses_tls(args)))
        raise


def _fail(message: str, code: int = EXIT_FAILURE) -> int:
    sys.stderr.write(f"{PROG}: error: {terminal_safe(message)}\n")
    return code


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    sys.stderr.write(f"{e.code}\n")
    return EXIT_USAGE


def _configure_logging(verbose: int) -> None:
    if verbose <= 0:
        return
    level = logging.DEBUG if verbose > 1 else logging.INFO
    logging.basicConfig(level=level, format=f"{PROG}: %(name)s: %(message)s")
    logging.getLogger("controller.cli").setLevel(level)


def _silence_stdout() -> None:
    """After a closed pipe (``kiln … | head``), stop Python's exit-time flush error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
