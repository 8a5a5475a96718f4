"""Starts the BMC reader processes, keeps them running, sends them reads.

Each node is read by one reader, chosen by a stable hash of its name, so a
BMC's session, call slots and breaker live in one process. A reader that
exits or whose link fails is started again after a pause (doubling from
1 s up to 30 s while it keeps failing); its calls in flight fail with
``Unavailable`` (the power sync's pass is logged as failed and the next
one reads again; the leak watcher backs the node off), and until it is back
its nodes' reads are done in the controller (``available`` is False).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from controller.bmc.reader import wire
from controller.core.errors import InvalidArgument, Unavailable
from controller.core.model import BmcTarget, LeakReading
from controller.link import (
    FrameError,
    RestartPause,
    cancel_all,
    encode,
    end_child,
    read_frame,
    start_child,
)

log = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0
# A reader runs this many times the controller's --bmc-workers threads. Its
# threads mostly wait on BMC sockets and take nothing from the controller's
# event loop, and after a restart two passes meet every BMC at once: the leak
# watcher's first (every BMC asked for its detectors) and power sync's. At
# 10,000 BMCs answering in 1 s they keep about 350 calls in flight; on 256
# threads the power pass took 63 s (bench/bmc_power_sync.py --cold).
THREADS_PER_WORKER = 2
MODULE = "controller.bmc.reader.worker"


class _Link:
    """One running reader: its writer and its calls awaiting an answer."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count(1)

    def send(self, frame: tuple[Any, ...]) -> None:
        self.writer.write(encode(frame))

    async def call(self, tag: int, *args: Any) -> Any:
        ident = next(self.ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[ident] = answer
        try:
            self.send((tag, ident, *args))
            return await answer
        finally:
            self.waiting.pop(ident, None)

    def on_frame(self, frame: tuple[Any, ...]) -> None:
        tag = frame[0]
        if tag not in (wire.DONE, wire.ERROR):
            raise FrameError(f"unexpected frame {tag!r} from a BMC reader")
        answer = self.waiting.pop(frame[1], None)
        if answer is None or answer.done():
            return  # its caller gave up (cancelled)
        if tag == wire.DONE:
            answer.set_result(frame[2])
        else:
            answer.set_exception(wire.error_from(frame[2], frame[3]))

    def fail_all(self, reason: str) -> None:
        for answer in self.waiting.values():
            if not answer.done():
                answer.set_exception(Unavailable(reason))
        self.waiting.clear()


class BmcReaders:
    """``count`` reader processes, each with a pool of ``THREADS_PER_WORKER``
    times ``workers`` threads and ``call_timeout`` seconds per BMC call (as
    ``--bmc-workers`` and ``--bmc-call-timeout`` for the controller's own
    pool)."""

    def __init__(
        self, count: int, *, workers: int = 256, call_timeout: float = 10.0, verbose: bool = False
    ) -> None:
        if count < 1:
            raise InvalidArgument("--bmc-readers must be at least 1 to start readers")
        self.count = count
        threads = workers * THREADS_PER_WORKER
        self._args = ["--workers", str(threads), "--call-timeout", repr(call_timeout)]
        if verbose:
            self._args.append("--verbose")
        self._links: dict[int, _Link] = {}
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._all_up = asyncio.Event()  # every reader is up now
        self.restarts = 0
        self.calls = 0  # sent to the readers since the start

    # -- the processes -----------------------------------------------------------

    def start(self) -> None:
        """Start every reader in the background: until one is up, its nodes'
        reads are done in the controller."""
        for slot in range(self.count):
            self._tasks.append(
                asyncio.create_task(self._keep(slot), name=f"kiln-bmc-reader-{slot}")
            )

    async def wait_ready(self, timeout: float = START_TIMEOUT_S) -> bool:
        """True once every reader is up (False: not within ``timeout``)."""
        try:
            async with asyncio.timeout(timeout):
                await self._all_up.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        self._stopping = True
        await cancel_all(self._tasks)

    def pids(self) -> list[int]:
        """The readers' process ids, of those running now."""
        return [p.pid for p in self._processes.values() if p.returncode is None]

    def figures(self) -> dict[str, int]:
        """For the metrics: readers up, calls in flight, restarts."""
        return {
            "readers": len(self._links),
            "in_flight": sum(len(link.waiting) for link in self._links.values()),
            "restarts": self.restarts,
        }

    async def _keep(self, slot: int) -> None:
        pause = RestartPause()
        while not self._stopping:
            try:
                if await self._run_one(slot):
                    pause.served()
            except (OSError, FrameError) as e:
                log.error("BMC reader %d failed: %s", slot, e)
            if self._stopping:
                return
            self.restarts += 1
            await pause.wait(f"BMC reader {slot}")

    async def _run_one(self, slot: int) -> bool:
        """Run one reader until it ends; True when it was up (said READY)."""
        process, [(reader, writer)] = await start_child(MODULE, self._args)
        self._processes[slot] = process
        link = _Link(writer)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                first = await read_frame(reader)
            if first is None or first[0] != wire.READY:
                log.error("BMC reader %d did not start (it exited)", slot)
                return False
            self._links[slot] = link
            if len(self._links) == self.count:
                self._all_up.set()
            while True:
                frame = await read_frame(reader)
                if frame is None:
                    return True
                link.on_frame(frame)
        except TimeoutError:
            log.error("BMC reader %d did not start within %.0fs", slot, START_TIMEOUT_S)
            return False
        finally:
            self._links.pop(slot, None)
            self._all_up.clear()
            link.fail_all(f"BMC reader {slot} ended before it answered")
            writer.close()
            with contextlib.suppress(Exception):
                await end_child(process)
            self._processes.pop(slot, None)

    # -- the reads -----------------------------------------------------------------

    def slot(self, node: str) -> int:
        """The reader of ``node``: the same while the count is."""
        digest = hashlib.blake2s(node.encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") % self.count

    def link_for(self, node: str) -> _Link | None:
        """The running reader of ``node``; None while it is not up."""
        return self._links.get(self.slot(node))

    async def leak_detectors(self, link: _Link, target: BmcTarget) -> list[LeakReading]:
        self.calls += 1
        values = await link.call(wire.LEAKS, wire.target_tuple(target))
        return [wire.leak_from(v) for v in values]

    async def thermal_c(self, link: _Link, target: BmcTarget) -> list[float]:
        self.calls += 1
        return [float(v) for v in await link.call(wire.THERMAL, wire.target_tuple(target))]

    async def poll_power(
        self, link: _Link, targets: Sequence[BmcTarget], concurrency: int, spread: float
    ) -> dict[str, tuple[str | None, str]]:
        self.calls += 1
        value = await link.call(
            wire.POWER, [wire.target_tuple(t) for t in targets], concurrency, spread
        )
        return {node: (power, health) for node, (power, health) in value.items()}

    def forget(self, node: str) -> None:
        link = self.link_for(node)
        if link is not None:
            link.send((wire.FORGET, node))
