"""The handlers an interceptor wrapped, kept by method.

gRPC asks each interceptor for a method's handler on every call. Wrapping it
(closures and a new ``RpcMethodHandler``) on every call is a measurable share
of a small call's cost, so an interceptor keeps what it built for a method
and hands it out again while the handler it wraps is the same object (the
services' handlers are built once, at start). At most one entry per method
Kiln serves.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc


class HandlerCache:
    def __init__(self) -> None:
        self._by_method: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrapped(
        self,
        method: str,
        inner: grpc.RpcMethodHandler,
        wrap: Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler],
    ) -> grpc.RpcMethodHandler:
        """``wrap(inner)``, built once for ``method`` while ``inner`` stays."""
        kept = self._by_method.get(method)
        if kept is not None and kept[0] is inner:
            return kept[1]
        built = wrap(inner)
        self._by_method[method] = (inner, built)
        return built

    def clear(self) -> None:
        self._by_method.clear()
