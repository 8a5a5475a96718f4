"""The typed, validated form of a policy rule set.

Nothing here parses YAML (see :mod:`controller.policies.loader`) or keeps
state (see :mod:`controller.policies.engine`). Every value is immutable, so a
:class:`RuleSet` can be shared by any number of engines.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum


class ActionKind(StrEnum):
    """What a rule asks the controller to do to a node."""

    DRAIN = "drain"
    NOTIFY_JOB = "notify_job"
    POWER_OFF_GRACEFUL = "power_off_graceful"
    POWER_OFF_NOW = "power_off_now"
    QUARANTINE = "quarantine"
    POWER_CYCLE = "power_cycle"  # a reboot: the BMC power-cycles the node
    RESET_GPU = "reset_gpu"  # reset the GPUs that fired once the node is idle


#: Kinds that take a node down and are therefore subject to caps.
POWER_OFF_KINDS = frozenset({ActionKind.POWER_OFF_GRACEFUL, ActionKind.POWER_OFF_NOW})
#: Kinds that take a node out of service: what a rule set's blast radius may count.
#: A GPU reset does: the node leaves scheduling (an allocated one drains) until
#: its GPUs are reset and report healthy again.
TAKE_DOWN_KINDS = frozenset(
    {
        ActionKind.DRAIN,
        ActionKind.QUARANTINE,
        ActionKind.POWER_CYCLE,
        ActionKind.RESET_GPU,
        *POWER_OFF_KINDS,
    }
)


class RecoveryAction(IntEnum):
    """What the driver says a GPU needs: NVML's ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``
    field (``nvmlDeviceGpuRecoveryAction_t``). Rules name them in lower case
    (``gpu_reset``); a value not listed here is unknown to Kiln."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7

    @property
    def label(self) -> str:
        """The name rules use: ``gpu_reset``, ``drain_and_reset``, ..."""
        return self.name.lower()

    @classmethod
    def named(cls, label: str) -> RecoveryAction | None:
        """The action a rule names (``"gpu_reset"``), or None for an unknown name."""
        try:
            return cls[label.upper()] if label == label.lower() else None
        except KeyError:
            return None

    @classmethod
    def known(cls, code: int) -> RecoveryAction | None:
        """The action of a field value, or None for a value Kiln does not know."""
        return cls(code) if code in RECOVERY_CODES else None


# The field values Kiln knows, for a set lookup where only that is asked
# (the policies read every GPU of every report).
RECOVERY_CODES = frozenset(int(action) for action in RecoveryAction)


class Metric(StrEnum):
    """Metrics a rule can test. Temperatures are per GPU (or per BMC sensor)."""

    GPU_TEMP_C = "gpu_temp_c"
    GPU_TEMP_MARGIN_TO_SLOWDOWN_C = "gpu_temp_margin_to_slowdown_c"
    GPU_TEMP_MARGIN_TO_SHUTDOWN_C = "gpu_temp_margin_to_shutdown_c"
    ECC_DBE_VOLATILE = "ecc_dbe_volatile"
    REMAP_FAILURE = "remap_failure"
    REMAP_PENDING = "remap_pending"
    GPU_LOST = "gpu_lost"
    XID = "xid"
    NVLINK_DOWN = "nvlink_down"  # how many of the GPU's NVLinks are down
    FABRIC_DEGRADED = "fabric_degraded"  # NVLink fabric joined but not healthy
    RECOVERY_ACTION = "recovery_action"  # NVML's recovery action field (RecoveryAction)


NUMERIC_METRICS = frozenset(
    {
        Metric.GPU_TEMP_C,
        Metric.GPU_TEMP_MARGIN_TO_SLOWDOWN_C,
        Metric.GPU_TEMP_MARGIN_TO_SHUTDOWN_C,
        Metric.ECC_DBE_VOLATILE,
        Metric.NVLINK_DOWN,
    }
)
BOOL_METRICS = frozenset(
    {Metric.REMAP_FAILURE, Metric.REMAP_PENDING, Metric.GPU_LOST, Metric.FABRIC_DEGRADED}
)
#: Metrics a BMC-sourced sample can feed (it has no per-GPU NVML data).
THERMAL_METRICS = frozenset(
    {
        Metric.GPU_TEMP_C,
        Metric.GPU_TEMP_MARGIN_TO_SLOWDOWN_C,
        Metric.GPU_TEMP_MARGIN_TO_SHUTDOWN_C,
    }
)


class Op(StrEnum):
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    IN = "in"


COMPARISONS: dict[Op, Callable[[float, float], bool]] = {
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
}


@dataclass(frozen=True, slots=True)
class Condition:
    """``metric op value``. For :attr:`Op.IN` ``value`` is a frozenset of XIDs
    or of :class:`RecoveryAction` codes; for ``recovery_action ==``/``!=`` it
    is the action's code."""

    metric: Metric
    op: Op
    value: float | bool | frozenset[int]

    def holds(self, observed: float | bool | tuple[int, ...]) -> bool:
        """Whether a *valid* observed value satisfies the condition: for
        ``xid`` a tuple of XIDs (any one in the set matches), for
        ``recovery_action`` the field's code."""
        if self.op is Op.IN:
            assert isinstance(self.value, frozenset)
            if isinstance(observed, tuple):
                return any(x in self.value for x in observed)
            return observed in self.value
        assert not isinstance(self.value, frozenset) and not isinstance(observed, tuple)
        return COMPARISONS[self.op](observed, self.value)

    def holds_for_any(self, observed: Sequence[float | bool | tuple[int, ...] | None]) -> bool:
        """Whether ``holds`` for some known (not None) value of ``observed``:
        every rule asks this of every report, so a comparison is looked up once."""
        if self.op is Op.IN:
            assert isinstance(self.value, frozenset)
            wanted = self.value
            for v in observed:
                if v is None:
                    continue
                if isinstance(v, tuple):
                    if not wanted.isdisjoint(v):
                        return True
                elif v in wanted:
                    return True
            return False
        compare = COMPARISONS[self.op]
        limit = self.value
        for v in observed:
            if v is not None and compare(v, limit):  # type: ignore[arg-type]
                return True
        return False

    def describe(self) -> str:
        if self.metric is Metric.RECOVERY_ACTION:
            codes = self.value if isinstance(self.value, frozenset) else {self.value}
            names = sorted(RecoveryAction(int(c)).label for c in codes)
            if self.op is Op.IN:
                return f"{self.metric} in [{', '.join(names)}]"
            return f"{self.metric} {self.op} {names[0]}"
        if isinstance(self.value, frozenset):
            return f"{self.metric} in {sorted(self.value)}"
        value = str(self.value).lower() if isinstance(self.value, bool) else f"{self.value:g}"
        return f"{self.metric} {self.op} {value}"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Absolute thresholds used when a sample carries no usable per-GPU one."""

    slowdown_c: float | None = None
    shutdown_c: float | None = None


@dataclass(frozen=True, slots=True)
class Cap:
    """At most ``per_rack`` nodes per rack and ``fleet`` nodes in all, per rule,
    within any sliding ``window_s`` seconds. ``None`` means unlimited."""

    per_rack: int | None
    fleet: int | None
    window_s: float


DEFAULT_CAP = Cap(per_rack=2, fleet=10, window_s=600.0)


@dataclass(frozen=True, slots=True)
class Caps:
    power_off: Cap = DEFAULT_CAP
    power_cycle: Cap = DEFAULT_CAP

    def for_kind(self, kind: ActionKind) -> Cap | None:
        if kind in POWER_OFF_KINDS:
            return self.power_off
        if kind is ActionKind.POWER_CYCLE:
            return self.power_cycle
        return None


@dataclass(frozen=True, slots=True)
class BlastRadius:
    """What all rules *together* may take out of service: at most
    ``cap.per_rack`` distinct nodes per rack and ``cap.fleet`` in all within
    any sliding ``cap.window_s``, counted over every rule's actions of
    ``kinds``. It bounds the rule set as a whole, on top of each rule's own
    :class:`Caps`."""

    cap: Cap = DEFAULT_CAP
    kinds: frozenset[ActionKind] = TAKE_DOWN_KINDS


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One entry of a rule's ``actions``.

    ``after_s`` delays the action from the moment the rule fires (only
    graceful power-off uses it). ``on_xids`` restricts the action to episodes
    where one of those XIDs was seen (``power_cycle_on_xid``).
    """

    kind: ActionKind
    after_s: float = 0.0
    on_xids: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """A validated rule; ``thresholds`` and ``caps`` are already merged with the
    rule set's defaults."""

    name: str
    when: Condition
    actions: tuple[ActionSpec, ...]
    for_s: float | None = None
    for_samples: int | None = None
    dry_run: bool = False
    thresholds: Thresholds = Thresholds()
    caps: Caps = Caps()

    @property
    def sustained(self) -> bool:
        """Whether the rule needs more than one sample to fire."""
        return self.for_s is not None or self.for_samples is not None


@dataclass(frozen=True, slots=True)
class RuleSet:
    """A whole, validated rule set (``version: v1``).

    ``max_sample_gap_s``: if two samples of a node are further apart than this,
    every ``for:``/``for_samples:`` streak on that node restarts.
    ``blast_radius``: the budget shared by all rules (None: only per-rule caps).
    """

    rules: tuple[Rule, ...]
    dry_run: bool = False
    max_sample_gap_s: float = 30.0
    blast_radius: BlastRadius | None = None

    @property
    def cap_window_s(self) -> float:
        """The longest window any cap looks back over: how much history a
        restarted engine needs (:meth:`PolicyEngine.restore`)."""
        windows = [c.window_s for r in self.rules for c in (r.caps.power_off, r.caps.power_cycle)]
        if self.blast_radius is not None:
            windows.append(self.blast_radius.cap.window_s)
        return max(windows, default=0.0)
