"""Preparing a node to its profile, read as a checklist.

    1. firmware  — compare the BMC's firmware inventory with the baseline;
                   update each component that differs (capped fleet-wide and
                   per rack), then verify the new version;
    2. BIOS      — stage the attributes that differ;
    3. reboot    — power-cycle through the BMC when BIOS or firmware changed,
                   then verify the BIOS attributes took effect;
    4. GPUs      — the agent applies the GPU settings (done by the lifecycle),
                   after a reboot the agent of the new boot: one that
                   registered after the power cycle began, within
                   ``boot_timeout_s`` (GPU settings sent to the old boot's
                   agent would be lost with it);
    5. gate      — a fresh health sample must pass the profile's health gate.

Each step checks before it changes and treats "already there" as done, so
re-running a half-finished preparation after a controller restart is safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from controller.core.errors import KilnError
from controller.core.health import HealthReport
from controller.core.model import BmcTarget
from controller.core.ports import BmcGateway
from controller.core.profiles import HealthGate, Profile

log = logging.getLogger(__name__)


class PreparationFailed(KilnError):
    """The node cannot reach its profile; the message says why."""


@dataclass(frozen=True)
class PrepLimits:
    """How much preparation runs at once (Ironic caps cleaning at 50)."""

    prepare_fleet: int = 64
    prepare_per_rack: int = 8
    firmware_fleet: int = 16
    firmware_per_rack: int = 2
    boot_timeout_s: float = 900.0  # from preparation's power cycle to the new agent


@dataclass(frozen=True)
class BmcStepsDone:
    """What ``Preparer.bmc_steps`` changed, and when it power-cycled the node
    (Unix s, taken before the cycle was asked for; None when it did not)."""

    changed: list[str]
    cycled_at: float | None = None


class RackGates:
    """A fleet-wide semaphore plus one per rack."""

    def __init__(self, fleet: int, per_rack: int) -> None:
        self._fleet = asyncio.Semaphore(fleet)
        self._per_rack = per_rack
        self._racks: dict[str, asyncio.Semaphore] = defaultdict(
            lambda: asyncio.Semaphore(self._per_rack)
        )
        self.in_flight: dict[str, int] = defaultdict(int)
        self.peak_fleet = 0
        self._running = 0

    @asynccontextmanager
    async def slot(self, rack: str) -> AsyncIterator[None]:
        async with self._fleet, self._racks[rack]:
            self._running += 1
            self.in_flight[rack] += 1
            self.peak_fleet = max(self.peak_fleet, self._running)
            try:
                yield
            finally:
                self._running -= 1
                self.in_flight[rack] -= 1


class Preparer:
    def __init__(self, bmc: BmcGateway, limits: PrepLimits | None = None) -> None:
        self._bmc = bmc
        self.limits = limits or PrepLimits()
        self.preparing = RackGates(self.limits.prepare_fleet, self.limits.prepare_per_rack)
        self.firmware = RackGates(self.limits.firmware_fleet, self.limits.firmware_per_rack)

    async def bmc_steps(self, target: BmcTarget, rack: str, profile: Profile) -> BmcStepsDone:
        """Firmware, BIOS and the reboot they need. Returns what changed.

        Raises:
            PreparationFailed: a component or attribute cannot reach the profile.
            BmcError and kin: the BMC failed (the lifecycle retries later).
        """
        changed: list[str] = []
        reboot = False
        cycled_at: float | None = None
        if profile.firmware:
            updated = await self._firmware(target, rack, profile)
            changed += updated
            reboot |= bool(updated)
        if profile.bios:
            staged = await self._stage_bios(target, profile)
            if staged:
                changed.append(f"BIOS staged: {', '.join(sorted(staged))}")
                reboot = True
        if reboot:
            cycled_at = time.time()
            await self._bmc.set_power(target, "cycle")
            changed.append("power-cycled to apply firmware/BIOS")
        if profile.bios:
            await self._verify_bios(target, profile)
        return BmcStepsDone(changed, cycled_at)

    async def _firmware(self, target: BmcTarget, rack: str, profile: Profile) -> list[str]:
        versions = await self._bmc.firmware_versions(target)
        todo = [t for t in profile.firmware if versions.get(t.component) != t.version]
        missing = [t.component for t in todo if t.component not in versions]
        if missing:
            raise PreparationFailed(
                f"firmware component(s) {', '.join(missing)} not in the BMC's inventory "
                f"(it has {', '.join(sorted(versions)) or 'none'})"
            )
        changed = []
        for t in todo:
            async with self.firmware.slot(rack):
                log.info(
                    "node %s: updating %s %s → %s",
                    target.node,
                    t.component,
                    versions[t.component],
                    t.version,
                )
                await self._bmc.firmware_update(target, t.image, t.component)
            after = (await self._bmc.firmware_versions(target)).get(t.component)
            if after != t.version:
                raise PreparationFailed(
                    f"firmware {t.component} is at {after} after the update from {t.image}; "
                    f"the profile pins {t.version}"
                )
            changed.append(f"firmware {t.component} {versions[t.component]} → {t.version}")
        return changed

    async def _stage_bios(self, target: BmcTarget, profile: Profile) -> dict[str, Any]:
        current = await self._bmc.bios_attributes(target)
        unknown = sorted(set(profile.bios) - set(current))
        if unknown:
            raise PreparationFailed(f"BIOS has no attribute(s) {', '.join(unknown)}")
        diff = {k: v for k, v in profile.bios.items() if current.get(k) != v}
        if diff:
            await self._bmc.bios_set(target, diff)
        return diff

    async def _verify_bios(self, target: BmcTarget, profile: Profile) -> None:
        current = await self._bmc.bios_attributes(target)
        wrong = {k: current.get(k) for k, v in profile.bios.items() if current.get(k) != v}
        if wrong:
            raise PreparationFailed(
                "BIOS attributes did not take effect after the reboot: "
                + ", ".join(f"{k}={v!r} (want {profile.bios[k]!r})" for k, v in wrong.items())
            )


def gate_problems(gate: HealthGate, health: HealthReport) -> list[str]:
    """Why a node's latest health sample fails ``gate`` (empty: it passes)."""
    problems: list[str] = []
    if not health.gpus:
        return ["no GPU health reported"]
    for g in health.gpus:
        i = g.index
        if g.lost:
            problems.append(f"GPU {i} fell off the bus")
            continue
        temp = g.temp_c
        if gate.max_gpu_temp_c is not None and temp is None:
            problems.append(f"GPU {i} temperature unreadable")
        elif gate.max_gpu_temp_c is not None and temp is not None and temp > gate.max_gpu_temp_c:
            problems.append(f"GPU {i} at {temp:g} °C (gate {gate.max_gpu_temp_c:g} °C)")
        if g.ecc_dbe_volatile > gate.max_ecc_dbe_volatile:
            problems.append(f"GPU {i} has {g.ecc_dbe_volatile} uncorrectable ECC errors")
        if g.remap_failure:
            problems.append(f"GPU {i} row remapping failed")
        if g.remap_pending and not gate.allow_remap_pending:
            problems.append(f"GPU {i} has a row remap pending (needs a reset)")
        if g.nvlink_down and not gate.allow_nvlink_down:
            problems.append(f"GPU {i} NVLink(s) down: {list(g.nvlink_down)}")
        if gate.require_fabric and not (g.fabric_state == 3 and g.fabric_healthy):
            problems.append(f"GPU {i} NVLink fabric not ready (state {g.fabric_state})")
    return problems
