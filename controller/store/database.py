"""Runs transactions off the event loop.

Every unit of work is a plain function of a Session that runs inside one
transaction on a dedicated worker thread, so the asyncio services never block
on the database and SQLite sees one writer at a time. Events written by the
unit of work commit with it (the outbox), and only then are listeners told.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.engine import Engine
from sqlmodel import Session

T = TypeVar("T")


class Database:
    """An engine plus the single thread that talks to it."""

    def __init__(self, engine: Engine, *, workers: int = 1) -> None:
        self.engine = engine
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="kiln-db"
        )
        self._listeners: list[Callable[[], None]] = []

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the event loop) after every committed write."""
        self._listeners.append(listener)

    def _run(self, fn: Callable[[Session], T]) -> T:
        with Session(self.engine, expire_on_commit=False) as session:
            result = fn(session)
            session.commit()
            return result

    async def tx(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)`` in one transaction; commit when it returns.

        Raises whatever ``fn`` raises, after rolling the transaction back.
        """
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._pool, self._run, fn)
        for listener in self._listeners:
            listener()
        return result

    async def read(self, fn: Callable[[Session], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._run, fn)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.engine.dispose()
