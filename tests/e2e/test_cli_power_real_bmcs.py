"""Through the CLI on a fresh controller: enrol a Redfish node and an IPMI
node, drive their power, and read the result back with clients no one here
wrote (redfishtool, ipmitool) from the same emulators."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from bmc_peers import ipmitool_power, redfishtool_power

from controller.cli.main import main as kiln
from controller.server import ControllerConfig, ControllerServer
from controller.sim.ipmi_sim import IpmiSim
from controller.sim.redfish_emulator import RedfishEmulator, SimSystem

USER, PASSWORD = "operator", "kiln-pw-7731"  # IPMI passwords are at most 20 bytes


@pytest.fixture
async def peers(tmp_path: Path) -> AsyncIterator[tuple[str, RedfishEmulator, IpmiSim, Path]]:
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path / "state",
            reconcile_interval=0.5,
            bmc_power_timeout=30.0,
        )
    )
    address = await server.start()
    emulator = RedfishEmulator(
        [SimSystem(name="rf-node", uuid="11111111-2222-3333-4444-555555555555", power_state="Off")],
        username=USER,
        password=PASSWORD,
    )
    password_file = tmp_path / "bmc.pass"
    password_file.write_text(PASSWORD + "\n")
    async with emulator, IpmiSim("ipmi-node", USER, PASSWORD) as ipmi:
        try:
            yield address, emulator, ipmi, password_file
        finally:
            await server.stop()


async def cli(*argv: str) -> int:
    return await asyncio.to_thread(kiln, list(argv))


async def test_cli_power_is_seen_by_redfishtool_and_ipmitool(
    peers: tuple[str, RedfishEmulator, IpmiSim, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    address, emulator, ipmi, password_file = peers
    c = ["--controller", address]
    assert (
        await cli(
            *c,
            "nodes",
            "enroll",
            "rf-node",
            "--bmc",
            emulator.system_url("rf-node"),
            "--username",
            USER,
            "--password-file",
            str(password_file),
        )
        == 0
    )
    assert (
        await cli(
            *c,
            "nodes",
            "enroll",
            "ipmi-node",
            "--bmc",
            ipmi.address,
            "--username",
            USER,
            "--password-file",
            str(password_file),
        )
        == 0
    )

    for action, expected in (("on", "on"), ("off", "off"), ("on", "on"), ("cycle", "on")):
        assert await cli(*c, "nodes", "power", "rf-node", action) == 0
        assert await redfishtool_power(emulator, "rf-node", USER, PASSWORD) == expected
        assert await cli(*c, "nodes", "power", "ipmi-node", action) == 0
        assert await ipmitool_power(ipmi, USER, PASSWORD) == expected

    assert await cli(*c, "nodes", "power", "ipmi-node", "off") == 0
    capsys.readouterr()
    assert await cli(*c, "-o", "json", "nodes", "power", "ipmi-node", "status") == 0
    assert '"power": "off"' in capsys.readouterr().out
    assert await ipmitool_power(ipmi, USER, PASSWORD) == "off"

    # The bulk form: both BMCs, one progress line each, a summary.
    assert await cli(*c, "nodes", "power", "--all", "status") == 0
    out = capsys.readouterr()
    assert "rf-node" in out.out + out.err and "ipmi-node" in out.out + out.err
    assert PASSWORD not in out.out + out.err


async def test_wrong_password_is_a_clear_error_without_the_password(
    peers: tuple[str, RedfishEmulator, IpmiSim, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    address, emulator, _, _ = peers
    wrong = tmp_path / "wrong.pass"
    wrong.write_text("definitely-wrong-secret\n")
    c = ["--controller", address]
    assert (
        await cli(
            *c,
            "nodes",
            "enroll",
            "rf-bad",
            "--bmc",
            emulator.system_url("rf-node"),
            "--username",
            USER,
            "--password-file",
            str(wrong),
        )
        == 0
    )
    capsys.readouterr()
    assert await cli(*c, "nodes", "power", "rf-bad", "status") == 1
    err = capsys.readouterr().err
    assert "refused the credentials" in err and "definitely-wrong-secret" not in err
