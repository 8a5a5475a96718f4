"""Redfish-only behaviour against the sushy-tools emulator."""

from __future__ import annotations

import logging
import time

import pytest
from bmc_peers import PASSWORD, USER, make_pool, redfishtool_power, redfishtool_system

from controller.bmc import (
    BmcCredentials,
    BootDevice,
    BootMode,
    PowerAction,
    PowerState,
    TlsOptions,
    parse_bmc_url,
)
from controller.bmc.errors import BmcTlsError
from controller.core.errors import BmcAuthenticationFailed, BmcUnreachable, KilnError
from controller.sim.redfish_emulator import RedfishEmulator, make_systems


async def test_virtual_media_insert_and_eject(
    emulator: RedfishEmulator, credentials: BmcCredentials, image_server: str
) -> None:
    async with make_pool() as pool:
        bmc = pool.get("node-2", parse_bmc_url(emulator.system_url("node-00002")), credentials)
        assert (await bmc.vmedia.state()).inserted is False
        await bmc.vmedia.insert(image_server)
        state = await bmc.vmedia.state()
        assert state.inserted is True
        assert state.image_url == image_server
        await bmc.vmedia.insert(image_server)  # idempotent
        await bmc.vmedia.eject()
        assert (await bmc.vmedia.state()).inserted is False
        await bmc.vmedia.eject()  # idempotent


@pytest.mark.parametrize(
    ("device", "mode", "wire_target", "wire_mode"),
    [
        (BootDevice.CD, BootMode.LEGACY, "Cd", "Legacy"),
        (BootDevice.PXE, BootMode.UEFI, "Pxe", "UEFI"),
    ],
)
async def test_boot_device_and_mode_match_redfishtool(
    emulator: RedfishEmulator,
    credentials: BmcCredentials,
    device: BootDevice,
    mode: BootMode,
    wire_target: str,
    wire_mode: str,
) -> None:
    async with make_pool() as pool:
        bmc = pool.get("node-3", parse_bmc_url(emulator.system_url("node-00003")), credentials)
        await bmc.boot.set(device, mode=mode)
        boot = await bmc.boot.get()
        assert (boot.device, boot.mode) == (device, mode)
        peer = await redfishtool_system(emulator, "node-00003", USER, PASSWORD)
        assert peer["Boot"]["BootSourceOverrideTarget"] == wire_target
        assert peer["Boot"]["BootSourceOverrideMode"] == wire_mode


@pytest.mark.slow
async def test_power_on_with_real_bmc_delay_is_polled_to_completion(
    credentials: BmcCredentials,
) -> None:
    """The fake driver applies power changes 1-11 s later, like real BMCs.

    Its pending change lands at ``int(now) + randint(1, 11)``: when the draw
    is 1 the wait is what is left of the current second, under half a second
    one time in 22. Such a short wait proves no polling, so the test powers
    the system off and on again (new draws) until one change took at least
    half a second, at most three times (all three short: ~1 in 10,000)."""
    async with RedfishEmulator(
        make_systems(1), power_delay=True, username=USER, password=PASSWORD
    ) as emu:
        async with make_pool() as pool:
            bmc = pool.get("node-0", parse_bmc_url(emu.system_url("node-00000")), credentials)
            waits = []
            for _ in range(3):
                started = time.monotonic()
                assert await bmc.power.set(PowerAction.ON, timeout=30) is PowerState.ON
                waits.append(time.monotonic() - started)
                assert await redfishtool_power(emu, "node-00000", USER, PASSWORD) == "on"
                if waits[-1] >= 0.5:
                    break
                assert await bmc.power.set(PowerAction.OFF, timeout=30) is PowerState.OFF
            assert max(waits) >= 0.5, waits  # it really had to wait, and polled


@pytest.mark.parametrize("read", ["state", "poll"])
async def test_tls_with_self_signed_certificate(credentials: BmcCredentials, read: str) -> None:
    """Through sushy (``state``) and on the event loop (``poll``, power
    sync's reading): the CA bundle trusted, verification off, and the
    system's CAs refusing the self-signed certificate."""
    async with RedfishEmulator(make_systems(1), tls=True, username=USER, password=PASSWORD) as emu:
        address = parse_bmc_url(emu.system_url("node-00000"))
        assert address.scheme == "https"
        async with make_pool(call_timeout=5, retry=None) as pool:
            trusted = pool.get("n", address, credentials, TlsOptions(ca_bundle=str(emu.cert_path)))
            assert await getattr(trusted.power, read)() is PowerState.OFF
            insecure = pool.get("n-insecure", address, credentials, TlsOptions(verify=False))
            assert await getattr(insecure.power, read)() is PowerState.OFF
            untrusted = pool.get("n-untrusted", address, BmcCredentials(USER, PASSWORD + "x"))
            # Default verification against system CAs rejects the self-signed cert.
            with pytest.raises(BmcTlsError, match="certificate verify failed"):
                await getattr(untrusted.power, read)()
            assert untrusted.health.state == "ok"  # configuration problem, not an outage


async def test_wrong_password_fails_fast_without_leaking_it(
    emulator: RedfishEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Wr0ng-Pa55word-Zz"
    caplog.set_level(logging.DEBUG)
    async with make_pool() as pool:
        bmc = pool.get(
            "node-1", parse_bmc_url(emulator.system_url("node-00001")), BmcCredentials(USER, wrong)
        )
        with pytest.raises(BmcAuthenticationFailed) as info:
            await bmc.power.state()
        assert USER in str(info.value)
        assert wrong not in str(info.value)
        assert wrong not in repr(bmc)
        assert bmc.health.state == "ok"  # the BMC answered; the breaker stays closed
    assert caplog.records, "expected some log output to check"
    assert wrong not in caplog.text
    assert "retry" not in caplog.text  # never retried


async def test_unreachable_address_fails_within_timeout(
    closed_port: int, credentials: BmcCredentials
) -> None:
    address = parse_bmc_url(f"redfish+http://127.0.0.1:{closed_port}/redfish/v1/Systems/x")
    async with make_pool(call_timeout=2.0) as pool:
        bmc = pool.get("ghost", address, credentials)
        started = time.monotonic()
        with pytest.raises(BmcUnreachable):
            await bmc.power.state()
        # 3 attempts x 2 s timeout + backoff is the budget.
        assert time.monotonic() - started < 3 * 2.0 + 1.0
        assert bmc.health.state == "degraded"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("read", ["state", "poll"])
async def test_the_proxy_settings_of_the_environment_are_followed_read_once(
    emulator: RedfishEmulator,
    credentials: BmcCredentials,
    monkeypatch: pytest.MonkeyPatch,
    http_proxy_env: list[str],
    read: str,
) -> None:
    """requests' environment look-up is done when a BMC's session is set up,
    not on every call (its CPU), by requests' own rules: a proxy is used
    unless NO_PROXY names the host. The same for the periodic reading made
    on the event loop (``power.poll``), which takes its route from there."""
    asked = http_proxy_env
    async with make_pool(call_timeout=5, retry=None) as pool:
        # NO_PROXY names the BMC's host: straight to it.
        direct = pool.get("direct", parse_bmc_url(emulator.system_url("node-00000")), credentials)
        assert await getattr(direct.power, read)() is PowerState.OFF
        assert asked == []
        # Without NO_PROXY, a BMC set up now goes through the proxy ...
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name)
        proxied = pool.get("proxied", parse_bmc_url(emulator.system_url("node-00001")), credentials)
        with pytest.raises(KilnError):
            await getattr(proxied.power, read)()
        assert asked and asked[0].startswith(f"GET {emulator.base_url}/redfish/v1")
        # ... while the one set up before keeps the route it was given.
        asked.clear()
        assert await getattr(direct.power, read)() is PowerState.OFF
        assert asked == []
