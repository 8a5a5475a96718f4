"""Real peers the tests start themselves: PostgreSQL and a Kiln controller.

Everything listens on 127.0.0.1 on a free port and is stopped by the test
that started it.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.sim.ports import free_port

if TYPE_CHECKING:
    from controller.server import ControllerConfig


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("postgres")
    return Path(which).parent if which else None


@contextmanager
def postgres_server() -> Iterator[str]:
    """Run a throw-away PostgreSQL cluster; yields a SQLAlchemy URL.

    PostgreSQL refuses to run as root, so as root the cluster runs as the
    ``postgres`` system user.
    """
    bindir = postgres_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    tmp = tempfile.mkdtemp(prefix="kiln-pg-")
    data = Path(tmp) / "data"
    port = free_port()
    run_as: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(tmp, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [
            *run_as,
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "kiln",
            "--auth=trust",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    proc = subprocess.Popen(
        [
            *run_as,
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={tmp}",
            "-c",
            "fsync=off",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL did not start")
            time.sleep(0.2)
        subprocess.run(
            [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "kiln", "kiln"],
            check=True,
            capture_output=True,
        )
        yield f"postgresql+psycopg://kiln@127.0.0.1:{port}/kiln"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


class ControllerThread:
    """A controller on its own event loop in a background thread, so that
    synchronous tests (the CLI, grpcurl) can talk to it."""

    def __init__(self, config: ControllerConfig, **kwargs: Any) -> None:
        from controller.server import ControllerServer

        self.server = ControllerServer(config, **kwargs)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.address = ""

    def start(self) -> str:
        self._thread.start()
        self.address = self.call(self.server.start())
        return self.address

    def call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.call(self.server.stop())
        self.call(_cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


async def _cancel_the_rest() -> None:
    """Cancel whatever still runs on this loop (agents, streams) before it closes."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()
