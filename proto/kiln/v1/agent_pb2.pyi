from kiln.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("register", "health", "result")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    register: Register
    health: _types_pb2.NodeHealth
    result: CommandResult
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., health: _Optional[_Union[_types_pb2.NodeHealth, _Mapping]] = ..., result: _Optional[_Union[CommandResult, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_name", "hostname", "agent_version", "driver_version", "nvml_backend", "gpus", "applied_profile")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    NVML_BACKEND_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_PROFILE_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    hostname: str
    agent_version: str
    driver_version: str
    nvml_backend: str
    gpus: _containers.RepeatedCompositeFieldContainer[_types_pb2.Gpu]
    applied_profile: str
    def __init__(self, node_name: _Optional[str] = ..., hostname: _Optional[str] = ..., agent_version: _Optional[str] = ..., driver_version: _Optional[str] = ..., nvml_backend: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_types_pb2.Gpu, _Mapping]]] = ..., applied_profile: _Optional[str] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("registered", "command", "pace")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    PACE_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    command: Command
    pace: Pace
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., pace: _Optional[_Union[Pace, _Mapping]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("node_name", "sample_interval_s")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    sample_interval_s: float
    def __init__(self, node_name: _Optional[str] = ..., sample_interval_s: _Optional[float] = ...) -> None: ...

class Pace(_message.Message):
    __slots__ = ("sample_interval_s",)
    SAMPLE_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    sample_interval_s: float
    def __init__(self, sample_interval_s: _Optional[float] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("id", "apply_profile", "reset_gpus", "inject_fault", "run_check", "reset_gpu")
    ID_FIELD_NUMBER: _ClassVar[int]
    APPLY_PROFILE_FIELD_NUMBER: _ClassVar[int]
    RESET_GPUS_FIELD_NUMBER: _ClassVar[int]
    INJECT_FAULT_FIELD_NUMBER: _ClassVar[int]
    RUN_CHECK_FIELD_NUMBER: _ClassVar[int]
    RESET_GPU_FIELD_NUMBER: _ClassVar[int]
    id: str
    apply_profile: ApplyProfile
    reset_gpus: ResetGpus
    inject_fault: InjectFault
    run_check: RunCheck
    reset_gpu: ResetGpu
    def __init__(self, id: _Optional[str] = ..., apply_profile: _Optional[_Union[ApplyProfile, _Mapping]] = ..., reset_gpus: _Optional[_Union[ResetGpus, _Mapping]] = ..., inject_fault: _Optional[_Union[InjectFault, _Mapping]] = ..., run_check: _Optional[_Union[RunCheck, _Mapping]] = ..., reset_gpu: _Optional[_Union[ResetGpu, _Mapping]] = ...) -> None: ...

class ApplyProfile(_message.Message):
    __slots__ = ("profile_yaml",)
    PROFILE_YAML_FIELD_NUMBER: _ClassVar[int]
    profile_yaml: str
    def __init__(self, profile_yaml: _Optional[str] = ...) -> None: ...

class ResetGpus(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InjectFault(_message.Message):
    __slots__ = ("fault_json",)
    FAULT_JSON_FIELD_NUMBER: _ClassVar[int]
    fault_json: str
    def __init__(self, fault_json: _Optional[str] = ...) -> None: ...

class RunCheck(_message.Message):
    __slots__ = ("check_json",)
    CHECK_JSON_FIELD_NUMBER: _ClassVar[int]
    check_json: str
    def __init__(self, check_json: _Optional[str] = ...) -> None: ...

class ResetGpu(_message.Message):
    __slots__ = ("indices",)
    INDICES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, indices: _Optional[_Iterable[int]] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("id", "ok", "changed", "failures", "message", "figures_json", "duration_s")
    ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIGURES_JSON_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    id: str
    ok: bool
    changed: _containers.RepeatedScalarFieldContainer[str]
    failures: _containers.RepeatedScalarFieldContainer[str]
    message: str
    figures_json: str
    duration_s: float
    def __init__(self, id: _Optional[str] = ..., ok: _Optional[bool] = ..., changed: _Optional[_Iterable[str]] = ..., failures: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ..., figures_json: _Optional[str] = ..., duration_s: _Optional[float] = ...) -> None: ...
