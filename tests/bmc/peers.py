"""Independent clients (redfishtool, ipmitool) that read a BMC's state, so
tests check Kiln against software no one here wrote."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import pytest

from controller.sim.ipmi_sim import IpmiSim
from controller.sim.redfish_emulator import RedfishEmulator


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is required for the BMC cross-checks")
    return path


async def _run(args: list[str]) -> str:
    proc = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, f"{args[0]} failed: {proc.stderr.strip()}"
    return proc.stdout


async def redfishtool_system(emu: RedfishEmulator, name: str, user: str, password: str) -> dict:
    base = [_tool("redfishtool"), "-r", f"127.0.0.1:{emu.port}", "-A", "Basic", "-S", "Never"]
    base += ["-u", user, "-p", password, "Systems", "-M", f"Name:{name}"]
    return dict(json.loads(await _run(base)))


async def redfishtool_power(emu: RedfishEmulator, name: str, user: str, password: str) -> str:
    """ "on"/"off" as redfishtool sees it."""
    return str((await redfishtool_system(emu, name, user, password))["PowerState"]).lower()


def ipmitool_args(sim: IpmiSim, user: str, password: str) -> list[str]:
    return [
        _tool("ipmitool"), "-I", "lanplus", "-C", "3", "-H", "127.0.0.1",
        "-p", str(sim.port), "-U", user, "-P", password,
    ]  # fmt: skip


async def ipmitool_power(sim: IpmiSim, user: str, password: str) -> str:
    out = await _run([*ipmitool_args(sim, user, password), "power", "status"])
    return out.strip().rsplit(" ", 1)[-1]  # "Chassis Power is on"
