"""A real Mosquitto broker on loopback, for tests and the simulated fleet.

:class:`Mosquitto` writes a throw-away config (one listener on
``127.0.0.1:<port>``, anonymous access, no persistence), runs the
``mosquitto`` binary found on ``PATH``, and waits until it accepts
connections. ``stop()`` then ``start()`` restarts it on the same port, which
is how tests simulate a broker outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from controller.core.errors import FailedPrecondition, Unavailable
from controller.sim.ports import free_port
from controller.sim.process import terminate

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


class Mosquitto:
    """One Mosquitto process on ``127.0.0.1``; ``port`` stays fixed across restarts.

    Use as ``async with Mosquitto() as broker:``. ``start`` and ``stop`` are
    idempotent. Raises FailedPrecondition if the binary is missing and
    Unavailable if the broker does not come up within ``start_timeout``.
    """

    def __init__(
        self, *, port: int | None = None, binary: str = "mosquitto", start_timeout: float = 10.0
    ) -> None:
        self.host = HOST
        self.port = port if port is not None else free_port(HOST)
        self._binary = binary
        self._start_timeout = start_timeout
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        """Launch the broker (if not running) and wait until it accepts connections."""
        if self.running:
            return
        binary = shutil.which(self._binary)
        if binary is None:
            raise FailedPrecondition(
                f"the {self._binary!r} binary is not installed (Debian: mosquitto)"
            )
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="kiln-mosquitto-")
        workdir = Path(self._dir.name)
        config = workdir / "mosquitto.conf"
        config.write_text(
            f"listener {self.port} {HOST}\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "log_dest stderr\n"
            "log_type error\nlog_type warning\nlog_type notice\n",
            encoding="utf-8",
        )
        if self._log is not None:
            self._log.close()
        self._log = (workdir / "mosquitto.log").open("ab")
        self._proc = await asyncio.create_subprocess_exec(
            binary,
            "-c",
            str(config),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise
        log.info("mosquitto listening on %s:%s (pid %s)", HOST, self.port, self._proc.pid)

    async def stop(self) -> None:
        """Terminate the broker (SIGTERM, then SIGKILL after 5s). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        await terminate(proc)
        log.info("mosquitto on %s:%s stopped", HOST, self.port)

    def log_tail(self, limit: int = 2000) -> str:
        """The end of the broker's own log, for failure messages."""
        if self._dir is None:
            return ""
        path = Path(self._dir.name) / "mosquitto.log"
        with contextlib.suppress(OSError):
            return path.read_text(encoding="utf-8", errors="replace")[-limit:]
        return ""

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._start_timeout
        while True:
            assert self._proc is not None
            if self._proc.returncode is not None:
                raise Unavailable(
                    f"mosquitto exited with {self._proc.returncode} on port {self.port}: "
                    f"{self.log_tail()}"
                )
            try:
                _, writer = await asyncio.open_connection(HOST, self.port)
            except OSError:
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"mosquitto did not listen on {HOST}:{self.port} within "
                        f"{self._start_timeout}s: {self.log_tail()}"
                    ) from None
                await asyncio.sleep(0.02)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    async def close(self) -> None:
        """Stop the broker and remove its files."""
        await self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
