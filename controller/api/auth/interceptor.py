"""The one interceptor: every call of Kiln's services is identified, checked
against the role table, and — when it mutates or is refused — audited.

For each call of ``kiln.v1.FleetService`` or ``kiln.v1.AgentService``:

1. a simulation-only RPC on a controller not started with ``--simulation``
   answers UNIMPLEMENTED;
2. the caller is identified (``identity.identify``): UNAUTHENTICATED when
   authentication is on and the call has no usable credentials;
3. its role is checked against the RPC's row (``roles``): PERMISSION_DENIED
   naming the roles needed, also for an RPC without a row (default deny);
   with authentication off, every caller may call everything;
4. the servicer runs with ``current_caller()`` set;
5. a mutating call, or any call that ended UNAUTHENTICATED or
   PERMISSION_DENIED (here or in the servicer: an agent for another node, a
   provisioner releasing another's allocation), is stored as an
   ``audit.call`` event before the caller gets its answer. A mutating unary
   call's servicer may hand its "OK" entry (``current_audit()``) to the
   core, which writes it with the call's change; the call then ending OK
   needs no entry of its own.

Health and reflection are not Kiln's services and pass untouched, as do all
calls until the controller is active (a standby answers UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from controller.api.auth.arguments import audit_arguments
from controller.api.auth.call_audit import reset_audit, set_audit
from controller.api.auth.identity import identify, reset_caller, set_caller
from controller.api.auth.roles import (
    SIMULATION_ONLY,
    Rule,
    is_kiln_method,
    needed,
    rule_for,
    short_name,
)
from controller.api.errors import message_for
from controller.api.handler_cache import HandlerCache
from controller.core.audit import AuditEntry, CallAudit
from controller.core.errors import Unauthenticated
from controller.core.identity import Caller

if TYPE_CHECKING:
    from controller.core.fleet import Fleet

log = logging.getLogger(__name__)

REFUSALS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
MAX_DETAIL = 200
Ctx: TypeAlias = grpc.aio.ServicerContext


def on_loopback(listen: str) -> bool:
    """Whether HOST:PORT serves this machine only (127.0.0.0/8, ::1, localhost).

    An empty host, a wildcard or any other name is not: authentication is
    on by default there.
    """
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """``enabled``: authentication and the role table are enforced;
    ``simulation``: simulation-only RPCs are served; ``certificates``: the
    server asks clients for certificates (without it none is looked for).
    ``serve(fleet)`` once the controller is active."""

    def __init__(
        self, *, enabled: bool, simulation: bool = False, certificates: bool = True
    ) -> None:
        self.enabled = enabled
        self.simulation = simulation
        self.certificates = certificates  # the server asks clients for certificates (mTLS)
        self._fleet: Fleet | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._handlers = HandlerCache()

    def serve(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._handlers.clear()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if self._fleet is None or handler is None or not is_kiln_method(method):
            return handler
        if method in SIMULATION_ONLY and not self.simulation:
            return _unimplemented(
                handler,
                f"{short_name(method)} exists only on a controller started with --simulation",
            )
        fleet = self._fleet
        return self._handlers.wrapped(
            method, handler, lambda inner: _Guard(self, fleet, method).wrap(inner)
        )

    def keep(self, task: asyncio.Task[None]) -> None:
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)


class _Guard:
    """One RPC's checks and audit, wrapped around its handler."""

    def __init__(self, owner: AuthInterceptor, fleet: Fleet, method: str) -> None:
        self._owner = owner
        self._fleet = fleet
        self.method = method
        self.name = short_name(method)
        self.rule: Rule | None = rule_for(method)

    # -- checks ----------------------------------------------------------------

    async def admit(self, request: object, context: Ctx) -> Caller:
        """The caller, allowed to make this call; else audit and abort."""
        try:
            caller = await identify(
                context,
                self._fleet,
                enabled=self._owner.enabled,
                certificates=self._owner.certificates,
            )
        except Unauthenticated as e:
            await self._refuse(
                None, request, context, grpc.StatusCode.UNAUTHENTICATED, message_for(e)
            )
            raise AssertionError("unreachable") from None  # abort raised
        if self._owner.enabled:
            if self.rule is None:
                detail = f"{self.name} has no rule in the role table: nobody may call it"
                await self._refuse(
                    caller, request, context, grpc.StatusCode.PERMISSION_DENIED, detail
                )
            elif caller.role not in self.rule.roles:
                detail = (
                    f"{self.name} needs role {needed(self.rule)}; {caller.label} may not call it"
                )
                await self._refuse(
                    caller, request, context, grpc.StatusCode.PERMISSION_DENIED, detail
                )
        return caller

    async def _refuse(
        self,
        caller: Caller | None,
        request: object,
        context: Ctx,
        code: grpc.StatusCode,
        detail: str,
    ) -> None:
        await self._record(self._entry(caller, request, _peer(context), code, detail))
        await context.abort(code, detail)

    # -- audit ---------------------------------------------------------------

    def _audited(self, code: grpc.StatusCode) -> bool:
        return code in REFUSALS or (self.rule is not None and self.rule.mutating)

    async def finish(
        self,
        caller: Caller,
        request: object,
        context: Ctx,
        error: BaseException | None,
        peer: str,
        draft: CallAudit | None = None,
    ) -> None:
        """Audit the call's outcome, if it is one the log keeps (and its
        ``draft`` was not stored with its change). ``peer`` was read while
        the call was alive: a context read after a cancelled call is torn
        down crashes gRPC's aio server."""
        gone = isinstance(error, asyncio.CancelledError | GeneratorExit)
        if gone:
            code, detail = grpc.StatusCode.CANCELLED, "the caller went away"
        elif error is not None and not isinstance(error, grpc.aio.AbortError):
            code, detail = grpc.StatusCode.UNKNOWN, type(error).__name__
        else:
            code = context.code() or grpc.StatusCode.OK
            if not isinstance(code, grpc.StatusCode):
                code = grpc.StatusCode.UNKNOWN
            detail = context.details() or ""
        if not self._audited(code):
            return
        if draft is not None and draft.stored and code == grpc.StatusCode.OK:
            return  # stored with the call's change
        entry = self._entry(caller, request, peer, code, detail, draft)
        if gone:
            # The call is being torn down: store the entry from a task of its own.
            task = asyncio.create_task(self._record(entry))
            self._owner.keep(task)
            return
        await self._record(entry)

    def _entry(
        self,
        caller: Caller | None,
        request: object,
        peer: str,
        code: grpc.StatusCode,
        detail: str | bytes,
        draft: CallAudit | None = None,
    ) -> AuditEntry:
        """The call's entry; from its ``draft`` when there is one (its
        arguments already taken)."""
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        if len(detail) > MAX_DETAIL:
            detail = detail[: MAX_DETAIL - 1] + "…"
        if draft is not None:
            return dataclasses.replace(draft.entry, code=code.name, detail=detail)
        return AuditEntry(
            who=caller.name if caller else "-",
            role=str(caller.role) if caller else "-",
            via=str(caller.via) if caller else "-",
            subject=caller.subject if caller else "",
            method=self.name,
            arguments=audit_arguments(request),
            code=code.name,
            detail=detail,
            peer=peer,
        )

    def draft(self, caller: Caller, request: object, peer: str) -> CallAudit | None:
        """A mutating call's "OK" entry, for its servicer to store with its change."""
        if self.rule is None or not self.rule.mutating:
            return None
        return CallAudit(self._entry(caller, request, peer, grpc.StatusCode.OK, ""))

    async def _record(self, entry: AuditEntry) -> None:
        try:
            await self._fleet.record_audit(entry)
        except Exception:
            log.exception("could not store the audit entry of %s by %s", entry.method, entry.who)

    # -- wrapping ----------------------------------------------------------------

    def wrap(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        serdes = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary), **serdes)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream), **serdes
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(self._unary(handler.stream_unary), **serdes)
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream), **serdes
        )

    def _unary(self, inner: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, context: Ctx) -> Any:
            caller = await self.admit(request, context)
            peer = _peer(context)
            token = set_caller(caller)
            draft = self.draft(caller, request, peer)
            drafted = set_audit(draft)
            try:
                result = inner(request, context)
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as e:
                await self.finish(caller, request, context, e, peer, draft)
                raise
            finally:
                reset_audit(drafted)
                reset_caller(token)
            await self.finish(caller, request, context, None, peer, draft)
            return result

        return call

    def _streaming(self, inner: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
        async def call(request: Any, context: Ctx) -> AsyncIterator[Any]:
            caller = await self.admit(request, context)
            peer = _peer(context)
            token = set_caller(caller)
            try:
                produced = inner(request, context)
                if inspect.isawaitable(produced):  # a servicer that writes with context.write
                    await produced
                else:
                    async for item in produced:
                        yield item
            except BaseException as e:
                await self.finish(caller, request, context, e, peer)
                raise
            finally:
                reset_caller(token)
            await self.finish(caller, request, context, None, peer)

        return call


def _peer(context: Ctx) -> str:
    try:
        return str(context.peer())
    except Exception:  # a context without a transport (tests)
        return ""


def _unimplemented(handler: grpc.RpcMethodHandler, detail: str) -> grpc.RpcMethodHandler:
    async def refuse(_request: Any, context: Ctx) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, detail)

    serdes = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming or handler.response_streaming:
        make = {
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(handler.request_streaming, handler.response_streaming)]
        return make(refuse, **serdes)
    return grpc.unary_unary_rpc_method_handler(refuse, **serdes)
