"""The periodic power reading on the event loop (``PowerControl.poll``).

Power sync reads every BMC's power over and over; for Redfish that read is
one GET made through the pool's aiohttp session (``bmc/redfish_http.py``)
instead of sushy in a worker thread. Against sushy-tools' emulator (and a
FaultProxy in front of it where an answer must go wrong), it must read what
``state()`` and redfishtool read, and fail as ``state()`` fails: the same
Kiln errors, the same guard (retries, breakers, health), no secret in any
message. The broken-answer matrix runs it too (``test_broken_payloads.py``,
the "power-poll" cases), and so do the TLS and proxy tests of
``test_redfish.py`` (their "poll" cases).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from bmc_peers import PASSWORD, USER, make_pool, redfishtool_power

from controller.bmc import BmcCredentials, PowerAction, PowerState, parse_bmc_url
from controller.bmc.errors import BmcServerError
from controller.bmc.gateway import PoolGateway
from controller.core.errors import (
    BmcAuthenticationFailed,
    BmcUnreachable,
    KilnError,
    NotSupported,
)
from controller.core.model import BmcTarget
from controller.sim.fault_proxy import FaultProxy, PayloadFault
from controller.sim.redfish_emulator import RedfishEmulator

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def test_poll_reads_what_state_and_redfishtool_read(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    async with make_pool() as pool:
        bmc = pool.get("n0", parse_bmc_url(emulator.system_url("node-00000")), credentials)
        assert await bmc.power.poll() is PowerState.OFF
        assert await bmc.power.state() is PowerState.OFF
        await bmc.power.set(PowerAction.ON)
        assert await bmc.power.poll() is PowerState.ON
        assert await redfishtool_power(emulator, "node-00000", USER, PASSWORD) == "on"
        await bmc.power.set(PowerAction.FORCE_OFF)
        assert await bmc.power.poll() is PowerState.OFF
        assert bmc.health.state == "ok"


async def test_a_power_sync_pass_reads_redfish_without_worker_threads(
    emulator: RedfishEmulator,
) -> None:
    """``PoolGateway.poll_power`` (the power sync's pass) reads every Redfish
    BMC on the event loop: no call reaches the pool's Redfish threads."""
    async with make_pool() as pool:
        gateway = PoolGateway(pool)
        targets = [
            BmcTarget(
                node=f"n{i}",
                url=emulator.system_url(f"node-0000{i}"),
                username=USER,
                password=PASSWORD,
            )
            for i in range(4)
        ]
        polled = await gateway.poll_power(targets, 4)
        assert polled == {f"n{i}": ("off", "ok") for i in range(4)}
        assert pool.worker_stats()["redfish"].threads == 0  # no read went to a thread
        await gateway.set_power(targets[2], "on")  # a change: sushy, in a thread
        assert pool.worker_stats()["redfish"].threads >= 1
        polled = await gateway.poll_power(targets, 4)
        assert polled["n2"] == ("on", "ok")
        assert [polled[f"n{i}"][0] for i in (0, 1, 3)] == ["off"] * 3


async def test_wrong_password_is_refused_without_leaking_it_or_retrying(
    emulator: RedfishEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Wr0ng-Pa55word-Zz"
    caplog.set_level(logging.DEBUG)
    async with FaultProxy(("127.0.0.1", emulator.port)) as proxy:
        url = f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/node-00001"
        async with make_pool() as pool:
            bmc = pool.get("n1", parse_bmc_url(url), BmcCredentials(USER, wrong))
            with pytest.raises(BmcAuthenticationFailed) as info:
                await bmc.power.poll()
            assert USER in str(info.value)
            assert wrong not in str(info.value)
            assert proxy.requests == 1  # not retried
            assert bmc.health.state == "ok"  # the BMC answered
    assert wrong not in caplog.text


async def test_a_closed_port_is_unreachable_as_through_sushy(closed_port: int) -> None:
    address = parse_bmc_url(f"redfish+http://127.0.0.1:{closed_port}/redfish/v1/Systems/x")
    credentials = BmcCredentials(USER, PASSWORD)
    async with make_pool(call_timeout=2.0) as pool:
        bmc = pool.get("ghost", address, credentials)
        started = time.monotonic()
        with pytest.raises(BmcUnreachable) as polled:
            await bmc.power.poll()
        assert time.monotonic() - started < 3 * 2.0 + 1.0
        assert bmc.health.state == "degraded"
        assert bmc.health.consecutive_failures == 3  # retried as a transient failure
    async with make_pool(call_timeout=2.0) as pool:  # a fresh address breaker
        with pytest.raises(BmcUnreachable) as read:
            await pool.get("ghost", address, credentials).power.state()
    # The same words either way (the guard's breakers count them alike).
    assert str(polled.value) == str(read.value)
    assert "connection refused" in str(polled.value)


async def test_error_answers_become_the_errors_sushy_reads_give(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    """A 500 with a Redfish error message, and a system the BMC does not
    have, fail as the same answers fail through sushy."""
    message = {
        "error": {
            "code": "Base.1.0.InternalError",
            "message": "generic",
            "@Message.ExtendedInfo": [{"Message": "fan board offline", "Severity": "Critical"}],
        }
    }
    fault = PayloadFault.json(r"/Systems/node-00001$", message, status=500)
    async with FaultProxy(("127.0.0.1", emulator.port), payload_faults=[fault]) as proxy:
        base = f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems"
        async with make_pool(breaker_threshold=50) as pool:
            broken = pool.get("n1", parse_bmc_url(f"{base}/node-00001"), credentials)
            with pytest.raises(BmcServerError) as polled:
                await broken.power.poll()
            with pytest.raises(BmcServerError) as read:
                await broken.power.state()
            assert str(polled.value) == str(read.value)
            assert "fan board offline" in str(polled.value)
            missing = pool.get("n9", parse_bmc_url(f"{base}/no-such-node"), credentials)
            with pytest.raises(NotSupported):
                await missing.power.poll()
            assert missing.health.state == "ok"  # the BMC answered


async def test_a_closed_pool_reads_no_more(
    emulator: RedfishEmulator, credentials: BmcCredentials
) -> None:
    pool = make_pool()
    bmc = pool.get("n0", parse_bmc_url(emulator.system_url("node-00000")), credentials)
    assert await bmc.power.poll() is PowerState.OFF
    await pool.close()
    with pytest.raises(KilnError):
        await bmc.power.poll()


async def test_a_read_leaves_no_connection_open_to_the_bmc() -> None:
    """A BMC is read again a pass later, past any keep-alive: the read's
    connection is closed after its answer, even where the BMC would keep it,
    so a fleet's reads hold no idle sockets."""
    open_now = served = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, served
        open_now += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                body = json.dumps({"@odata.id": path, "PowerState": "On"}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Connection: keep-alive\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            open_now -= 1
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with make_pool() as pool:
            targets = [
                BmcTarget(
                    node=f"n{i}",
                    url=f"redfish+http://127.0.0.1:{port}/redfish/v1/Systems/s{i}",
                    username=USER,
                    password=PASSWORD,
                )
                for i in range(5)
            ]
            polled = await PoolGateway(pool).poll_power(targets, 5)
            assert set(polled.values()) == {("on", "ok")}
            for _ in range(100):
                if open_now == 0:
                    break
                await asyncio.sleep(0.02)
            assert (served, open_now) == (5, 0)
    finally:
        server.close()
        await server.wait_closed()
