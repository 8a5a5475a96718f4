"""The allocation calls' audit entries: stored with the call's change
(``controller.core.audit.CallAudit``), one per call however the call
ends — a request stored, the same key again (nothing stored), a key
reused for another spec, a release refused, a release repeated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sec_fleet import SecuredController, refusal

from kiln.v1 import fleet_pb2

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[SecuredController]:
    controller = SecuredController(tmp_path)
    try:
        controller.enroll("aud-n1")
        yield controller
    finally:
        controller.stop()


def allocation_entries(ctl: SecuredController) -> list[tuple[str, str, str, dict[str, object]]]:
    return [
        (e.who, e.method, e.code, json.loads(e.arguments_json))
        for e in ctl.audit()
        if e.method in ("CreateAllocation", "ReleaseAllocation")
    ]


def test_each_allocation_call_has_one_entry_however_it_ends(ctl: SecuredController) -> None:
    pipeline = ctl.token("pipeline", "provisioner")
    other = ctl.token("other", "provisioner")
    one = fleet_pb2.AllocationSpec(nodes=1)
    create = fleet_pb2.CreateAllocationRequest(key="job-1", spec=one)
    first = ctl.call("CreateAllocation", create, pipeline)
    again = ctl.call("CreateAllocation", create, pipeline)  # the same key: nothing stored
    assert again.id == first.id
    two = fleet_pb2.AllocationSpec(nodes=2)
    conflict = fleet_pb2.CreateAllocationRequest(key="job-1", spec=two)
    code, _ = refusal(lambda: ctl.call("CreateAllocation", conflict, pipeline))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    release = fleet_pb2.ReleaseAllocationRequest(id=first.id)
    code, _ = refusal(lambda: ctl.call("ReleaseAllocation", release, other))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    ctl.call("ReleaseAllocation", release, pipeline)
    ctl.call("ReleaseAllocation", release, pipeline)  # already released: unchanged

    job = {"key": "job-1", "spec": {"nodes": 1}}
    assert allocation_entries(ctl) == [
        ("pipeline", "CreateAllocation", "OK", job),
        ("pipeline", "CreateAllocation", "OK", job),
        ("pipeline", "CreateAllocation", "ALREADY_EXISTS", {"key": "job-1", "spec": {"nodes": 2}}),
        ("other", "ReleaseAllocation", "PERMISSION_DENIED", {"id": first.id}),
        ("pipeline", "ReleaseAllocation", "OK", {"id": first.id}),
        ("pipeline", "ReleaseAllocation", "OK", {"id": first.id}),
    ]
