"""Starts the agent relay workers, keeps them running, stops them.

Each worker is a ``python -m controller.api.relay.worker`` child with one
end of two socket pairs: the agents' streams on one, every other call
(``FleetService``) on the other, so that an operator's call is read at once
however many reports wait before it; the controller reads each link's
frames (a ``RelayedCalls`` each).
A worker that exits or whose link fails is started again after a pause
(doubling from 1 s up to 30 s while it keeps failing); its agents'
calls end as for any dropped connection and they reconnect. The workers
exit when the controller does, however it ends: their link closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

from controller.api.keepalive import DEFAULT_KEEPALIVE_S
from controller.api.relay import frames
from controller.api.relay.frames import FrameWriter
from controller.api.relay.relayed import HandlerFor, RelayedCalls
from controller.core.errors import InvalidArgument
from controller.link import RestartPause, cancel_all, cpu_seconds, end_child, start_child

log = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0


class RelayStartError(InvalidArgument):
    template = "agent relay workers did not start on %(address)s: %(reason)s"


class AgentRelays:
    """``count`` workers serving ``listen`` (HOST:PORT, a fixed port)."""

    def __init__(
        self,
        count: int,
        listen: str,
        handler_for: HandlerFor,
        *,
        tls_files: Sequence[Path | None] = (None, None, None),
        keepalive: float = DEFAULT_KEEPALIVE_S,
    ) -> None:
        if count < 1:
            raise InvalidArgument("--agent-relays must be at least 1")
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit() or int(port) == 0:
            raise InvalidArgument(
                f"--agent-listen wants HOST:PORT with a fixed port (the workers share it), "
                f"not {listen!r}"
            )
        self.count = count
        self.listen = listen
        self._handler_for = handler_for
        self._tls_files = tuple(tls_files)
        self.keepalive = keepalive
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._calls: dict[int, tuple[RelayedCalls, ...]] = {}  # a worker's links' calls
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.restarts = 0

    def calls(self) -> int:
        """Agent calls open through the workers now."""
        return sum(len(c) for links in self._calls.values() for c in links)

    def figures(self) -> dict[str, int]:
        """For the metrics: workers running, calls open, restarts, backlog."""
        return {
            "workers": len(self._calls),
            "calls": self.calls(),
            "restarts": self.restarts,
            "backlog": sum(c.queued for links in self._calls.values() for c in links),
        }

    async def start(self) -> None:
        """Start every worker; returns once each has bound the port.

        Raises RelayStartError (every worker stopped) when one cannot."""
        started: list[asyncio.Future[None]] = []
        for slot in range(self.count):
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            started.append(ready)
            keeping = asyncio.create_task(self._keep(slot, ready), name=f"kiln-relay-{slot}")
            self._tasks.append(keeping)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.gather(*started)
        except BaseException as e:
            await self.stop()
            if isinstance(e, TimeoutError):
                raise RelayStartError(address=self.listen, reason="no answer in time") from None
            raise
        log.info(
            "agents and FleetService served on %s by %d relay worker processes",
            self.listen,
            self.count,
        )

    def cpu_seconds(self) -> dict[int, float]:
        """Each running worker's CPU so far (seconds), by process id."""
        spent = {}
        for process in self._processes.values():
            if process.returncode is None and (cpu := cpu_seconds(process.pid)) is not None:
                spent[process.pid] = cpu
        return spent

    def signal_all(self, signum: int) -> None:
        for process in self._processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    async def stop(self) -> None:
        self._stopping = True
        await cancel_all(self._tasks)

    async def _keep(self, slot: int, ready: asyncio.Future[None]) -> None:
        pause = RestartPause()
        while not self._stopping:
            try:
                await self._run_one(slot, ready)
                pause.served()
            except RelayStartError as e:
                if not ready.done():
                    ready.set_exception(e)
                    return
                log.error("%s", e)
            except (OSError, frames.FrameError) as e:
                log.error("agent relay worker %d failed: %s", slot, e)
            if self._stopping:
                return
            self.restarts += 1
            await pause.wait(f"agent relay worker {slot}")

    async def _run_one(self, slot: int, ready: asyncio.Future[None]) -> None:
        args = ["--listen", self.listen, "--keepalive", repr(self.keepalive)]
        flags = ("--tls-cert", "--tls-key", "--tls-client-ca")
        for flag, path in zip(flags, self._tls_files, strict=True):
            if path is not None:
                args += [flag, str(path)]
        process, links = await start_child(
            "controller.api.relay.worker", args, more_links=("--api-link-fd",)
        )
        self._processes[slot] = process
        writers = [FrameWriter(writer) for _, writer in links]
        sending = [asyncio.create_task(writer.run()) for writer in writers]
        calls = self._calls[slot] = tuple(RelayedCalls(w, self._handler_for) for w in writers)
        reading: list[asyncio.Task[None]] = []
        try:
            first = await frames.read_frame(links[0][0])
            if first is None or first[0] != frames.READY:
                failed = first is not None and first[0] == frames.FAILED
                reason = first[1] if failed and first is not None else "it exited"
                raise RelayStartError(address=self.listen, reason=str(reason))
            if not ready.done():
                ready.set_result(None)
            reading = [
                asyncio.create_task(_read(reader, each))
                for (reader, _), each in zip(links, calls, strict=True)
            ]
            # Until either link ends (what ended it, raised, is the worker's end).
            done, _ = await asyncio.wait(reading, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            await cancel_all(reading)
            for each in calls:
                await each.end_all()
            del self._calls[slot]
            await cancel_all(sending)
            for _, writer in links:
                writer.close()
            await end_child(process)
            self._processes.pop(slot, None)


async def _read(reader: asyncio.StreamReader, calls: RelayedCalls) -> None:
    """One link's frames to its calls, until it ends; not read further while
    the calls' backlog is over its mark (``RelayedCalls.room``)."""
    while True:
        frame = await frames.read_frame(reader)
        if frame is None:
            return
        calls.on_frame(frame)
        await calls.room()
