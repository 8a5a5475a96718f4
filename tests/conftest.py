"""Fixtures shared by every test package.

Some tests run a controller on a background thread. CPython 3.11 can fail
with "AST constructor recursion depth mismatch" when two threads compile
code at once (gh-106905), and hypothesis imports (and pytest rewrites) some
modules lazily when its first test runs; importing them here, before any
thread starts, keeps the main thread from compiling while a controller runs.

grpc.aio keeps one process-wide completion queue, read by a poller thread,
reference-counted by every live aio server and channel. Each time the count
drops to zero, at the end of nearly every test, the object freed last (often
in the main thread, right after a server stopped) shuts the queue down: it
unhooks the queue's wake-up socket from every event loop, then joins the
poller thread until core reports the queue drained. A poller blocked writing
to that unread socket (a burst of completions, or loops of other threads
that stopped) is never joined, and the suite hangs in teardown
(grpc/grpc#22365, #40989). One reference taken here, before any test, keeps
the queue for the whole session; its poller is a daemon thread and ends with
the process.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import hypothesis.internal.conjecture.providers  # noqa: F401
import pytest
from hang_report import hang_reporter
from peers import ControllerThread, postgres_server

IMAGES = Path(__file__).resolve().parents[1] / "images"


async def _hold_grpc_aio() -> None:
    grpc.aio.init_grpc_aio()  # never released: see the module docstring


asyncio.run(_hold_grpc_aio())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test about to hit its timeout first says where its asyncio tasks wait
    (``hang_report``)."""
    marker = item.get_closest_marker("timeout")
    timeout = marker.args[0] if marker and marker.args else item.config.getini("timeout")
    function = getattr(item, "originalname", item.name)
    with hang_reporter(item.nodeid, function, float(timeout or 0)):
        return (yield)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def image_server() -> Iterator[str]:
    """images/ served on 127.0.0.1 (the catalogue's kiln-test is testdata/kiln-test.iso)."""
    handler = functools.partial(_Quiet, directory=str(IMAGES))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.block_on_close = False  # a client's idle keep-alive must not hold teardown
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server for the whole session (started on demand)."""
    with postgres_server() as url:
        yield url


@pytest.fixture
def controller_addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A controller on a fresh SQLite database, serving on 127.0.0.1:PORT."""
    from controller.server import ControllerConfig

    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path_factory.mktemp("controller"),
            reconcile_interval=0.2,
            simulation=True,  # `kiln sim fault` is served
        )
    )
    address = controller.start()
    try:
        yield address
    finally:
        controller.stop()
