"""Stopping the simulated peers' processes."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from typing import Any, Self

from controller.link import end_child as terminate

__all__ = ["ProcessPeer", "terminate"]


class ProcessPeer:
    """What the simulated peers run as one subprocess share: a work directory
    (made for them unless given), a log file, stop, and ``async with``."""

    workdir: Path | None
    _workdir_given: Path | None
    _proc: asyncio.subprocess.Process | None
    _log: Any

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop the process and remove a work directory made for it. Idempotent."""
        proc, self._proc = self._proc, None
        await terminate(proc)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._workdir_given is None and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            await self.stop()
