"""The CLI's connection to the controller and its error vocabulary.

A ``Session`` is what every command handler works with: a synchronous
FleetService stub on one insecure channel, the per-call deadline and the
output format, all taken from the global options. ``CliError`` is the one
exception a handler raises for a local failure (a missing password file, a
wait that timed out); ``main`` prints it as ``kiln: error: <message>``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from kiln.v1 import fleet_pb2_grpc

logger = logging.getLogger(__name__)

DEFAULT_CONTROLLER = "127.0.0.1:50051"
CONTROLLER_ENV = "KILN_CONTROLLER"


class CliError(Exception):
    """A failure the CLI detected itself; ``str(err)`` is the whole message.

    ``exit_code`` is what ``main`` returns (1 unless a handler says otherwise).
    Messages never contain secrets.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Session:
    """One connected CLI invocation.

    ``stub`` is a ``FleetServiceStub``; ``timeout`` is the deadline in seconds
    for each unary call (``None``: no deadline); ``output`` is ``"table"`` or
    ``"json"``; ``target`` is the controller address, for messages.
    """

    stub: Any
    target: str
    timeout: float | None
    output: str
    verbose: int = 0

    @property
    def json(self) -> bool:
        return self.output == "json"


@contextmanager
def connect(args: argparse.Namespace) -> Iterator[Session]:
    """Open a channel to ``args.controller`` for the life of the ``with`` block.

    Never blocks: the channel connects lazily on the first call, which then
    fails fast with UNAVAILABLE if nothing listens there.
    """
    target: str = args.controller
    timeout = args.timeout if args.timeout and args.timeout > 0 else None
    logger.debug("connecting to controller at %s", target)
    channel = grpc.insecure_channel(target)
    try:
        yield Session(
            stub=fleet_pb2_grpc.FleetServiceStub(channel),
            target=target,
            timeout=timeout,
            output=args.output,
            verbose=args.verbose,
        )
    finally:
        channel.close()


# How grpc-core's own messages start when the client never reached the peer or
# lost it mid-call, as opposed to a controller that answered UNAVAILABLE on
# purpose (Kiln's messages for that start with "BMC ..." and the like).
_CONNECT_FAILURES = (
    "failed to connect to all addresses",
    "dns resolution failed",
    "connections to all backends failing",
    "empty address list",
    "socket closed",
    "recvmsg:",
    "sendmsg:",
    "connection reset",
)


def rpc_error_message(err: grpc.RpcError, target: str, verbose: int = 0) -> str:
    """The one-line explanation of a failed call, without the ``kiln: error:`` prefix.

    A controller that cannot be reached reads
    ``cannot reach controller at HOST:PORT (UNAVAILABLE)``; anything the
    controller said reads ``<CODE_NAME>: <details>``.
    """
    code = _code(err)
    details = _details(err)
    name = code.name if code is not None else "UNKNOWN"
    if code is grpc.StatusCode.UNAVAILABLE and _is_connect_failure(details):
        message = f"cannot reach controller at {target} (UNAVAILABLE)"
        return f"{message}: {details}" if verbose else message
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and details.lower() == "deadline exceeded":
        return f"DEADLINE_EXCEEDED: no answer from controller at {target} in time"
    return f"{name}: {details}" if details else name


def _is_connect_failure(details: str) -> bool:
    return details.lower().startswith(_CONNECT_FAILURES)


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(err, "code", None)
    if not callable(code):
        return None
    value = code()
    return value if isinstance(value, grpc.StatusCode) else None


def _details(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    if not callable(details):
        return ""
    value = details()
    return " ".join(str(value).split()) if value else ""
