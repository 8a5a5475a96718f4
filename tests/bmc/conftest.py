"""Shared fixtures for the BMC tests: real emulators on loopback, started and
stopped per test (each starts in well under a second)."""

from __future__ import annotations

import functools
import http.server
import shutil
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from bmc_peers import PASSWORD, USER

from controller.bmc import BmcCredentials
from controller.sim.ipmi_sim import IpmiSim
from controller.sim.ports import free_port
from controller.sim.redfish_emulator import RedfishEmulator, make_systems


@pytest.fixture
def credentials() -> BmcCredentials:
    return BmcCredentials(USER, PASSWORD)


@pytest_asyncio.fixture
async def emulator() -> AsyncIterator[RedfishEmulator]:
    """sushy-tools fake driver, 4 systems, Basic auth, instant power changes."""
    async with RedfishEmulator(make_systems(4), username=USER, password=PASSWORD) as emu:
        yield emu


@pytest_asyncio.fixture
async def ipmi_sim() -> AsyncIterator[IpmiSim]:
    async with IpmiSim("bmc0", USER, PASSWORD) as sim:
        yield sim


@pytest.fixture
def image_server(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTP server serving ``boot.iso``; yields its URL."""
    (tmp_path / "boot.iso").write_bytes(b"\0" * 4096)
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/boot.iso"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _RefusingProxy(http.server.BaseHTTPRequestHandler):
    """A loopback HTTP proxy that answers 502 to everything, noting what it was asked."""

    asked: list[str]

    def do_GET(self) -> None:
        self.asked.append(self.requestline)
        self.send_response(502)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A refusing HTTP proxy named by ``HTTP_PROXY``, with ``NO_PROXY``
    naming 127.0.0.1 (and no other proxy variable set); yields the request
    lines it was asked."""
    asked: list[str] = []
    handler = type("Proxy", (_RefusingProxy,), {"asked": asked})
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.server_address[1]}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1")
    try:
        yield asked
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.fixture
def closed_port() -> int:
    """A loopback TCP port nothing listens on."""
    return free_port()


@pytest.fixture
def dead_ipmi() -> Iterator[Callable[[int], list[str]]]:
    """Makes ``n`` dead IPMI BMCs: loopback UDP sockets that take every packet
    and never answer. Returns their ``ipmi://`` URLs."""
    sockets: list[socket.socket] = []

    def make(n: int) -> list[str]:
        urls = []
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            urls.append(f"ipmi://127.0.0.1:{sock.getsockname()[1]}")
        return urls

    yield make
    for sock in sockets:
        sock.close()


@pytest.fixture
def dead_redfish() -> Iterator[Callable[[int], list[str]]]:
    """Makes ``n`` dead Redfish BMCs: loopback TCP listeners that never accept,
    so a connection opens (the kernel's backlog) and no answer ever comes.
    Returns their ``redfish+http://`` system URLs."""
    sockets: list[socket.socket] = []

    def make(n: int) -> list[str]:
        urls = []
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            sockets.append(sock)
            port = sock.getsockname()[1]
            urls.append(f"redfish+http://127.0.0.1:{port}/redfish/v1/Systems/dead")
        return urls

    yield make
    for sock in sockets:
        sock.close()


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is required for this test (see docs/bmc.md)")
    return path
