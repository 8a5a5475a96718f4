"""Independent clients (redfishtool, ipmitool) that read a BMC's state, so
tests check Kiln against software no one here wrote."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from typing import Any

import pytest

from controller.bmc import BmcPool, RetryPolicy
from controller.sim.ipmi_sim import IpmiSim
from controller.sim.redfish_emulator import RedfishEmulator

USER = "kiln-admin"
PASSWORD = "Sup3r-Secret-Pw!"  # tests assert this string never leaks


def make_pool(call_timeout: float = 8.0, **kwargs: Any) -> BmcPool:
    """A pool with fast retries, for tests (close it before stopping peers)."""
    kwargs.setdefault("retry", RetryPolicy(attempts=3, base_delay=0.05, max_delay=0.2))
    kwargs.setdefault("breaker_threshold", 5)
    kwargs.setdefault("breaker_cooldown", 30.0)
    return BmcPool(max_workers=32, call_timeout=call_timeout, seed=7, **kwargs)


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


async def ipmitool(sim: IpmiSim, user: str, password: str, *args: str) -> str:
    """Run ipmitool against ``sim``; returns stdout."""
    return await _run([*ipmitool_args(sim, user, password), *args])


async def ipmitool_power(sim: IpmiSim, user: str, password: str) -> str:
    out = await _run([*ipmitool_args(sim, user, password), "power", "status"])
    return out.strip().rsplit(" ", 1)[-1]  # "Chassis Power is on"
