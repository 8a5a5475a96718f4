"""A real Mosquitto broker on loopback, for tests and the simulated fleet.

:class:`Mosquitto` writes a throw-away config (one listener on
``127.0.0.1:<port>``, no persistence; anonymous unless ``users`` are given,
plaintext unless ``tls`` is), runs the
``mosquitto`` binary found on ``PATH``, and waits until it accepts
connections. ``stop()`` then ``start()`` restarts it on the same port, which
is how tests simulate a broker outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from controller.core.errors import FailedPrecondition, Unavailable
from controller.sim.ports import free_port
from controller.sim.process import terminate

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


@dataclass(frozen=True)
class BrokerCertificates:
    """The broker's TLS files; clients must show a certificate from ``ca_file``
    when ``require_client_cert``."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    require_client_cert: bool = False


class Mosquitto:
    """One Mosquitto process on ``127.0.0.1``; ``port`` stays fixed across restarts.

    Use as ``async with Mosquitto() as broker:``. ``start`` and ``stop`` are
    idempotent. Raises FailedPrecondition if the binary is missing and
    Unavailable if the broker does not come up within ``start_timeout``.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str = "mosquitto",
        start_timeout: float = 10.0,
        users: Mapping[str, str] | None = None,
        tls: BrokerCertificates | None = None,
    ) -> None:
        self.users = dict(users or {})
        self.tls = tls
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
        config.write_text(self._config(workdir), encoding="utf-8")
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

    def _config(self, workdir: Path) -> str:
        lines = [f"listener {self.port} {HOST}", "persistence false", "log_dest stderr"]
        lines += ["log_type error", "log_type warning", "log_type notice"]
        if os.geteuid() == 0:
            # Started as root, mosquitto would become user "mosquitto" and lose
            # the private files of this throw-away broker (password file, key).
            lines.append("user root")
        if self.users:
            passwords = workdir / "passwords"
            passwords.write_text("", encoding="utf-8")
            passwords.chmod(0o600)
            tool = shutil.which("mosquitto_passwd")
            if tool is None:
                raise FailedPrecondition("mosquitto_passwd is not installed (Debian: mosquitto)")
            for user, password in self.users.items():
                subprocess.run(
                    [tool, "-b", str(passwords), user, password], check=True, capture_output=True
                )
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        else:
            lines.append("allow_anonymous true")
        if self.tls is not None:
            lines += [
                f"cafile {self.tls.ca_file}",
                f"certfile {self.tls.cert_file}",
                f"keyfile {self.tls.key_file}",
                f"require_certificate {'true' if self.tls.require_client_cert else 'false'}",
            ]
        return "\n".join(lines) + "\n"

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
