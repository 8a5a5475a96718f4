"""The small interfaces the domain core drives; adapters implement them.

The core never imports a BMC library or the wire format: the controller's
wiring (``controller.server``) plugs real implementations in.
"""

from __future__ import annotations

from typing import Protocol

from controller.core.model import BmcTarget


class BmcGateway(Protocol):
    def canonical_url(self, url: str) -> str:
        """Validate a BMC URL and return its canonical form.

        Raises:
            InvalidArgument: the URL is malformed or of an unknown scheme.
        """
        ...

    async def power_state(self, target: BmcTarget) -> str:
        """Return "on", "off" or "unknown". Raises BmcError and its kin."""
        ...

    async def set_power(self, target: BmcTarget, action: str) -> str:
        """Run a power action (on, off, force_off, cycle, restart), poll until it
        lands and return the final state. Idempotent: already there is success."""
        ...

    def health(self, node: str) -> str:
        """ "ok", "degraded", "unreachable" or "unknown" (never contacted)."""
        ...

    async def thermal_c(self, target: BmcTarget) -> list[float]:
        """The BMC's own temperature readings in °C (the agent-silent fallback)."""
        ...

    async def firmware_versions(self, target: BmcTarget) -> dict[str, str]:
        """Firmware component (id and name both as keys) → installed version.
        Raises NotSupported when the BMC has no firmware inventory."""
        ...

    async def firmware_update(self, target: BmcTarget, image_url: str, component: str) -> None:
        """Update one component from ``image_url`` and follow the task to its end."""
        ...

    async def bios_attributes(self, target: BmcTarget) -> dict[str, object]:
        """Current BIOS attributes. Raises NotSupported when the BMC has none."""
        ...

    async def bios_set(self, target: BmcTarget, attributes: dict[str, object]) -> None:
        """Stage BIOS attributes; they apply at the next reboot."""
        ...

    async def poll_power(
        self, targets: list[BmcTarget], concurrency: int
    ) -> dict[str, tuple[str | None, str]]:
        """Read many BMCs' power at once: node → (state or None on failure, health).
        Never raises for one BMC's failure; a broken BMC never slows the rest."""
        ...

    def forget(self, node: str) -> None:
        """Drop any cached connection for ``node`` (after re-enrolment)."""
        ...

    async def close(self) -> None: ...
