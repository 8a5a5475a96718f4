"""The one place where domain errors become gRPC status codes."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from controller.core import errors

log = logging.getLogger(__name__)

# Most specific first: the first matching class wins.
STATUS_FOR: tuple[tuple[type[errors.KilnError], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.BmcAuthenticationFailed, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.BmcError, grpc.StatusCode.UNAVAILABLE),
)


def status_for(error: errors.KilnError) -> grpc.StatusCode:
    for kind, code in STATUS_FOR:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


MAX_MESSAGE = 1024  # characters of an error message sent back


def message_for(error: errors.KilnError) -> str:
    """The error's message, cut short: a message never echoes unbounded input
    (a 10 KB name must not come back as 10 KB of status detail)."""
    text = str(error)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


R = TypeVar("R")


def unary(
    method: Callable[..., Awaitable[R]],
) -> Callable[..., Awaitable[R]]:
    """Wrap a unary servicer method: KilnError → its status; anything else → INTERNAL."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await method(self, request, context)
        except errors.KilnError as e:
            await context.abort(status_for(e), message_for(e))
        except Exception:
            log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method.__name__}")
        raise AssertionError("unreachable")  # context.abort always raises

    return wrapper


def streaming(
    method: Callable[..., AsyncIterator[R]],
) -> Callable[..., AsyncIterator[R]]:
    """The same mapping for server-streaming methods."""

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[R]:
        try:
            async for item in method(self, request, context):
                yield item
        except errors.KilnError as e:
            await context.abort(status_for(e), message_for(e))
        except Exception:
            log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method.__name__}")

    return wrapper
