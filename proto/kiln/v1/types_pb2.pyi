from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_ENROLLED: _ClassVar[NodeState]
    NODE_STATE_INSPECTING: _ClassVar[NodeState]
    NODE_STATE_PREPARING: _ClassVar[NodeState]
    NODE_STATE_READY: _ClassVar[NodeState]
    NODE_STATE_ALLOCATED: _ClassVar[NodeState]
    NODE_STATE_RELEASING: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
    NODE_STATE_QUARANTINED: _ClassVar[NodeState]
    NODE_STATE_POWERED_OFF: _ClassVar[NodeState]
    NODE_STATE_MAINTENANCE: _ClassVar[NodeState]
    NODE_STATE_TESTING: _ClassVar[NodeState]
    NODE_STATE_PROVISIONING: _ClassVar[NodeState]

class NodeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_KIND_UNSPECIFIED: _ClassVar[NodeKind]
    NODE_KIND_COMPUTE: _ClassVar[NodeKind]
    NODE_KIND_SWITCH_TRAY: _ClassVar[NodeKind]
    NODE_KIND_POWER_SHELF: _ClassVar[NodeKind]

class PowerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POWER_STATE_UNSPECIFIED: _ClassVar[PowerState]
    POWER_STATE_ON: _ClassVar[PowerState]
    POWER_STATE_OFF: _ClassVar[PowerState]
    POWER_STATE_UNKNOWN: _ClassVar[PowerState]

class PowerAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POWER_ACTION_UNSPECIFIED: _ClassVar[PowerAction]
    POWER_ACTION_STATUS: _ClassVar[PowerAction]
    POWER_ACTION_ON: _ClassVar[PowerAction]
    POWER_ACTION_OFF: _ClassVar[PowerAction]
    POWER_ACTION_FORCE_OFF: _ClassVar[PowerAction]
    POWER_ACTION_CYCLE: _ClassVar[PowerAction]
    POWER_ACTION_RESTART: _ClassVar[PowerAction]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_ENROLLED: NodeState
NODE_STATE_INSPECTING: NodeState
NODE_STATE_PREPARING: NodeState
NODE_STATE_READY: NodeState
NODE_STATE_ALLOCATED: NodeState
NODE_STATE_RELEASING: NodeState
NODE_STATE_DRAINING: NodeState
NODE_STATE_QUARANTINED: NodeState
NODE_STATE_POWERED_OFF: NodeState
NODE_STATE_MAINTENANCE: NodeState
NODE_STATE_TESTING: NodeState
NODE_STATE_PROVISIONING: NodeState
NODE_KIND_UNSPECIFIED: NodeKind
NODE_KIND_COMPUTE: NodeKind
NODE_KIND_SWITCH_TRAY: NodeKind
NODE_KIND_POWER_SHELF: NodeKind
POWER_STATE_UNSPECIFIED: PowerState
POWER_STATE_ON: PowerState
POWER_STATE_OFF: PowerState
POWER_STATE_UNKNOWN: PowerState
POWER_ACTION_UNSPECIFIED: PowerAction
POWER_ACTION_STATUS: PowerAction
POWER_ACTION_ON: PowerAction
POWER_ACTION_OFF: PowerAction
POWER_ACTION_FORCE_OFF: PowerAction
POWER_ACTION_CYCLE: PowerAction
POWER_ACTION_RESTART: PowerAction

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "model", "serial", "pci_bus_id", "memory_mib", "architecture", "clique", "pci_device_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    CLIQUE_FIELD_NUMBER: _ClassVar[int]
    PCI_DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    serial: str
    pci_bus_id: str
    memory_mib: int
    architecture: str
    clique: str
    pci_device_id: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., serial: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., memory_mib: _Optional[int] = ..., architecture: _Optional[str] = ..., clique: _Optional[str] = ..., pci_device_id: _Optional[int] = ...) -> None: ...

class GpuHealth(_message.Message):
    __slots__ = ("index", "uuid", "lost", "temp_c", "mem_temp_c", "slowdown_c", "shutdown_c", "gpu_max_c", "power_w", "power_limit_w", "sm_clock_mhz", "mem_clock_mhz", "clock_event_reasons", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate", "remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure", "xids", "nvlink_down", "nvlink_errors", "fabric_state", "fabric_healthy", "clique", "recovery_action", "errors")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    TEMP_C_FIELD_NUMBER: _ClassVar[int]
    MEM_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    SLOWDOWN_C_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_C_FIELD_NUMBER: _ClassVar[int]
    GPU_MAX_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    REMAP_CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAP_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAP_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAP_FAILURE_FIELD_NUMBER: _ClassVar[int]
    XIDS_FIELD_NUMBER: _ClassVar[int]
    NVLINK_DOWN_FIELD_NUMBER: _ClassVar[int]
    NVLINK_ERRORS_FIELD_NUMBER: _ClassVar[int]
    FABRIC_STATE_FIELD_NUMBER: _ClassVar[int]
    FABRIC_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    CLIQUE_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ACTION_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    lost: bool
    temp_c: float
    mem_temp_c: float
    slowdown_c: float
    shutdown_c: float
    gpu_max_c: float
    power_w: float
    power_limit_w: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    clock_event_reasons: int
    ecc_sbe_volatile: int
    ecc_dbe_volatile: int
    ecc_sbe_aggregate: int
    ecc_dbe_aggregate: int
    remap_correctable: int
    remap_uncorrectable: int
    remap_pending: bool
    remap_failure: bool
    xids: _containers.RepeatedScalarFieldContainer[int]
    nvlink_down: _containers.RepeatedScalarFieldContainer[int]
    nvlink_errors: int
    fabric_state: int
    fabric_healthy: bool
    clique: str
    recovery_action: int
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., lost: _Optional[bool] = ..., temp_c: _Optional[float] = ..., mem_temp_c: _Optional[float] = ..., slowdown_c: _Optional[float] = ..., shutdown_c: _Optional[float] = ..., gpu_max_c: _Optional[float] = ..., power_w: _Optional[float] = ..., power_limit_w: _Optional[float] = ..., sm_clock_mhz: _Optional[int] = ..., mem_clock_mhz: _Optional[int] = ..., clock_event_reasons: _Optional[int] = ..., ecc_sbe_volatile: _Optional[int] = ..., ecc_dbe_volatile: _Optional[int] = ..., ecc_sbe_aggregate: _Optional[int] = ..., ecc_dbe_aggregate: _Optional[int] = ..., remap_correctable: _Optional[int] = ..., remap_uncorrectable: _Optional[int] = ..., remap_pending: _Optional[bool] = ..., remap_failure: _Optional[bool] = ..., xids: _Optional[_Iterable[int]] = ..., nvlink_down: _Optional[_Iterable[int]] = ..., nvlink_errors: _Optional[int] = ..., fabric_state: _Optional[int] = ..., fabric_healthy: _Optional[bool] = ..., clique: _Optional[str] = ..., recovery_action: _Optional[int] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeHealth(_message.Message):
    __slots__ = ("sampled_at", "source", "gpus", "bmc_temps_c", "drift")
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    BMC_TEMPS_C_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    sampled_at: float
    source: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuHealth]
    bmc_temps_c: _containers.RepeatedScalarFieldContainer[float]
    drift: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sampled_at: _Optional[float] = ..., source: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuHealth, _Mapping]]] = ..., bmc_temps_c: _Optional[_Iterable[float]] = ..., drift: _Optional[_Iterable[str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "at", "kind", "node", "allocation", "rule", "reason", "data_json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at: float
    kind: str
    node: str
    allocation: str
    rule: str
    reason: str
    data_json: str
    def __init__(self, seq: _Optional[int] = ..., at: _Optional[float] = ..., kind: _Optional[str] = ..., node: _Optional[str] = ..., allocation: _Optional[str] = ..., rule: _Optional[str] = ..., reason: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...
