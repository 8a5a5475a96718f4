"""A ``kiln-controller`` run as a real child process that a test may SIGKILL.

The same state directory and the same loopback port are used across restarts,
so agents that dial the old address find the new controller on their own.
Output goes to ``controller.log`` in the state directory (appended per run).

To keep a crash loop fast, the next controller is spawned ahead of time as a
standby: a Python process that has already imported ``controller.main`` and
waits on stdin. ``start()`` tells it to go, and it runs the very same
``controller.main.main(argv)`` that ``python -m controller.main`` runs; only
the interpreter's import time is taken out of the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Import everything now; run main(argv) only when told to on stdin.
STANDBY = (
    "import sys\n"
    "from controller.main import main\n"
    "if sys.stdin.readline().strip() == 'go':\n"
    "    sys.exit(main(sys.argv[1:]))\n"
)


class ControllerProcess:
    """One controller at ``127.0.0.1:port`` over SQLite in ``state_dir``."""

    def __init__(
        self, state_dir: Path, port: int, *, profiles: Path | None = None, sample: float = 1.0
    ) -> None:
        self.state_dir = state_dir
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.db_path = state_dir / "kiln.db"
        self.log_path = state_dir / "controller.log"
        self._profiles = profiles
        self._sample = sample
        self._proc: asyncio.subprocess.Process | None = None
        self._standby: asyncio.subprocess.Process | None = None
        state_dir.mkdir(parents=True, exist_ok=True)
        self.starts = 0
        self.kills = 0

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self, timeout: float = 30.0) -> None:
        """Start the controller and wait until its health service says SERVING.

        Raises:
            AssertionError: it exited or did not serve within ``timeout``.
        """
        assert not self.running, "already running"
        with self.log_path.open("ab") as log:
            log.write(f"---- start {self.starts + 1} ----\n".encode())
        proc, self._standby = self._standby, None
        if proc is None or not await self._go(proc):  # no standby, or it died waiting
            proc = await self._spawn()
            assert await self._go(proc), f"controller exited at start:\n{self.log_tail()}"
        self._proc = proc
        self.starts += 1
        await self._wait_serving(timeout)
        self._standby = await self._spawn()

    @staticmethod
    async def _go(proc: asyncio.subprocess.Process) -> bool:
        """Tell a standby to run; False when it is gone."""
        assert proc.stdin is not None
        if proc.returncode is not None:
            return False
        try:
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    async def _spawn(self) -> asyncio.subprocess.Process:
        argv = [
            "--listen",
            self.address,
            "--state-dir",
            str(self.state_dir),
            "--sample-interval",
            str(self._sample),
        ]
        if self._profiles is not None:
            argv += ["--profiles", str(self._profiles)]
        with self.log_path.open("ab") as log:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                STANDBY,
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )

    async def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if not self.running:
                    raise AssertionError(f"controller exited at start:\n{self.log_tail()}")
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"controller not serving:\n{self.log_tail()}")
                await asyncio.sleep(0.05)

    async def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGKILL)
        await self._proc.wait()
        self._proc = None
        self.kills += 1

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; the standby is dismissed."""
        if self._standby is not None:
            assert self._standby.stdin is not None
            self._standby.stdin.close()  # readline() sees EOF and the standby exits
            await self._standby.wait()
            self._standby = None
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self._proc.wait(), 10.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGKILL)
            await self._proc.wait()
        self._proc = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
