"""A node's health report, typed: what an agent (or the BMC fallback) saw.

The API layer builds these from the wire (``controller.api.convert``); the
store keeps the latest one per node; the policies and the health gate read
them. A reading that was not taken, failed or is not a number is ``None``.
"""

from __future__ import annotations

from kiln_common.values import value_class


@value_class
class GpuHealth:
    index: int
    uuid: str = ""
    lost: bool = False
    temp_c: float | None = None
    mem_temp_c: float | None = None
    slowdown_c: float | None = None
    shutdown_c: float | None = None
    gpu_max_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    clock_event_reasons: int = 0
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    xids: tuple[int, ...] = ()  # XIDs seen since the previous sample
    nvlink_down: tuple[int, ...] = ()
    nvlink_errors: int = 0
    fabric_state: int = 0
    fabric_healthy: bool = False
    clique: str = ""
    recovery_action: int = 0
    errors: tuple[str, ...] = ()  # readings that failed, e.g. "remapped rows: Not Supported"


@value_class
class HealthReport:
    sampled_at: float = 0.0  # unix seconds
    source: str = "agent"  # "agent" or "bmc"
    gpus: tuple[GpuHealth, ...] = ()
    bmc_temps_c: tuple[float, ...] = ()
    # GPU settings the agent found drifted from its profile and re-applied.
    drift: tuple[str, ...] = ()


@value_class
class HealthSample:
    """A node's latest report and when its agent was last heard from, as the
    write-behind persists it (``controller/core/live.py``)."""

    node: str
    health: HealthReport | None  # None: a sighting only; the stored report stays
    seen_at: float
