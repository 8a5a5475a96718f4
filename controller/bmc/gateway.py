"""Adapter: the core's BmcGateway port on top of the BMC drivers' pool."""

from __future__ import annotations

import time

from controller.bmc import registry
from controller.bmc.address import BmcCredentials, TlsOptions, parse_bmc_url
from controller.bmc.base import PowerAction, PowerState
from controller.bmc.fleet import run_bulk
from controller.bmc.pool import Bmc, BmcPool
from controller.bmc.types import BootDevice, BootMode, Health, LeakDetectorReading
from controller.core.errors import InvalidArgument, NotSupported
from controller.core.model import BmcTarget, DetectorHealth, LeakReading

ACTIONS = {
    "on": PowerAction.ON,
    "off": PowerAction.OFF,
    "force_off": PowerAction.FORCE_OFF,
    "cycle": PowerAction.CYCLE,
    "restart": PowerAction.RESTART,
}
STATES = {PowerState.ON: "on", PowerState.OFF: "off"}
DETECTOR_HEALTH = {
    Health.OK: DetectorHealth.OK,
    Health.WARNING: DetectorHealth.WARNING,
    Health.CRITICAL: DetectorHealth.CRITICAL,
}


def leak_reading(r: LeakDetectorReading) -> LeakReading:
    """A driver's leak detector reading as the core's value."""
    return LeakReading(
        detector=r.path,
        name=r.name,
        detector_state=DETECTOR_HEALTH.get(r.detector_state) if r.detector_state else None,
        status_state=r.status_state,
        status_health=DETECTOR_HEALTH.get(r.status_health) if r.status_health else None,
        read_at=r.read_at,
        problem=r.problem,
        detector_type=r.detector_type or "",
        physical_context=r.physical_context or "",
    )


class PoolGateway:
    """Implements ``controller.core.ports.BmcGateway`` over one :class:`BmcPool`.

    Args:
        power_timeout: seconds a power change may take before it fails.
        power_resend_after: seconds before an accepted but unapplied power
            command is sent once more (None: the pool's ``power_resend_after``,
            30 s by default).
    """

    def __init__(
        self,
        pool: BmcPool,
        *,
        power_timeout: float = 120.0,
        power_resend_after: float | None = None,
    ) -> None:
        self._pool = pool
        self._power_timeout = power_timeout
        self._power_resend_after = power_resend_after
        # Each node's handle, with the target it was made for: the same
        # target again (every pass of every loop) is answered without parsing
        # its URL.
        self._handles: dict[str, tuple[BmcTarget, Bmc]] = {}
        self._used: dict[str, float] = {}  # node -> when its handle was last asked for

    def breaker_states(self) -> dict[str, int]:
        """BMC endpoints' breakers by state (for metrics)."""
        return self._pool.breaker_states()

    def threads_allowed(self) -> dict[str, int]:
        """Per protocol: worker threads that may run at once now (for metrics)."""
        return {protocol: s.limit for protocol, s in self._pool.worker_stats().items()}

    def canonical_url(self, url: str) -> str:
        """Validate a BMC URL and return its canonical form (no I/O).

        Raises:
            InvalidArgument: the URL is malformed or of an unknown scheme.
        """
        return parse_bmc_url(url).url

    def validate_target(self, url: str, username: str, password: str) -> str:
        """Check a BMC URL and the credentials against its protocol's rules
        (e.g. IPMI 2.0's 20-byte passwords); return the canonical URL. No I/O.

        Raises:
            InvalidArgument: the URL is invalid, or the protocol cannot carry
                these credentials. The message never repeats the password.
        """
        address = parse_bmc_url(url)
        registry.entry_for(address).validate_credentials(username, password)
        return address.url

    def _bmc(self, target: BmcTarget) -> Bmc:
        self._used[target.node] = time.monotonic()
        kept = self._handles.get(target.node)
        if kept is not None and kept[0] == target:
            return kept[1]
        tls = TlsOptions(verify=not target.insecure, ca_bundle=target.ca_bundle or None)
        handle = self._pool.get(
            target.node,
            parse_bmc_url(target.url),
            BmcCredentials(target.username, target.password),
            tls,
            answered_last=target.answered_last,
        )
        self._handles[target.node] = (target, handle)
        return handle

    async def power_state(self, target: BmcTarget) -> str:
        return STATES.get(await self._bmc(target).power.state(), "unknown")

    async def set_power(self, target: BmcTarget, action: str) -> str:
        if action not in ACTIONS:
            raise InvalidArgument(f"unknown power action {action!r}")
        state = await self._bmc(target).power.set(
            ACTIONS[action], self._power_timeout, resend_after=self._power_resend_after
        )
        return STATES.get(state, "unknown")

    def health(self, node: str) -> str:
        kept = self._handles.get(node)
        return kept[1].health.state if kept is not None else "unknown"

    async def thermal_c(self, target: BmcTarget) -> list[float]:
        readings = await self._bmc(target).sensors.readings()
        temps = [t for t in readings.temperatures if t.value is not None]
        # Prefer the GPUs' own sensors so a hot CPU or intake never trips a GPU
        # rule; a BMC that names none of its sensors after the GPUs gives all.
        gpus = [t for t in temps if "gpu" in t.name.lower()]
        return [t.value for t in (gpus or temps) if t.value is not None]

    async def leak_detectors(self, target: BmcTarget) -> list[LeakReading]:
        """The node's leak detectors (see ``controller.core.ports.BmcGateway``)."""
        return [leak_reading(r) for r in await self._bmc(target).leaks.poll()]

    async def firmware_versions(self, target: BmcTarget) -> dict[str, str]:
        versions: dict[str, str] = {}
        for component in await self._bmc(target).firmware.inventory():
            versions[component.id] = component.version
            versions.setdefault(component.name, component.version)
        return versions

    async def firmware_update(self, target: BmcTarget, image_url: str, component: str) -> None:
        bmc = self._bmc(target)
        found = [c for c in await bmc.firmware.inventory() if component in (c.id, c.name)]
        targets = [found[0].target] if found and found[0].target else None
        await bmc.firmware.update(image_url, targets)

    async def bios_attributes(self, target: BmcTarget) -> dict[str, object]:
        return dict(await self._bmc(target).bios.attributes())

    async def bios_set(self, target: BmcTarget, attributes: dict[str, object]) -> None:
        await self._bmc(target).bios.set(attributes)

    async def poll_power(
        self, targets: list[BmcTarget], concurrency: int, *, spread: float = 0.0
    ) -> dict[str, tuple[str | None, str]]:
        async def read(bmc: Bmc) -> PowerState:
            return await bmc.power.poll()

        result = await run_bulk(
            [(t.node, self._bmc(t)) for t in targets],
            read,
            concurrency=concurrency,
            spread=spread,
        )
        polled: dict[str, tuple[str | None, str]] = {}
        for node, outcome in result.outcomes.items():
            state = STATES.get(outcome.value, "unknown") if outcome.ok and outcome.value else None
            polled[node] = (state, self.health(node))
        return polled

    def boot_media(self, url: str) -> str:
        """How a node of this BMC URL boots an image from a URL (no I/O).

        Redfish: virtual media. IPMI has neither virtual media nor a boot
        device that names a URL (its boot flags know PXE, disk and CD, not
        UEFI HTTP boot), so it is refused here, before anything is changed.
        """
        address = parse_bmc_url(url)
        if address.protocol == "redfish":
            return "virtual_media"
        raise NotSupported(
            "provisioning an image from a URL",
            f"{address.protocol} BMC: it has no virtual media and no boot device that names "
            "a URL (UEFI HTTP boot); enrol the node by its Redfish URL to provision it",
        )

    async def insert_media(self, target: BmcTarget, image_url: str) -> None:
        await self._bmc(target).vmedia.insert(image_url)

    async def media_state(self, target: BmcTarget) -> tuple[bool, str]:
        state = await self._bmc(target).vmedia.state()
        return state.inserted, state.image_url or ""

    async def eject_media(self, target: BmcTarget) -> None:
        await self._bmc(target).vmedia.eject()

    async def boot_once(self, target: BmcTarget, device: str) -> None:
        try:
            wanted = BootDevice(device)
        except ValueError as e:
            raise InvalidArgument(f"unknown boot device {device!r}") from e
        await self._bmc(target).boot.set(wanted, persistent=False, mode=BootMode.UEFI)

    async def boot_override(self, target: BmcTarget) -> tuple[str, bool]:
        override = await self._bmc(target).boot.get()
        return override.device.value, override.persistent

    def forget(self, node: str) -> None:
        self._handles.pop(node, None)
        self._used.pop(node, None)

    def release_idle(self, idle_for: float, *, now: float | None = None) -> int:
        """Close the handles (and their BMC connections) of nodes not asked
        about for ``idle_for`` seconds; the next call makes them anew, and
        each BMC's breaker is kept. Returns how many nodes were released."""
        cutoff = (time.monotonic() if now is None else now) - idle_for
        idle = [node for node, used in self._used.items() if used < cutoff]
        for node in idle:
            del self._used[node]
            self._handles.pop(node, None)
        self._pool.release(idle)
        return len(idle)

    async def close(self) -> None:
        """Close the pool: returns within a few seconds whatever the BMCs do."""
        await self._pool.close()
