"""Probes on a store for the view tests: reads counted, group commits sized."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from controller.core.ports import Store, Tx
from controller.store.sql_store import SqlStore

T = TypeVar("T")


class ReadCountingStore:
    """A store that counts the reads made through it."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads = 0

    async def read(self, fn: Callable[[Tx], T]) -> T:
        self.reads += 1
        return await self.inner.read(fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def group_sizes(store: SqlStore) -> list[int]:
    """The size of every group commit ``store`` runs from now on (appended
    to the list returned)."""
    sizes: list[int] = []
    run_group = store._run_group

    def counted(fns: list[Callable[[Tx], Any]]) -> Any:
        sizes.append(len(fns))
        return run_group(fns)

    store._run_group = counted  # type: ignore[method-assign]
    return sizes
