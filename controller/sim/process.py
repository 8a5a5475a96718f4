"""Stopping the simulated peers' processes."""

from __future__ import annotations

import asyncio
import contextlib


async def terminate(proc: asyncio.subprocess.Process | None, grace: float = 5.0) -> None:
    """SIGTERM ``proc``, then SIGKILL after ``grace`` seconds. Safe on None and
    on a process that already exited."""
    if proc is None or proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
