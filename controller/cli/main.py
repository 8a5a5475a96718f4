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
  ``-v``, ``--tls-ca``, ``--tls-cert``, ``--tls-key``) are accepted before the
  command and after it.
- Plug-ins: if the module ``controller.cli.demo`` exists, its
  ``register(subparsers)`` is called too, the same way.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# grpc-core writes some failures (a refused TLS handshake, say) to stderr
# itself; the CLI reports every failure in one line of its own. It reads
# GRPC_VERBOSITY once, when grpc is first imported, hence before the imports
# below; an operator's own setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc

from controller.cli import alloc, events, nodes, racks, sim
from controller.cli.client import (
    CONTROLLER_ENV,
    DEFAULT_CONTROLLER,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    CliError,
    rpc_error_message,
    uses_tls,
)

logger = logging.getLogger(__name__)

PROG = "kiln"
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_MODULES: tuple[ModuleType, ...] = (nodes, racks, alloc, events, sim)
_PLUGINS: tuple[str, ...] = ("controller.cli.demo",)


def _timeout(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (no deadline) or more")
    return value


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


def build_parser() -> argparse.ArgumentParser:
    """The whole ``kiln`` argument parser, plug-ins included."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Operate a Kiln GPU fleet through its controller."
    )
    _add_global_options(parser, suppress=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _MODULES:
        module.register(subparsers)
    for name in _PLUGINS:
        plugin = _load_plugin(name)
        if plugin is not None:
            plugin.register(subparsers)
    for leaf in _leaf_parsers(parser):
        _add_global_options(leaf, suppress=True)
    return parser


def _load_plugin(name: str) -> Any:
    """The plug-in module ``name``, or None when it is not installed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise


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
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error argparse already printed
        return _exit_code(e)
    _configure_logging(args.verbose)
    try:
        return int(args.func(args))
    except SystemExit as e:  # a handler's parser.error(): usage
        return _exit_code(e)
    except CliError as e:
        return _fail(str(e), e.exit_code)
    except grpc.RpcError as e:
        return _fail(rpc_error_message(e, args.controller, args.verbose, uses_tls(args)))
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


def _fail(message: str, code: int = EXIT_FAILURE) -> int:
    sys.stderr.write(f"{PROG}: error: {message}\n")
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
