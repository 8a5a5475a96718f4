"""A link to a child process: a socket pair carrying length-prefixed frames.

The controller's helper processes (the agent relay workers,
``controller/api/relay/``; the BMC readers, ``controller/bmc/reader/``) each
get one end of a socket pair the controller creates, so nothing else can
write to it. A frame is a 4-byte big-endian length and a ``marshal``-encoded
tuple of plain values (ints, floats, strings, bytes, tuples, lists, dicts),
tagged by an int: no objects, no code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import os
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any

MAX_FRAME = 256 * 1024 * 1024
_LENGTH = struct.Struct(">I")
END_GRACE_S = 5.0  # a child asked to stop gets this long before SIGKILL
RESTART_PAUSE_S = 1.0
RESTART_PAUSE_MAX_S = 30.0

log = logging.getLogger(__name__)


class FrameError(Exception):
    """The other side sent something that is not a frame."""


def encode(frame: tuple[Any, ...]) -> bytes:
    body = marshal.dumps(frame)
    return _LENGTH.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next frame; None at the end of the stream."""
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError("the link ended inside a frame's length") from None
        return None
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME:
        raise FrameError(f"a frame of {length} bytes is over the limit")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise FrameError("the link ended inside a frame") from None
    try:
        frame = marshal.loads(body)
    except (EOFError, ValueError, TypeError) as e:
        raise FrameError("a frame does not decode") from e
    if not isinstance(frame, tuple) or not frame or not isinstance(frame[0], int):
        raise FrameError("a frame is not a tagged tuple")
    return frame


Link = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def start_child(
    module: str, args: Sequence[str], *, more_links: Sequence[str] = ()
) -> tuple[asyncio.subprocess.Process, list[Link]]:
    """Start ``python -m module --link-fd FD *args`` with the other end of a
    new socket pair; returns the process and this end as a stream pair, in
    a list. ``more_links``: flags for further socket pairs, each passed as
    ``FLAG FD`` (links of their own, so that what one carries never waits
    behind the other's); their ends follow the first in the list."""
    flags = ("--link-fd", *more_links)
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in flags]
    theirs = [pair[1] for pair in pairs]
    passed = [
        part for flag, end in zip(flags, theirs, strict=True) for part in (flag, str(end.fileno()))
    ]
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *passed,
            *args,
            pass_fds=tuple(end.fileno() for end in theirs),
            stdin=asyncio.subprocess.DEVNULL,
        )
    except BaseException:
        for ours, _ in pairs:
            ours.close()
        raise
    finally:
        for end in theirs:
            end.close()
    links = [await asyncio.open_unix_connection(sock=ours) for ours, _ in pairs]
    return process, links


def cpu_seconds(pid: int) -> float | None:
    """The CPU (user and system seconds) process ``pid`` has used so far,
    from ``/proc``; None where it cannot be read (gone, or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # After the command's closing parenthesis: the fields from the state
    # (the third) on; utime and stime are the 14th and 15th, in clock ticks.
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None


async def end_child(process: asyncio.subprocess.Process | None, grace: float = END_GRACE_S) -> None:
    """SIGTERM ``process``, then SIGKILL after ``grace`` seconds. Safe on None
    and on a process that already exited."""
    if process is None or process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(grace):
            await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def open_link(fd: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The child's end of its link, from the inherited descriptor."""
    sock = socket.socket(fileno=fd)
    return await asyncio.open_unix_connection(sock=sock)


class RestartPause:
    """The pause before a child that ended is started again: 1 s, doubling
    up to 30 s while it keeps failing, and 1 s again once one has served."""

    def __init__(self, first: float = RESTART_PAUSE_S, most: float = RESTART_PAUSE_MAX_S) -> None:
        self.first = first
        self.most = most
        self.next = first

    def served(self) -> None:
        self.next = self.first

    async def wait(self, what: str) -> None:
        """Say that ``what`` ended and wait the pause."""
        log.warning("%s ended; starting it again in %.0fs", what, self.next)
        await asyncio.sleep(self.next)
        self.next = min(self.next * 2, self.most)


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end; the list is emptied."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    tasks.clear()
