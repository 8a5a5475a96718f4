"""What the core measures as it works, for the controller's metrics.

The core calls a ``Meter`` at the moments worth counting (a scheduling pass,
a policy action, a health report, a power-sync pass, a BMC call); the
controller's wiring plugs in ``controller.metrics.PrometheusMeter``, which
turns them into Prometheus series. The core itself imports no metrics
library: ``NullMeter`` (the default) drops everything, so tests and the
simulated fleet need no registry.
"""

from __future__ import annotations

from typing import Protocol


class Meter(Protocol):
    def placement(self, seconds: float) -> None:
        """One scheduling pass took ``seconds``."""
        ...

    def admitted(self, waited_seconds: float) -> None:
        """An allocation was admitted after waiting ``waited_seconds``."""
        ...

    def policy_action(self, rule: str, action: str, outcome: str) -> None:
        """A policy action: executed, dry_run, capped or failed."""
        ...

    def health_report(self) -> None:
        """An agent's health report was taken in."""
        ...

    def power_sync_pass(self, seconds: float, rows_written: int) -> None: ...

    def bmc_call(self, protocol: str, operation: str, seconds: float, ok: bool) -> None:
        """One BMC call (with its retries) ended after ``seconds``."""
        ...


class NullMeter:
    """Measures nothing."""

    def placement(self, seconds: float) -> None:
        pass

    def admitted(self, waited_seconds: float) -> None:
        pass

    def policy_action(self, rule: str, action: str, outcome: str) -> None:
        pass

    def health_report(self) -> None:
        pass

    def power_sync_pass(self, seconds: float, rows_written: int) -> None:
        pass

    def bmc_call(self, protocol: str, operation: str, seconds: float, ok: bool) -> None:
        pass
