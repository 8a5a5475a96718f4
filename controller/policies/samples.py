"""Health samples: what the policy engine observes.

A :class:`HealthSample` is one report about one node at one instant. Agents
build them from NVML (``source="agent"``, one :class:`GpuReading` per GPU);
when a node's agent falls silent the controller builds them from the BMC's
Redfish thermal sensors instead (``source="bmc"``, ``bmc_temps_c`` filled, no
per-GPU data). Values the reporter could not read are ``None``; the engine
treats ``None``, NaN and physically impossible values as "unknown", never as a
reason to act.

``xids`` holds the XID errors seen on that GPU *since the previous sample* of
the same node (events, not a level): a sample without an XID ends its episode.
"""

from __future__ import annotations

from typing import Literal

from kiln_common.values import value_class

SampleSource = Literal["agent", "bmc"]


@value_class
class GpuReading:
    """One GPU's health at the instant of a sample.

    ``temp_c`` is the GPU core temperature; ``slowdown_c`` and ``shutdown_c``
    are the part's own thresholds as NVML reports them (``None`` when unknown).
    ``lost`` marks a GPU that has fallen off the bus (NVML ``GpuIsLost``).
    ``recovery_action`` is NVML's ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` field
    (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset; see
    :class:`controller.policies.rules.RecoveryAction`), ``None`` when not read.
    Unlike ``xids`` it is a level: it stays set until the GPU is recovered.
    """

    index: int
    temp_c: float | None
    slowdown_c: float | None
    shutdown_c: float | None
    dbe_volatile: int | None = None
    remap_failure: bool | None = None
    remap_pending: bool | None = None
    xids: tuple[int, ...] = ()
    lost: bool = False
    nvlink_down: int | None = None  # links down (None: not known)
    fabric_degraded: bool | None = None  # None: no fabric (HGX) or not joined yet
    recovery_action: int | None = None  # NVML's recovery action field (None: not read)


@value_class
class HealthSample:
    """One health report for ``node`` (in ``rack``) taken at ``at`` (unix seconds).

    ``source`` is ``"agent"`` (NVML, ``gpus`` filled) or ``"bmc"`` (Redfish
    fallback, ``bmc_temps_c`` filled with the BMC's GPU temperature sensors).
    """

    node: str
    rack: str
    at: float
    source: str
    gpus: tuple[GpuReading, ...] = ()
    bmc_temps_c: tuple[float, ...] = ()
