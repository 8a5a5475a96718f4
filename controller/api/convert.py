"""Domain values ⇄ kiln.v1 messages. Wire types stop here."""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from controller.core.audit import AuditEntry
from controller.core.checks import CheckRunInfo
from controller.core.errors import InvalidArgument
from controller.core.health import REPORT_FIELDS, GpuHealth, HealthReport, typed_report
from controller.core.identity import TokenInfo
from controller.core.job_health import AllocationReport
from controller.core.model import (
    AllocationInfo,
    AllocationSpec,
    EnrollSpec,
    EventInfo,
    GpuInfo,
    NodeInfo,
    PowerResult,
    ProvisionProgress,
    RackInfo,
)
from controller.core.paging import AllocationFilter, NodeFilter
from controller.core.rack_bringup import BringUpLine, BringUpReport, BringUpRequest
from controller.core.states import NodeKind
from kiln.v1 import fleet_pb2, types_pb2

M = TypeVar("M")

NODE_STATE = {
    s.removeprefix("NODE_STATE_").lower(): v
    for s, v in types_pb2.NodeState.items()
    if v != types_pb2.NODE_STATE_UNSPECIFIED
}
POWER_STATE = {"on": types_pb2.POWER_STATE_ON, "off": types_pb2.POWER_STATE_OFF}
NODE_KIND = {
    NodeKind.COMPUTE: types_pb2.NODE_KIND_COMPUTE,
    NodeKind.SWITCH_TRAY: types_pb2.NODE_KIND_SWITCH_TRAY,
    NodeKind.POWER_SHELF: types_pb2.NODE_KIND_POWER_SHELF,
}
NODE_KIND_OF = {v: k for k, v in NODE_KIND.items()} | {
    types_pb2.NODE_KIND_UNSPECIFIED: NodeKind.COMPUTE
}
POWER_ACTION = {
    v: s.removeprefix("POWER_ACTION_").lower()
    for s, v in types_pb2.PowerAction.items()
    if v != types_pb2.POWER_ACTION_UNSPECIFIED
}
ALLOCATION_STATE = {
    s.removeprefix("ALLOCATION_STATE_").lower(): v
    for s, v in fleet_pb2.AllocationState.items()
    if v != fleet_pb2.ALLOCATION_STATE_UNSPECIFIED
}
TOPOLOGY = {
    fleet_pb2.TOPOLOGY_LEVEL_UNSPECIFIED: "any",
    fleet_pb2.TOPOLOGY_LEVEL_NVLINK: "nvlink",
    fleet_pb2.TOPOLOGY_LEVEL_LEAF: "leaf",
    fleet_pb2.TOPOLOGY_LEVEL_SPINE: "spine",
    fleet_pb2.TOPOLOGY_LEVEL_ANY: "any",
}
TOPOLOGY_PB = {v: k for k, v in TOPOLOGY.items() if k != fleet_pb2.TOPOLOGY_LEVEL_UNSPECIFIED}


NODE_STATE_NAME = {v: k for k, v in NODE_STATE.items()}
ALLOCATION_STATE_NAME = {v: k for k, v in ALLOCATION_STATE.items()}
MAX_SEQ = 2**63 - 1  # events are numbered in a signed 64-bit column


def node_kind(value: int) -> NodeKind:
    """A NodeKind off the wire. Raises InvalidArgument for a value not in the enum."""
    kind = NODE_KIND_OF.get(value)
    if kind is None:
        raise InvalidArgument(f"unknown node kind {value}")
    return kind


def enroll_spec(request: fleet_pb2.EnrollNodeRequest) -> EnrollSpec:
    return EnrollSpec(
        name=request.name,
        bmc_url=request.bmc_url,
        username=request.username,
        password=request.password,
        rack=request.rack,
        leaf=request.leaf,
        spine=request.spine,
        insecure=request.insecure,
        ca_bundle=request.ca_bundle,
        profile=request.profile,
        kind=node_kind(request.kind),
    )


def node_state_filter(value: int) -> str:
    """A NodeState filter off the wire: "" for none. Raises InvalidArgument
    for a number this controller does not know (a newer client)."""
    if value == types_pb2.NODE_STATE_UNSPECIFIED:
        return ""
    if value not in NODE_STATE_NAME:
        raise InvalidArgument(f"unknown node state {value}")
    return NODE_STATE_NAME[value]


def allocation_state_filter(value: int) -> str:
    """An AllocationState filter off the wire: "" for none. Raises
    InvalidArgument for a number this controller does not know."""
    if value == fleet_pb2.ALLOCATION_STATE_UNSPECIFIED:
        return ""
    if value not in ALLOCATION_STATE_NAME:
        raise InvalidArgument(f"unknown allocation state {value}")
    return ALLOCATION_STATE_NAME[value]


def node_filter(request: fleet_pb2.ListNodesRequest) -> NodeFilter:
    return NodeFilter(
        rack=request.rack,
        state=node_state_filter(request.state),
        gpu_model=request.gpu_model,
        allocation=request.allocation,
    )


def allocation_filter(request: fleet_pb2.ListAllocationsRequest) -> AllocationFilter:
    return AllocationFilter(
        include_released=request.include_released,
        state=allocation_state_filter(request.state),
    )


def sequence_number(value: int) -> int:
    """An event sequence number off the wire (uint64), as the store can compare it."""
    return min(value, MAX_SEQ)


def power_pb(state: str) -> int:
    return POWER_STATE.get(state, types_pb2.POWER_STATE_UNKNOWN)


GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuInfo))
_GPU_HEALTH_NAMES = tuple(f.name for f in dataclasses.fields(GpuHealth))
_gpu_health_values = operator.attrgetter(*_GPU_HEALTH_NAMES)


def gpu_pb(g: GpuInfo) -> types_pb2.Gpu:
    # Field by field: ``dataclasses.asdict`` deep-copies, ~7x slower for a page of GPUs.
    return types_pb2.Gpu(**{name: getattr(g, name) for name in GPU_FIELDS})


def gpu_from_pb(g: types_pb2.Gpu) -> GpuInfo:
    return GpuInfo(**{name: getattr(g, name) for name in GPU_FIELDS})


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


# ``gpu_health_from_pb`` passes GpuHealth's fields by position (a keyword
# call of 29 arguments cost a third of the conversion); this is the order it
# writes them in, checked against the dataclass when the module loads.
GPU_HEALTH_ORDER = (
    "index",
    "uuid",
    "lost",
    "temp_c",
    "mem_temp_c",
    "slowdown_c",
    "shutdown_c",
    "gpu_max_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "clock_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "remap_correctable",
    "remap_uncorrectable",
    "remap_pending",
    "remap_failure",
    "xids",
    "nvlink_down",
    "nvlink_errors",
    "fabric_state",
    "fabric_healthy",
    "clique",
    "recovery_action",
    "errors",
)
if _GPU_HEALTH_NAMES != GPU_HEALTH_ORDER:
    raise RuntimeError("GpuHealth's fields changed: update convert.gpu_health_values")
# ``health_values`` writes HealthReport's fields by position too.
if REPORT_FIELDS != ("sampled_at", "source", "gpus", "bmc_temps_c", "drift"):
    raise RuntimeError("HealthReport's fields changed: update convert.health_values")


def gpu_health_values(msg: types_pb2.GpuHealth) -> tuple[Any, ...]:
    """One GPU's readings as ``GpuHealth``'s field values, in its order: an
    absent optional reading or a value that is not a finite number is None
    (unknown), which no rule acts on.

    Field by field, in ``GPU_HEALTH_ORDER``: a report carries ~30 fields per
    GPU and thousands of reports come each second (a loop over the fields
    costs twice this, keywords a half more). ``tests/api/test_health_wire.py``
    checks every field of ``GpuHealth`` is read.
    """
    has = msg.HasField
    return (
        msg.index,
        msg.uuid,
        msg.lost,
        _finite(msg.temp_c) if has("temp_c") else None,
        _finite(msg.mem_temp_c) if has("mem_temp_c") else None,
        _finite(msg.slowdown_c) if has("slowdown_c") else None,
        _finite(msg.shutdown_c) if has("shutdown_c") else None,
        _finite(msg.gpu_max_c) if has("gpu_max_c") else None,
        _finite(msg.power_w) if has("power_w") else None,
        _finite(msg.power_limit_w) if has("power_limit_w") else None,
        msg.sm_clock_mhz if has("sm_clock_mhz") else None,
        msg.mem_clock_mhz if has("mem_clock_mhz") else None,
        msg.clock_event_reasons,
        msg.ecc_sbe_volatile,
        msg.ecc_dbe_volatile,
        msg.ecc_sbe_aggregate,
        msg.ecc_dbe_aggregate,
        msg.remap_correctable if has("remap_correctable") else None,
        msg.remap_uncorrectable if has("remap_uncorrectable") else None,
        msg.remap_pending if has("remap_pending") else None,
        msg.remap_failure if has("remap_failure") else None,
        tuple(msg.xids),
        tuple(msg.nvlink_down),
        msg.nvlink_errors,
        msg.fabric_state,
        msg.fabric_healthy,
        msg.clique,
        msg.recovery_action,
        tuple(msg.errors),
    )


def gpu_health_from_pb(msg: types_pb2.GpuHealth) -> GpuHealth:
    """One GPU's readings, typed (``gpu_health_values``)."""
    return GpuHealth(*gpu_health_values(msg))


def health_values(msg: types_pb2.NodeHealth) -> tuple[Any, ...]:
    """An agent's health report as ``HealthReport``'s field values in its
    order, each GPU as ``gpu_health_values``: what ``core/health.py`` packs
    (``pack_values``), made without the typed report in between (a relay
    worker packs every report it forwards: ``relay/digest.py``)."""
    return (
        msg.sampled_at,
        msg.source or "agent",
        tuple(map(gpu_health_values, msg.gpus)),
        tuple(t for t in msg.bmc_temps_c if math.isfinite(t)),
        tuple(msg.drift),
    )


def health_from_pb(msg: types_pb2.NodeHealth) -> HealthReport:
    """An agent's health report as the core's typed value (the only place the
    wire form of a report is read)."""
    return typed_report(health_values(msg))


def health_pb(health: HealthReport | None) -> types_pb2.NodeHealth | None:
    if health is None:
        return None
    msg = types_pb2.NodeHealth(
        sampled_at=health.sampled_at,
        source=health.source,
        bmc_temps_c=list(health.bmc_temps_c),
        drift=list(health.drift),
    )
    names, gpu = _GPU_HEALTH_NAMES, types_pb2.GpuHealth
    msg.gpus.extend(
        gpu(**{k: v for k, v in zip(names, _gpu_health_values(g), strict=True) if v is not None})
        for g in health.gpus
    )
    return msg


NODE_SPECIAL = frozenset({"state", "power", "gpus", "health", "kind"})
NODE_PLAIN = tuple(
    f.name
    for f in dataclasses.fields(NodeInfo)
    if f.name in fleet_pb2.Node.DESCRIPTOR.fields_by_name and f.name not in NODE_SPECIAL
)


class HealthWire:
    """Each node's latest report in its wire form, built once per report.

    A report is an immutable value replaced by the next one, so its message
    is kept by the report's version (``NodeInfo.health_version``) and copied
    into each ``Node`` that shows it: a fleet polled by
    ``GetNode``/``ListNodes`` converts a report once, not once per read. One
    entry per node (``forget`` drops a removed one); a report of version 0
    is converted each time.
    """

    def __init__(self) -> None:
        self._by_node: dict[str, tuple[int, bytes]] = {}

    def serialized(self, node: str, health: HealthReport, version: int) -> bytes:
        kept = self._by_node.get(node)
        if version and kept is not None and kept[0] == version:
            return kept[1]
        msg = health_pb(health)
        data = msg.SerializeToString() if msg is not None else b""
        if version:
            self._by_node[node] = (version, data)
        return data

    def forget(self, node: str) -> None:
        self._by_node.pop(node, None)


def node_pb(n: NodeInfo, wire: HealthWire | None = None) -> fleet_pb2.Node:
    msg = _bare_node_pb(n)
    _set_every_report(msg, n, wire)
    return msg


def _set_every_report(msg: fleet_pb2.Node, n: NodeInfo, wire: HealthWire | None) -> None:
    """Set on ``msg`` what changes with every report: the last sighting and
    the report (its wire form kept by version in ``wire``, when given)."""
    msg.agent_last_seen = n.agent_last_seen
    if n.health is None:
        return
    if wire is not None:
        msg.health.MergeFromString(wire.serialized(n.name, n.health, n.health_version))
    else:
        health = health_pb(n.health)
        assert health is not None
        msg.health.CopyFrom(health)


def _bare_node_pb(n: NodeInfo) -> fleet_pb2.Node:
    """``n`` as a message without what changes with every report: its
    health report and when its agent was last heard from."""
    return fleet_pb2.Node(
        state=NODE_STATE.get(n.state, 0),
        power=power_pb(n.power),
        kind=NODE_KIND[n.kind],
        gpus=[gpu_pb(g) for g in n.gpus],
        **{name: getattr(n, name) for name in NODE_BARE},
    )


# What a node's bare message is kept by: every field of its ``NodeInfo`` but
# those that change with every report (``NodeWire``).
NODE_EVERY_REPORT = frozenset({"health", "health_version", "agent_last_seen"})
NODE_BARE = tuple(name for name in NODE_PLAIN if name not in NODE_EVERY_REPORT)
_node_bare_key = operator.attrgetter(
    *(f.name for f in dataclasses.fields(NodeInfo) if f.name not in NODE_EVERY_REPORT)
)


class NodeWire:
    """Each node's ``Node`` message kept in wire form while the node stays
    the same, for the reads that serve many nodes again and again
    (``GetNode`` polled, ``ListNodes`` pages).

    Built field by field, a page of 500 nodes of 8 GPUs took about 20 ms of
    the event loop (every other call and report waiting), nearly all of it
    the same messages built again. Kept per node: its message without the
    fields that change with every report, by every other field of its
    ``NodeInfo`` (a node that changed in any of them is built again), and
    its report by the report's version (``HealthWire``). A message is then
    parsed from those bytes, and the last sighting set on it.
    """

    def __init__(self) -> None:
        self.health = HealthWire()
        self._bare: dict[str, tuple[tuple[Any, ...], bytes]] = {}

    def node_pb(self, n: NodeInfo) -> fleet_pb2.Node:
        msg = fleet_pb2.Node()
        self._fill(msg, n)
        return msg

    def page_pb(
        self, nodes: Iterable[NodeInfo], next_page_token: str
    ) -> fleet_pb2.ListNodesResponse:
        page = fleet_pb2.ListNodesResponse(next_page_token=next_page_token)
        add = page.nodes.add
        for n in nodes:
            self._fill(add(), n)
        return page

    def forget(self, node: str) -> None:
        self._bare.pop(node, None)
        self.health.forget(node)

    def _fill(self, msg: fleet_pb2.Node, n: NodeInfo) -> None:
        key = _node_bare_key(n)
        kept = self._bare.get(n.name)
        if kept is not None and kept[0] == key:
            bare = kept[1]
        else:
            bare = _bare_node_pb(n).SerializeToString()
            self._bare[n.name] = (key, bare)
        msg.MergeFromString(bare)
        _set_every_report(msg, n, self.health)


def rack_pb(r: RackInfo) -> fleet_pb2.Rack:
    return fleet_pb2.Rack(
        name=r.name,
        nvlink_domain=r.nvlink_domain,
        gpu_model=r.gpu_model,
        nodes=r.nodes,
        gpus=r.gpus,
        ready=r.ready,
        allocated=r.allocated,
        leaf=r.leaf,
        spine=r.spine,
        members=r.members,
        hold=r.hold,
    )


SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(AllocationSpec) if f.name != "topology")


def spec_from_pb(s: fleet_pb2.AllocationSpec) -> AllocationSpec:
    spec = AllocationSpec(
        topology=TOPOLOGY.get(s.topology, "any"), **{n: getattr(s, n) for n in SPEC_FIELDS}
    )
    return dataclasses.replace(
        spec, gpu_model=spec.gpu_model.strip().upper(), queue=spec.queue or "default"
    )


def spec_pb(s: AllocationSpec) -> fleet_pb2.AllocationSpec:
    return fleet_pb2.AllocationSpec(
        topology=TOPOLOGY_PB.get(s.topology, fleet_pb2.TOPOLOGY_LEVEL_ANY),
        **{n: getattr(s, n) for n in SPEC_FIELDS},
    )


def check_run_pb(run: CheckRunInfo) -> fleet_pb2.CheckRun:
    return fleet_pb2.CheckRun(
        node=run.node,
        level=run.level,
        trigger=run.trigger,
        suite_version=run.suite_version,
        passed=run.passed,
        started_at=run.started_at,
        duration_s=run.duration_s,
        reason=run.reason,
        checks=[
            fleet_pb2.CheckOutcome(
                name=c.name,
                kind=c.kind,
                passed=c.passed,
                reason=c.reason,
                duration_s=c.duration_s,
                figures_json=json.dumps(c.figures),
                baseline_json=json.dumps(c.baseline),
            )
            for c in run.checks
        ],
    )


_ALLOCATION_PLAIN = tuple(
    f.name for f in dataclasses.fields(AllocationInfo) if f.name not in ("spec", "state")
)


def allocation_pb(a: AllocationInfo) -> fleet_pb2.Allocation:
    # Field by field: ``asdict`` deep-copies the spec only for it to be replaced.
    return fleet_pb2.Allocation(
        spec=spec_pb(a.spec),
        state=ALLOCATION_STATE.get(a.state, 0),
        **{name: getattr(a, name) for name in _ALLOCATION_PLAIN},
    )


def allocation_report_pb(r: AllocationReport) -> fleet_pb2.AllocationReport:
    gpus = []
    for g in r.gpus:
        fields = dataclasses.asdict(g)
        if g.max_temp_c is None:  # optional: absent, not 0
            del fields["max_temp_c"]
        gpus.append(fleet_pb2.GpuJobHealth(**fields))
    return fleet_pb2.AllocationReport(
        allocation=r.allocation,
        started_at=r.started_at,
        ended_at=r.ended_at,
        gpus=gpus,
        replacements=[fleet_pb2.NodeReplacement(**dataclasses.asdict(x)) for x in r.replacements],
        reports=r.reports,
        partial=r.partial,
    )


def event_pb(e: EventInfo) -> types_pb2.Event:
    fields = dataclasses.asdict(e)
    return types_pb2.Event(data_json=json.dumps(fields.pop("data"), sort_keys=True), **fields)


def power_progress_pb(r: PowerResult, done: int, total: int) -> fleet_pb2.PowerProgress:
    return fleet_pb2.PowerProgress(
        node=r.node, ok=r.ok, power=power_pb(r.power), error=r.error, done=done, total=total
    )


def token_pb(t: TokenInfo) -> fleet_pb2.Token:
    """A token as the API shows it: never its secret or hash."""
    return fleet_pb2.Token(
        name=t.name,
        role=str(t.role),
        created_at=t.created_at,
        expires_at=t.expires_at,
        revoked=t.revoked,
        created_by=t.created_by,
        last_used_at=t.last_used_at,
    )


def audit_entry_pb(e: AuditEntry) -> fleet_pb2.AuditEntry:
    return fleet_pb2.AuditEntry(
        seq=e.seq,
        at=e.at,
        who=e.who,
        role=e.role,
        method=e.method,
        arguments_json=json.dumps(e.arguments, sort_keys=True),
        code=e.code,
        detail=e.detail,
    )


def plain_pb(value: Any, message: Callable[..., M], **special: Any) -> M:
    """``message`` built from the fields of the dataclass ``value`` that the
    message has by the same name; ``special`` gives the others (None: unset)."""
    names = message.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
    fields = {
        f.name: getattr(value, f.name)
        for f in dataclasses.fields(value)
        if f.name in names and f.name not in special
    }
    return message(**fields, **{k: v for k, v in special.items() if v is not None})


def provision_progress_pb(p: ProvisionProgress) -> fleet_pb2.ProvisionProgress:
    return plain_pb(p, fleet_pb2.ProvisionProgress)


def bring_up_request(request: fleet_pb2.BringUpRackRequest) -> BringUpRequest:
    if not math.isfinite(request.timeout_s):
        raise InvalidArgument("timeout_s must be a finite number of seconds")
    return BringUpRequest(
        rack=request.rack,
        members=tuple(enroll_spec(m) for m in request.members),
        image=request.image,
        profile=request.profile,
        timeout_s=request.timeout_s,
        concurrency=request.concurrency,
    )


def bring_up_report_pb(r: BringUpReport) -> fleet_pb2.BringUpReport:
    trays = [
        plain_pb(
            t,
            fleet_pb2.TrayReport,
            kind=NODE_KIND[t.kind],
            state=NODE_STATE.get(t.state, 0),
            power=power_pb(t.power),
        )
        for t in r.trays
    ]
    return plain_pb(r, fleet_pb2.BringUpReport, trays=trays)


def bring_up_line_pb(line: BringUpLine) -> fleet_pb2.BringUpProgress:
    report = bring_up_report_pb(line.report) if line.report is not None else None
    return plain_pb(line, fleet_pb2.BringUpProgress, report=report)
