"""The CLI's connection to the controller and its error vocabulary.

A ``Session`` is what every command handler works with: a synchronous
FleetService stub on one channel (plaintext, or TLS when any of
``--tls-ca``/``--tls-cert``/``--tls-key`` is given), the per-call deadline and
the output format, all taken from the global options. ``CliError`` is the one
exception a handler raises for a local failure (a missing password file, a
wait that timed out); ``main`` prints it as ``kiln: error: <message>``.

grpc and the generated stubs are imported when a command dials (``connect``),
not with this module, so that ``kiln --help`` and usage errors start fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import grpc

logger = logging.getLogger(__name__)

DEFAULT_CONTROLLER = "127.0.0.1:50051"
CONTROLLER_ENV = "KILN_CONTROLLER"
TLS_CA_ENV = "KILN_TLS_CA"
TLS_CERT_ENV = "KILN_TLS_CERT"
TLS_KEY_ENV = "KILN_TLS_KEY"
TOKEN_ENV = "KILN_TOKEN"
CONFIG_ENV = "KILN_CONFIG"


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
    tls: bool = False

    @property
    def json(self) -> bool:
        return self.output == "json"


@contextmanager
def connect(args: argparse.Namespace) -> Iterator[Session]:
    """Open a channel to ``args.controller`` for the life of the ``with`` block.

    Never blocks: the channel connects lazily on the first call, which then
    fails fast with UNAVAILABLE if nothing listens there. Raises CliError
    (exit 2) when the TLS options are incomplete or name unreadable files.
    """
    import grpc

    from kiln.v1 import fleet_pb2_grpc

    target: str = args.controller
    timeout = args.timeout if args.timeout and args.timeout > 0 else None
    credentials = tls_credentials(args)
    token = bearer_token(args)
    logger.debug(
        "connecting to controller at %s (%s)", target, "TLS" if credentials else "plaintext"
    )
    if credentials is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(target, credentials)
    if token is not None:
        channel = grpc.intercept_channel(channel, _bearer_interceptor(token))
    try:
        yield Session(
            stub=fleet_pb2_grpc.FleetServiceStub(channel),
            target=target,
            timeout=timeout,
            output=args.output,
            verbose=args.verbose,
            tls=credentials is not None,
        )
    finally:
        channel.close()


def config_path() -> Path:
    """``$KILN_CONFIG``, else ``$XDG_CONFIG_HOME/kiln/config.toml`` (``~/.config``)."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kiln" / "config.toml"


def _configured_token_file() -> Path | None:
    """The ``token_file`` the config file names (relative to the file), if any.

    Raises CliError (exit 2) for a config file that is not TOML or whose
    ``token_file`` is not a string.
    """
    path = config_path()
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise CliError(f"cannot read config file {path}: {type(e).__name__}", exit_code=2) from None
    value = doc.get("token_file")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise CliError(f"config file {path}: token_file must be a file name", exit_code=2)
    return path.parent / Path(value).expanduser()


def bearer_token(args: argparse.Namespace) -> str | None:
    """The token to send: ``--token-file``, else ``$KILN_TOKEN``, else the config
    file's ``token_file``; None when none is set (a controller on loopback).

    Raises CliError (exit 2) for a token file that cannot be read; the
    message names the file, never its content.
    """
    from kiln_common.tokens import TokenFileError, read_token_file

    path = getattr(args, "token_file", None)
    if path is None:
        env = os.environ.get(TOKEN_ENV, "").strip()
        if env:
            return env
        path = _configured_token_file()
    if path is None:
        return None
    try:
        return read_token_file(path)
    except TokenFileError as e:
        raise CliError(str(e), exit_code=2) from None


def _bearer_interceptor(token: str) -> Any:
    """A client interceptor that adds ``authorization: Bearer TOKEN`` to every call."""
    import collections

    import grpc

    from kiln_common.tokens import bearer_metadata

    extra = bearer_metadata(token)

    class CallDetails(
        collections.namedtuple(
            "CallDetails",
            ["method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"],
        ),
        grpc.ClientCallDetails,
    ):
        pass

    class Bearer(
        grpc.UnaryUnaryClientInterceptor,
        grpc.UnaryStreamClientInterceptor,
        grpc.StreamUnaryClientInterceptor,
        grpc.StreamStreamClientInterceptor,
    ):
        def _details(self, details: Any) -> Any:
            return CallDetails(
                details.method,
                details.timeout,
                (*(details.metadata or ()), *extra),
                details.credentials,
                getattr(details, "wait_for_ready", None),
                getattr(details, "compression", None),
            )

        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._details(details), request)

        def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._details(details), request)

        def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
            return continuation(self._details(details), requests)

        def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
            return continuation(self._details(details), requests)

    return Bearer()


def uses_tls(args: argparse.Namespace) -> bool:
    """Whether any TLS option (or its environment variable) is set."""
    return any(getattr(args, name, None) for name in ("tls_ca", "tls_cert", "tls_key"))


def tls_credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """The channel credentials the TLS options ask for; None for plaintext."""
    from kiln_common.tls import TlsFileError, channel_credentials  # imports grpc

    try:
        return channel_credentials(
            getattr(args, "tls_ca", None),
            getattr(args, "tls_cert", None),
            getattr(args, "tls_key", None),
        )
    except TlsFileError as e:
        raise CliError(str(e), exit_code=2) from e


# OpenSSL's reason, e.g. CERTIFICATE_VERIFY_FAILED, in grpc-core's handshake error.
_TLS_REASON = re.compile(r"OPENSSL_internal:([A-Z0-9_]+)")

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


def is_rpc_error(err: BaseException) -> TypeGuard[grpc.RpcError]:
    """Whether ``err`` is a failed gRPC call."""
    import grpc

    return isinstance(err, grpc.RpcError)


def rpc_error_message(err: grpc.RpcError, target: str, verbose: int = 0, tls: bool = False) -> str:
    """The one-line explanation of a failed call, without the ``kiln: error:`` prefix.

    A controller that cannot be reached reads
    ``cannot reach controller at HOST:PORT (UNAVAILABLE)``; over TLS (``tls``)
    a failed handshake reads ``TLS handshake with controller at HOST:PORT
    failed (REASON)``; anything the controller said reads
    ``<CODE_NAME>: <details>``.
    """
    import grpc

    code = _code(err)
    details = _details(err)
    name = code.name if code is not None else "UNKNOWN"
    if code is grpc.StatusCode.UNAVAILABLE and _is_connect_failure(details):
        if tls:
            message = _tls_failure(details, target)
        else:
            message = f"cannot reach controller at {target} (UNAVAILABLE)"
        return f"{message}: {details}" if verbose else message
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and details.lower() == "deadline exceeded":
        return f"DEADLINE_EXCEEDED: no answer from controller at {target} in time"
    return f"{name}: {details}" if details else name


def _tls_failure(details: str, target: str) -> str:
    hint = "check --tls-ca, --tls-cert and --tls-key"
    if "handshake" in details.lower():
        reason = _TLS_REASON.search(details)
        why = f" ({reason.group(1)})" if reason else ""
        return f"TLS handshake with controller at {target} failed{why}; {hint}"
    if "socket closed" in details.lower() or "connection reset" in details.lower():
        # The controller hung up during the handshake: most often it wants a
        # client certificate this CLI did not send, or serves plaintext.
        return (
            f"cannot reach controller at {target} over TLS (UNAVAILABLE): it closed the "
            f"connection; it may want a client certificate or serve plaintext; {hint}"
        )
    return f"cannot reach controller at {target} over TLS (UNAVAILABLE); {hint}"


def _is_connect_failure(details: str) -> bool:
    return details.lower().startswith(_CONNECT_FAILURES)


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    import grpc

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
