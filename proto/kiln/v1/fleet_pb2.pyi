from kiln.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopologyFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPOLOGY_FORMAT_UNSPECIFIED: _ClassVar[TopologyFormat]
    TOPOLOGY_FORMAT_SLURM: _ClassVar[TopologyFormat]
    TOPOLOGY_FORMAT_K8S_LABELS: _ClassVar[TopologyFormat]

class TopologyLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPOLOGY_LEVEL_UNSPECIFIED: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_NVLINK: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_LEAF: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_SPINE: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_ANY: _ClassVar[TopologyLevel]

class AllocationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALLOCATION_STATE_UNSPECIFIED: _ClassVar[AllocationState]
    ALLOCATION_STATE_PENDING: _ClassVar[AllocationState]
    ALLOCATION_STATE_PREPARING: _ClassVar[AllocationState]
    ALLOCATION_STATE_READY: _ClassVar[AllocationState]
    ALLOCATION_STATE_RELEASING: _ClassVar[AllocationState]
    ALLOCATION_STATE_RELEASED: _ClassVar[AllocationState]
    ALLOCATION_STATE_FAILED: _ClassVar[AllocationState]
TOPOLOGY_FORMAT_UNSPECIFIED: TopologyFormat
TOPOLOGY_FORMAT_SLURM: TopologyFormat
TOPOLOGY_FORMAT_K8S_LABELS: TopologyFormat
TOPOLOGY_LEVEL_UNSPECIFIED: TopologyLevel
TOPOLOGY_LEVEL_NVLINK: TopologyLevel
TOPOLOGY_LEVEL_LEAF: TopologyLevel
TOPOLOGY_LEVEL_SPINE: TopologyLevel
TOPOLOGY_LEVEL_ANY: TopologyLevel
ALLOCATION_STATE_UNSPECIFIED: AllocationState
ALLOCATION_STATE_PENDING: AllocationState
ALLOCATION_STATE_PREPARING: AllocationState
ALLOCATION_STATE_READY: AllocationState
ALLOCATION_STATE_RELEASING: AllocationState
ALLOCATION_STATE_RELEASED: AllocationState
ALLOCATION_STATE_FAILED: AllocationState

class Node(_message.Message):
    __slots__ = ("name", "rack", "leaf", "spine", "bmc_url", "bmc_username", "state", "state_reason", "power", "bmc_health", "agent_connected", "agent_last_seen", "gpu_model", "gpu_count", "gpus", "nvlink_domain", "allocation", "health", "profile", "updated_at", "schedulable", "agent_cert_expires_at", "power_block", "kind", "rack_hold")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    SPINE_FIELD_NUMBER: _ClassVar[int]
    BMC_URL_FIELD_NUMBER: _ClassVar[int]
    BMC_USERNAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    BMC_HEALTH_FIELD_NUMBER: _ClassVar[int]
    AGENT_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    AGENT_LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NVLINK_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_FIELD_NUMBER: _ClassVar[int]
    AGENT_CERT_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    POWER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RACK_HOLD_FIELD_NUMBER: _ClassVar[int]
    name: str
    rack: str
    leaf: str
    spine: str
    bmc_url: str
    bmc_username: str
    state: _types_pb2.NodeState
    state_reason: str
    power: _types_pb2.PowerState
    bmc_health: str
    agent_connected: bool
    agent_last_seen: float
    gpu_model: str
    gpu_count: int
    gpus: _containers.RepeatedCompositeFieldContainer[_types_pb2.Gpu]
    nvlink_domain: str
    allocation: str
    health: _types_pb2.NodeHealth
    profile: str
    updated_at: float
    schedulable: bool
    agent_cert_expires_at: float
    power_block: str
    kind: _types_pb2.NodeKind
    rack_hold: str
    def __init__(self, name: _Optional[str] = ..., rack: _Optional[str] = ..., leaf: _Optional[str] = ..., spine: _Optional[str] = ..., bmc_url: _Optional[str] = ..., bmc_username: _Optional[str] = ..., state: _Optional[_Union[_types_pb2.NodeState, str]] = ..., state_reason: _Optional[str] = ..., power: _Optional[_Union[_types_pb2.PowerState, str]] = ..., bmc_health: _Optional[str] = ..., agent_connected: _Optional[bool] = ..., agent_last_seen: _Optional[float] = ..., gpu_model: _Optional[str] = ..., gpu_count: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[_types_pb2.Gpu, _Mapping]]] = ..., nvlink_domain: _Optional[str] = ..., allocation: _Optional[str] = ..., health: _Optional[_Union[_types_pb2.NodeHealth, _Mapping]] = ..., profile: _Optional[str] = ..., updated_at: _Optional[float] = ..., schedulable: _Optional[bool] = ..., agent_cert_expires_at: _Optional[float] = ..., power_block: _Optional[str] = ..., kind: _Optional[_Union[_types_pb2.NodeKind, str]] = ..., rack_hold: _Optional[str] = ...) -> None: ...

class EnrollNodeRequest(_message.Message):
    __slots__ = ("name", "bmc_url", "username", "password", "rack", "leaf", "spine", "insecure", "ca_bundle", "profile", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BMC_URL_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    SPINE_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    CA_BUNDLE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    bmc_url: str
    username: str
    password: str
    rack: str
    leaf: str
    spine: str
    insecure: bool
    ca_bundle: str
    profile: str
    kind: _types_pb2.NodeKind
    def __init__(self, name: _Optional[str] = ..., bmc_url: _Optional[str] = ..., username: _Optional[str] = ..., password: _Optional[str] = ..., rack: _Optional[str] = ..., leaf: _Optional[str] = ..., spine: _Optional[str] = ..., insecure: _Optional[bool] = ..., ca_bundle: _Optional[str] = ..., profile: _Optional[str] = ..., kind: _Optional[_Union[_types_pb2.NodeKind, str]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("rack", "state", "page_size", "page_token", "gpu_model", "allocation")
    RACK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    rack: str
    state: _types_pb2.NodeState
    page_size: int
    page_token: str
    gpu_model: str
    allocation: str
    def __init__(self, rack: _Optional[str] = ..., state: _Optional[_Union[_types_pb2.NodeState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., gpu_model: _Optional[str] = ..., allocation: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PowerNodeRequest(_message.Message):
    __slots__ = ("name", "action")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    action: _types_pb2.PowerAction
    def __init__(self, name: _Optional[str] = ..., action: _Optional[_Union[_types_pb2.PowerAction, str]] = ...) -> None: ...

class PowerNodeResponse(_message.Message):
    __slots__ = ("name", "power", "bmc_health")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    BMC_HEALTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    power: _types_pb2.PowerState
    bmc_health: str
    def __init__(self, name: _Optional[str] = ..., power: _Optional[_Union[_types_pb2.PowerState, str]] = ..., bmc_health: _Optional[str] = ...) -> None: ...

class PowerNodesRequest(_message.Message):
    __slots__ = ("names", "rack", "all", "action", "concurrency")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    rack: str
    all: bool
    action: _types_pb2.PowerAction
    concurrency: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., rack: _Optional[str] = ..., all: _Optional[bool] = ..., action: _Optional[_Union[_types_pb2.PowerAction, str]] = ..., concurrency: _Optional[int] = ...) -> None: ...

class PowerProgress(_message.Message):
    __slots__ = ("node", "ok", "power", "error", "done", "total")
    NODE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    node: str
    ok: bool
    power: _types_pb2.PowerState
    error: str
    done: int
    total: int
    def __init__(self, node: _Optional[str] = ..., ok: _Optional[bool] = ..., power: _Optional[_Union[_types_pb2.PowerState, str]] = ..., error: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class ProvisionNodesRequest(_message.Message):
    __slots__ = ("names", "rack", "image", "concurrency", "image_server")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SERVER_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    rack: str
    image: str
    concurrency: int
    image_server: str
    def __init__(self, names: _Optional[_Iterable[str]] = ..., rack: _Optional[str] = ..., image: _Optional[str] = ..., concurrency: _Optional[int] = ..., image_server: _Optional[str] = ...) -> None: ...

class ProvisionProgress(_message.Message):
    __slots__ = ("node", "phase", "ok", "error", "image", "image_url", "done", "total", "elapsed_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_URL_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    node: str
    phase: str
    ok: bool
    error: str
    image: str
    image_url: str
    done: int
    total: int
    elapsed_s: float
    def __init__(self, node: _Optional[str] = ..., phase: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., image: _Optional[str] = ..., image_url: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., elapsed_s: _Optional[float] = ...) -> None: ...

class BringUpRackRequest(_message.Message):
    __slots__ = ("rack", "members", "image", "profile", "timeout_s", "concurrency")
    RACK_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    rack: str
    members: _containers.RepeatedCompositeFieldContainer[EnrollNodeRequest]
    image: str
    profile: str
    timeout_s: float
    concurrency: int
    def __init__(self, rack: _Optional[str] = ..., members: _Optional[_Iterable[_Union[EnrollNodeRequest, _Mapping]]] = ..., image: _Optional[str] = ..., profile: _Optional[str] = ..., timeout_s: _Optional[float] = ..., concurrency: _Optional[int] = ...) -> None: ...

class BringUpProgress(_message.Message):
    __slots__ = ("rack", "node", "phase", "ok", "message", "ready", "total", "elapsed_s", "report")
    RACK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    rack: str
    node: str
    phase: str
    ok: bool
    message: str
    ready: int
    total: int
    elapsed_s: float
    report: BringUpReport
    def __init__(self, rack: _Optional[str] = ..., node: _Optional[str] = ..., phase: _Optional[str] = ..., ok: _Optional[bool] = ..., message: _Optional[str] = ..., ready: _Optional[int] = ..., total: _Optional[int] = ..., elapsed_s: _Optional[float] = ..., report: _Optional[_Union[BringUpReport, _Mapping]] = ...) -> None: ...

class BringUpReport(_message.Message):
    __slots__ = ("rack", "rack_ready", "trays", "elapsed_s", "slowest_tray_s", "fabric_clique", "reason")
    RACK_FIELD_NUMBER: _ClassVar[int]
    RACK_READY_FIELD_NUMBER: _ClassVar[int]
    TRAYS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    SLOWEST_TRAY_S_FIELD_NUMBER: _ClassVar[int]
    FABRIC_CLIQUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    rack: str
    rack_ready: bool
    trays: _containers.RepeatedCompositeFieldContainer[TrayReport]
    elapsed_s: float
    slowest_tray_s: float
    fabric_clique: str
    reason: str
    def __init__(self, rack: _Optional[str] = ..., rack_ready: _Optional[bool] = ..., trays: _Optional[_Iterable[_Union[TrayReport, _Mapping]]] = ..., elapsed_s: _Optional[float] = ..., slowest_tray_s: _Optional[float] = ..., fabric_clique: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TrayReport(_message.Message):
    __slots__ = ("node", "kind", "state", "ok", "reason", "firmware", "clique", "ready_s", "power")
    class FirmwareEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    CLIQUE_FIELD_NUMBER: _ClassVar[int]
    READY_S_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    node: str
    kind: _types_pb2.NodeKind
    state: _types_pb2.NodeState
    ok: bool
    reason: str
    firmware: _containers.ScalarMap[str, str]
    clique: str
    ready_s: float
    power: _types_pb2.PowerState
    def __init__(self, node: _Optional[str] = ..., kind: _Optional[_Union[_types_pb2.NodeKind, str]] = ..., state: _Optional[_Union[_types_pb2.NodeState, str]] = ..., ok: _Optional[bool] = ..., reason: _Optional[str] = ..., firmware: _Optional[_Mapping[str, str]] = ..., clique: _Optional[str] = ..., ready_s: _Optional[float] = ..., power: _Optional[_Union[_types_pb2.PowerState, str]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class UndrainNodeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("name", "force", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    force: bool
    reason: str
    def __init__(self, name: _Optional[str] = ..., force: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class RemoveNodeResponse(_message.Message):
    __slots__ = ("name", "allocation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    allocation: str
    def __init__(self, name: _Optional[str] = ..., allocation: _Optional[str] = ...) -> None: ...

class Rack(_message.Message):
    __slots__ = ("name", "nvlink_domain", "gpu_model", "nodes", "gpus", "ready", "allocated", "leaf", "spine", "members", "hold")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NVLINK_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    SPINE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    name: str
    nvlink_domain: str
    gpu_model: str
    nodes: int
    gpus: int
    ready: int
    allocated: int
    leaf: str
    spine: str
    members: int
    hold: str
    def __init__(self, name: _Optional[str] = ..., nvlink_domain: _Optional[str] = ..., gpu_model: _Optional[str] = ..., nodes: _Optional[int] = ..., gpus: _Optional[int] = ..., ready: _Optional[int] = ..., allocated: _Optional[int] = ..., leaf: _Optional[str] = ..., spine: _Optional[str] = ..., members: _Optional[int] = ..., hold: _Optional[str] = ...) -> None: ...

class ListRacksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRacksResponse(_message.Message):
    __slots__ = ("racks",)
    RACKS_FIELD_NUMBER: _ClassVar[int]
    racks: _containers.RepeatedCompositeFieldContainer[Rack]
    def __init__(self, racks: _Optional[_Iterable[_Union[Rack, _Mapping]]] = ...) -> None: ...

class ExportTopologyRequest(_message.Message):
    __slots__ = ("format",)
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    format: TopologyFormat
    def __init__(self, format: _Optional[_Union[TopologyFormat, str]] = ...) -> None: ...

class ExportTopologyResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class AllocationSpec(_message.Message):
    __slots__ = ("nodes", "racks", "gpu_model", "topology", "preferred", "segment", "spares_per_domain", "exclusive", "queue", "priority", "profile")
    NODES_FIELD_NUMBER: _ClassVar[int]
    RACKS_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    SPARES_PER_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    racks: int
    gpu_model: str
    topology: TopologyLevel
    preferred: bool
    segment: int
    spares_per_domain: int
    exclusive: bool
    queue: str
    priority: int
    profile: str
    def __init__(self, nodes: _Optional[int] = ..., racks: _Optional[int] = ..., gpu_model: _Optional[str] = ..., topology: _Optional[_Union[TopologyLevel, str]] = ..., preferred: _Optional[bool] = ..., segment: _Optional[int] = ..., spares_per_domain: _Optional[int] = ..., exclusive: _Optional[bool] = ..., queue: _Optional[str] = ..., priority: _Optional[int] = ..., profile: _Optional[str] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("id", "key", "spec", "state", "reason", "nodes", "spares", "domains", "created_at", "updated_at", "created_by")
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
    DOMAINS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    key: str
    spec: AllocationSpec
    state: AllocationState
    reason: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    spares: _containers.RepeatedScalarFieldContainer[str]
    domains: _containers.RepeatedScalarFieldContainer[str]
    created_at: float
    updated_at: float
    created_by: str
    def __init__(self, id: _Optional[str] = ..., key: _Optional[str] = ..., spec: _Optional[_Union[AllocationSpec, _Mapping]] = ..., state: _Optional[_Union[AllocationState, str]] = ..., reason: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., spares: _Optional[_Iterable[str]] = ..., domains: _Optional[_Iterable[str]] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., created_by: _Optional[str] = ...) -> None: ...

class CreateAllocationRequest(_message.Message):
    __slots__ = ("key", "spec")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    key: str
    spec: AllocationSpec
    def __init__(self, key: _Optional[str] = ..., spec: _Optional[_Union[AllocationSpec, _Mapping]] = ...) -> None: ...

class GetAllocationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListAllocationsRequest(_message.Message):
    __slots__ = ("include_released", "page_size", "page_token", "state")
    INCLUDE_RELEASED_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    include_released: bool
    page_size: int
    page_token: str
    state: AllocationState
    def __init__(self, include_released: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[AllocationState, str]] = ...) -> None: ...

class ListAllocationsResponse(_message.Message):
    __slots__ = ("allocations", "next_page_token")
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    next_page_token: str
    def __init__(self, allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReleaseAllocationRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("after_seq", "follow", "node", "allocation", "from_now")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    FROM_NOW_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    follow: bool
    node: str
    allocation: str
    from_now: bool
    def __init__(self, after_seq: _Optional[int] = ..., follow: _Optional[bool] = ..., node: _Optional[str] = ..., allocation: _Optional[str] = ..., from_now: _Optional[bool] = ...) -> None: ...

class InjectFaultRequest(_message.Message):
    __slots__ = ("node", "fault_json")
    NODE_FIELD_NUMBER: _ClassVar[int]
    FAULT_JSON_FIELD_NUMBER: _ClassVar[int]
    node: str
    fault_json: str
    def __init__(self, node: _Optional[str] = ..., fault_json: _Optional[str] = ...) -> None: ...

class InjectFaultResponse(_message.Message):
    __slots__ = ("ok", "message")
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    message: str
    def __init__(self, ok: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("identity", "role", "method")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    identity: str
    role: str
    method: str
    def __init__(self, identity: _Optional[str] = ..., role: _Optional[str] = ..., method: _Optional[str] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("name", "role", "created_at", "expires_at", "revoked", "created_by", "last_used_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    created_at: float
    expires_at: float
    revoked: bool
    created_by: str
    last_used_at: float
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., created_at: _Optional[float] = ..., expires_at: _Optional[float] = ..., revoked: _Optional[bool] = ..., created_by: _Optional[str] = ..., last_used_at: _Optional[float] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("name", "role", "ttl_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    ttl_s: float
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "secret")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    token: Token
    secret: str
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ("include_revoked",)
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    include_revoked: bool
    def __init__(self, include_revoked: _Optional[bool] = ...) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("seq", "at", "who", "role", "method", "arguments_json", "code", "detail")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at: float
    who: str
    role: str
    method: str
    arguments_json: str
    code: str
    detail: str
    def __init__(self, seq: _Optional[int] = ..., at: _Optional[float] = ..., who: _Optional[str] = ..., role: _Optional[str] = ..., method: _Optional[str] = ..., arguments_json: _Optional[str] = ..., code: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("since", "who", "method", "limit")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    since: float
    who: str
    method: str
    limit: int
    def __init__(self, since: _Optional[float] = ..., who: _Optional[str] = ..., method: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...

class SetNodeCredentialsRequest(_message.Message):
    __slots__ = ("name", "username", "password")
    NAME_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    name: str
    username: str
    password: str
    def __init__(self, name: _Optional[str] = ..., username: _Optional[str] = ..., password: _Optional[str] = ...) -> None: ...

class IssueAgentTokenRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class IssueAgentTokenResponse(_message.Message):
    __slots__ = ("node", "token")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    node: str
    token: str
    def __init__(self, node: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class ClearLeakRequest(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CheckOutcome(_message.Message):
    __slots__ = ("name", "kind", "passed", "reason", "duration_s", "figures_json", "baseline_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    FIGURES_JSON_FIELD_NUMBER: _ClassVar[int]
    BASELINE_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    passed: bool
    reason: str
    duration_s: float
    figures_json: str
    baseline_json: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., passed: _Optional[bool] = ..., reason: _Optional[str] = ..., duration_s: _Optional[float] = ..., figures_json: _Optional[str] = ..., baseline_json: _Optional[str] = ...) -> None: ...

class CheckRun(_message.Message):
    __slots__ = ("node", "level", "trigger", "suite_version", "passed", "started_at", "duration_s", "checks", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    SUITE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    level: str
    trigger: str
    suite_version: str
    passed: bool
    started_at: float
    duration_s: float
    checks: _containers.RepeatedCompositeFieldContainer[CheckOutcome]
    reason: str
    def __init__(self, node: _Optional[str] = ..., level: _Optional[str] = ..., trigger: _Optional[str] = ..., suite_version: _Optional[str] = ..., passed: _Optional[bool] = ..., started_at: _Optional[float] = ..., duration_s: _Optional[float] = ..., checks: _Optional[_Iterable[_Union[CheckOutcome, _Mapping]]] = ..., reason: _Optional[str] = ...) -> None: ...

class RunChecksRequest(_message.Message):
    __slots__ = ("nodes", "level", "rack")
    NODES_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    level: str
    rack: str
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., level: _Optional[str] = ..., rack: _Optional[str] = ...) -> None: ...

class RunChecksResponse(_message.Message):
    __slots__ = ("started",)
    STARTED_FIELD_NUMBER: _ClassVar[int]
    started: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, started: _Optional[_Iterable[str]] = ...) -> None: ...

class ListChecksRequest(_message.Message):
    __slots__ = ("node", "limit")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    node: str
    limit: int
    def __init__(self, node: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListChecksResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[CheckRun]
    def __init__(self, runs: _Optional[_Iterable[_Union[CheckRun, _Mapping]]] = ...) -> None: ...

class GetAllocationReportRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GpuJobHealth(_message.Message):
    __slots__ = ("node", "index", "uuid", "max_temp_c", "throttled_s", "energy_j", "ecc_sbe", "ecc_dbe", "xids", "rows_remapped", "nvlink_errors")
    class ThrottledSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MAX_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_FIELD_NUMBER: _ClassVar[int]
    XIDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_REMAPPED_FIELD_NUMBER: _ClassVar[int]
    NVLINK_ERRORS_FIELD_NUMBER: _ClassVar[int]
    node: str
    index: int
    uuid: str
    max_temp_c: float
    throttled_s: _containers.ScalarMap[str, float]
    energy_j: float
    ecc_sbe: int
    ecc_dbe: int
    xids: _containers.RepeatedScalarFieldContainer[int]
    rows_remapped: int
    nvlink_errors: int
    def __init__(self, node: _Optional[str] = ..., index: _Optional[int] = ..., uuid: _Optional[str] = ..., max_temp_c: _Optional[float] = ..., throttled_s: _Optional[_Mapping[str, float]] = ..., energy_j: _Optional[float] = ..., ecc_sbe: _Optional[int] = ..., ecc_dbe: _Optional[int] = ..., xids: _Optional[_Iterable[int]] = ..., rows_remapped: _Optional[int] = ..., nvlink_errors: _Optional[int] = ...) -> None: ...

class NodeReplacement(_message.Message):
    __slots__ = ("failed", "replacement", "at", "reason")
    FAILED_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    failed: str
    replacement: str
    at: float
    reason: str
    def __init__(self, failed: _Optional[str] = ..., replacement: _Optional[str] = ..., at: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class AllocationReport(_message.Message):
    __slots__ = ("allocation", "started_at", "ended_at", "gpus", "replacements", "reports", "partial")
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    allocation: str
    started_at: float
    ended_at: float
    gpus: _containers.RepeatedCompositeFieldContainer[GpuJobHealth]
    replacements: _containers.RepeatedCompositeFieldContainer[NodeReplacement]
    reports: int
    partial: bool
    def __init__(self, allocation: _Optional[str] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[GpuJobHealth, _Mapping]]] = ..., replacements: _Optional[_Iterable[_Union[NodeReplacement, _Mapping]]] = ..., reports: _Optional[int] = ..., partial: _Optional[bool] = ...) -> None: ...
