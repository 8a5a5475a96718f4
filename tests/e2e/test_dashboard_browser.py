"""The fleet dashboard in a real headless Chromium (Debian's ``chromium``),
on a running simulated fleet (sushy-tools BMCs, agents on the NVML fake).

The browser opens the racks page once; then, without a reload (a marker set
in the page's window survives), a drained node shows drained, a heated GPU's
tray changes colour, and a new allocation appears. Screenshots are saved as
test artefacts (``$KILN_TEST_ARTIFACTS``, else the test's temporary folder).
A second test checks the pages behind authentication, over plain HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from fleet_waits import enroll_sim_fleet, wait_all_ready

from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Browser:
    """Just enough of the Chrome DevTools Protocol: navigate, evaluate, screenshot."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        await self._ws.send_json({"id": ident, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self._ws.receive_json(), 30)
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 20
        while await self.evaluate("document.readyState") != "complete":
            assert time.monotonic() < deadline, f"{url} did not load"
            await asyncio.sleep(0.05)

    async def until(self, expression: str, within: float = 30.0) -> Any:
        """Poll ``expression`` in the page until it is truthy."""
        deadline = time.monotonic() + within
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = await self.evaluate("document.body.innerText")
                raise AssertionError(f"never true: {expression}\npage:\n{text[:2000]}")
            await asyncio.sleep(0.2)

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Browser]:
    assert CHROMIUM, "the dashboard test needs Debian's chromium package (apt-get install chromium)"
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 - started once; waited on in finally
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",  # root in CI
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            f"--remote-debugging-port={port}",
            "--window-size=1280,900",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as reply:
                        pages = [p for p in await reply.json() if p.get("type") == "page"]
                    if pages:
                        break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "chromium did not start"
                await asyncio.sleep(0.2)
            async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                browser = Browser(ws)
                await browser.call("Page.enable")
                yield browser
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def artefacts(tmp_path: Path) -> Path:
    base = os.environ.get("KILN_TEST_ARTIFACTS")
    folder = Path(base) / "dashboard" if base else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.timeout(240)
async def test_the_dashboard_follows_the_fleet_without_a_reload(tmp_path: Path) -> None:
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path / "state",
            reconcile_interval=0.2,
            sample_interval=0.5,
            simulation=True,
            http_listen="127.0.0.1:0",
        )
    )
    address = await server.start()
    fleet = SimFleet(default_fleet(nvl72_racks=1, hgx_nodes=2, trays=4), watch_interval=0.3)
    shots = artefacts(tmp_path)
    try:
        await fleet.start(address)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await enroll_sim_fleet(stub, fleet)
            nodes = await wait_all_ready(stub, 90.0)
            base = f"http://{server.http_address}"
            async with chromium(tmp_path / "profile") as browser:
                started = time.monotonic()
                await browser.open(base + "/")
                loaded = time.monotonic() - started
                await browser.evaluate("window.kilnMarker = 'no reload'; 1")
                trays = await browser.evaluate("document.querySelectorAll('.tray').length")
                assert trays == len(nodes)
                text = await browser.evaluate("document.body.innerText")
                for rack in {n.rack for n in nodes}:
                    assert rack in text
                await browser.screenshot(shots / "1-racks.png")

                drained, heated = nodes[0].name, nodes[-1].name
                tray = f"document.querySelector('[data-node=\"{drained}\"]')"
                assert await browser.evaluate(f"{tray}.dataset.state") == "ready"
                await stub.DrainNode(fleet_pb2.DrainNodeRequest(name=drained, reason="dashboard"))
                await browser.until(f"{tray}.classList.contains('drained')")
                assert "(drained)" in await browser.evaluate(f"{tray}.innerText")

                heat = f"document.querySelector('[data-node=\"{heated}\"]').dataset.heat"
                assert await browser.evaluate(heat) == "cool"
                fault = {"kind": "heat", "gpu": 0, "target_c": 80}
                reply = await stub.InjectFault(
                    fleet_pb2.InjectFaultRequest(node=heated, fault_json=json.dumps(fault))
                )
                assert reply.ok, reply.message
                await browser.until(f"['warm', 'hot'].includes({heat})")
                await browser.screenshot(shots / "2-drained-and-heated.png")

                created = await stub.CreateAllocation(
                    fleet_pb2.CreateAllocationRequest(
                        key="dash-1", spec=fleet_pb2.AllocationSpec(nodes=1)
                    )
                )
                await browser.until(
                    f"document.querySelector('[data-allocation=\"{created.id}\"]') !== null"
                )
                assert await browser.evaluate("window.kilnMarker") == "no reload"
                await browser.screenshot(shots / "3-allocation.png")

                await browser.open(f"{base}/nodes/{heated}")
                page = await browser.evaluate("document.body.innerText")
                assert "Hottest GPU" in page and "GPUs" in page
                assert await browser.evaluate("document.querySelectorAll('table.gpus tr').length")
                await browser.screenshot(shots / "4-node.png")
        for name in ("1-racks", "2-drained-and-heated", "3-allocation", "4-node"):
            assert (shots / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        print(f"racks page loaded in {loaded * 1000:.0f} ms; screenshots in {shots}")
    finally:
        await fleet.stop()
        await server.stop()


@pytest.mark.timeout(60)
async def test_with_authentication_on_the_pages_need_an_operator_token(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path / "state",
            auth=True,
            bootstrap_token_file=token_file,
            http_listen="127.0.0.1:0",
        )
    )
    await server.start()
    try:
        base = f"http://{server.http_address}"
        token = token_file.read_text().strip()
        # unsafe: keep cookies set by an IP-address host (the controller on 127.0.0.1)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(base + "/", allow_redirects=False) as reply:
                assert reply.status == 302 and reply.headers["Location"] == "/login"
            async with http.get(base + "/fragments/racks") as reply:
                assert reply.status == 401
            async with http.get(base + "/metrics") as reply:
                assert reply.status == 200  # Prometheus scrapes without a token
            wrong = {"Authorization": "Bearer kiln.nope.nope"}
            async with http.get(base + "/", headers=wrong, allow_redirects=False) as reply:
                assert reply.status == 302
            bearer = {"Authorization": f"Bearer {token}"}
            async with http.get(base + "/", headers=bearer) as reply:
                assert reply.status == 200
                assert "No nodes enrolled yet" in await reply.text()
            async with http.post(base + "/login", data={"token": "wrong"}) as reply:
                assert reply.status == 401
                assert "wrong" not in await reply.text()
            async with http.post(
                base + "/login", data={"token": token}, allow_redirects=False
            ) as reply:
                assert reply.status == 302
                cookie = reply.cookies["kiln_token"]
                assert cookie["httponly"] and cookie["samesite"] == "Strict"
            async with http.get(base + "/allocations") as reply:  # the session's cookie
                assert reply.status == 200 and "No open allocations" in await reply.text()
    finally:
        await server.stop()
