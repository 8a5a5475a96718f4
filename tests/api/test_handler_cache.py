"""An interceptor's wrapped handlers are built once per method and rebuilt
when the handler they wrap changes."""

from __future__ import annotations

import grpc
import pytest

from controller.api.handler_cache import HandlerCache


async def _echo(request: bytes, context: object) -> bytes:
    return request


@pytest.mark.timeout(10)
def test_one_wrapping_per_method_while_its_handler_stays() -> None:
    cache = HandlerCache()
    built: list[str] = []

    def wrap(inner: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        built.append("x")
        return grpc.unary_unary_rpc_method_handler(inner.unary_unary)

    first = grpc.unary_unary_rpc_method_handler(_echo)
    a = cache.wrapped("/kiln.v1.FleetService/GetNode", first, wrap)
    assert cache.wrapped("/kiln.v1.FleetService/GetNode", first, wrap) is a
    other = cache.wrapped("/kiln.v1.FleetService/ListNodes", first, wrap)
    assert other is not a
    assert len(built) == 2

    replaced = grpc.unary_unary_rpc_method_handler(_echo)
    b = cache.wrapped("/kiln.v1.FleetService/GetNode", replaced, wrap)
    assert b is not a and len(built) == 3
    cache.clear()
    assert cache.wrapped("/kiln.v1.FleetService/GetNode", replaced, wrap) is not b
