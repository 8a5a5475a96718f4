"""Small builders for health samples and rule sets used by the policy tests."""

from __future__ import annotations

from collections.abc import Iterable

from controller.policies import Action, GpuReading, HealthSample, PolicyEngine, load_rules

H100_SLOWDOWN = 89.0
H100_SHUTDOWN = 92.0


def gpu(
    index: int = 0,
    temp: float | None = 50.0,
    *,
    slowdown: float | None = H100_SLOWDOWN,
    shutdown: float | None = H100_SHUTDOWN,
    dbe: int | None = 0,
    remap_failure: bool | None = False,
    remap_pending: bool | None = False,
    xids: tuple[int, ...] = (),
    lost: bool = False,
    nvlink_down: int | None = 0,
    fabric_degraded: bool | None = None,
    recovery_action: int | None = 0,
) -> GpuReading:
    return GpuReading(
        index=index,
        temp_c=temp,
        slowdown_c=slowdown,
        shutdown_c=shutdown,
        dbe_volatile=dbe,
        remap_failure=remap_failure,
        remap_pending=remap_pending,
        xids=xids,
        lost=lost,
        nvlink_down=nvlink_down,
        fabric_degraded=fabric_degraded,
        recovery_action=recovery_action,
    )


def agent(node: str, at: float, *gpus: GpuReading, rack: str = "r1") -> HealthSample:
    """An agent sample; with no GPUs given, eight cool healthy ones."""
    readings = gpus or tuple(gpu(i) for i in range(8))
    return HealthSample(node=node, rack=rack, at=at, source="agent", gpus=tuple(readings))


def hot(node: str, at: float, temp: float, *, hot_index: int = 3, rack: str = "r1") -> HealthSample:
    """Eight GPUs, one of them (``hot_index``) at ``temp``."""
    gpus = tuple(gpu(i, temp if i == hot_index else 50.0) for i in range(8))
    return HealthSample(node=node, rack=rack, at=at, source="agent", gpus=gpus)


def bmc(node: str, at: float, *temps: float, rack: str = "r1") -> HealthSample:
    return HealthSample(node=node, rack=rack, at=at, source="bmc", bmc_temps_c=tuple(temps))


def feed(engine: PolicyEngine, samples: Iterable[HealthSample]) -> list[Action]:
    out: list[Action] = []
    for s in samples:
        out.extend(engine.observe(s))
    return out


def kinds(actions: Iterable[Action]) -> list[str]:
    return [str(a.kind) for a in actions]


def engine_for(yaml_text: str) -> PolicyEngine:
    return PolicyEngine(load_rules(yaml_text))
