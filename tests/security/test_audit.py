"""The audit log of a short session: each mutating call and each refusal, by whom.

A provisioner enrols a node and asks for an allocation, an operator drains
and undrains it, a viewer is refused a power-off, the provisioner releases
the allocation: ``ListAudit``, ``kiln audit list`` and the event stream all
show it, with the BMC password redacted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest
from sec_fleet import BMC_PASSWORD, SecuredController, refusal

from controller.cli.main import main as kiln_main
from controller.events.model import AUDIT_CALL_DATA_SCHEMA, EVENT_SCHEMA, Event
from kiln.v1 import fleet_pb2, types_pb2


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredController]:
    """A controller and the session it audited."""
    ctl = SecuredController(tmp_path_factory.mktemp("audit"))
    try:
        pipeline = ctl.token("pipeline", "provisioner")
        oncall = ctl.token("oncall", "operator")
        watcher = ctl.token("watcher", "viewer")
        ctl.enroll("aud-n1", pipeline)
        alloc = ctl.call(
            "CreateAllocation",
            fleet_pb2.CreateAllocationRequest(key="job-1", spec=fleet_pb2.AllocationSpec(nodes=1)),
            pipeline,
        )
        ctl.call("DrainNode", fleet_pb2.DrainNodeRequest(name="aud-n1", reason="fan"), oncall)
        ctl.call("UndrainNode", fleet_pb2.UndrainNodeRequest(name="aud-n1"), oncall)
        refusal(
            lambda: ctl.call(
                "PowerNode",
                fleet_pb2.PowerNodeRequest(name="aud-n1", action=types_pb2.POWER_ACTION_OFF),
                watcher,
            )
        )
        ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), watcher)  # a read: not audited
        ctl.call("ReleaseAllocation", fleet_pb2.ReleaseAllocationRequest(id=alloc.id), pipeline)
        yield ctl
    finally:
        ctl.stop()


SESSION = [
    ("kiln-controller", "admin", "BootstrapAdminToken", "OK"),
    ("bootstrap-admin", "admin", "CreateToken", "OK"),
    ("bootstrap-admin", "admin", "CreateToken", "OK"),
    ("bootstrap-admin", "admin", "CreateToken", "OK"),
    ("pipeline", "provisioner", "EnrollNode", "OK"),
    ("pipeline", "provisioner", "CreateAllocation", "OK"),
    ("oncall", "operator", "DrainNode", "OK"),
    ("oncall", "operator", "UndrainNode", "OK"),
    ("watcher", "viewer", "PowerNode", "PERMISSION_DENIED"),
    ("pipeline", "provisioner", "ReleaseAllocation", "OK"),
]


@pytest.mark.timeout(60)
def test_the_audit_log_shows_each_mutating_call_with_its_caller(
    session: SecuredController,
) -> None:
    entries = session.audit()
    assert [(e.who, e.role, e.method, e.code) for e in entries] == SESSION
    seqs = [e.seq for e in entries]
    assert seqs == sorted(seqs)
    by_method = {e.method: e for e in entries}
    enrol = json.loads(by_method["EnrollNode"].arguments_json)
    assert enrol["name"] == "aud-n1" and enrol["password"] == "[redacted]"
    assert BMC_PASSWORD not in json.dumps([e.arguments_json for e in entries])
    assert json.loads(by_method["DrainNode"].arguments_json) == {"name": "aud-n1", "reason": "fan"}
    refused = by_method["PowerNode"]
    assert refused.detail.startswith("PowerNode needs role operator or admin")
    assert json.loads(refused.arguments_json)["action"] == "POWER_ACTION_OFF"


@pytest.mark.timeout(60)
def test_the_audit_log_filters_by_caller_method_time_and_count(
    session: SecuredController,
) -> None:
    assert [e.method for e in session.audit(who="oncall")] == ["DrainNode", "UndrainNode"]
    assert [e.who for e in session.audit(method="CreateToken")] == ["bootstrap-admin"] * 3
    assert [e.method for e in session.audit(limit=2)] == ["PowerNode", "ReleaseAllocation"]
    last = session.audit()[-1]
    assert [e.seq for e in session.audit(since=last.at)] == [last.seq]
    assert session.audit(who="nobody") == []


@pytest.mark.timeout(60)
def test_kiln_audit_list_since_and_who(
    session: SecuredController, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_TOKEN", session.admin)
    capsys.readouterr()
    code = kiln_main(
        ["--controller", session.address, "audit", "list", "--since", "1h", "--who", "pipeline"]
    )
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["SEQ", "TIME", "WHO", "ROLE", "METHOD", "CODE"]
    assert [line.split()[4] for line in lines[1:]] == [
        "EnrollNode",
        "CreateAllocation",
        "ReleaseAllocation",
    ]
    assert BMC_PASSWORD not in out

    argv = ["--controller", session.address, "-o", "json", "audit", "list"]
    code = kiln_main([*argv, "--method", "ReleaseAllocation"])
    out, _ = capsys.readouterr()
    assert code == 0
    [entry] = json.loads(out)["entries"]
    assert (entry["who"], entry["role"], entry["code"]) == ("pipeline", "provisioner", "OK")


@pytest.mark.timeout(60)
def test_audit_entries_stream_as_documented_events(session: SecuredController) -> None:
    events = session.stream(
        "WatchEvents", fleet_pb2.WatchEventsRequest(follow=False), session.admin
    )
    audits = [e for e in events if e.kind == "audit.call"]
    assert len(audits) == len(SESSION)
    schema = jsonschema.Draft202012Validator(EVENT_SCHEMA)
    data_schema = jsonschema.Draft202012Validator(AUDIT_CALL_DATA_SCHEMA)
    for e in audits:
        data = json.loads(e.data_json)
        doc = Event(seq=e.seq, at=e.at, kind=e.kind, reason=e.reason, data=data).to_json()
        schema.validate(json.loads(doc))
        data_schema.validate(data)
        assert e.node == "" and e.allocation == ""  # a job's own stream carries none
    assert audits[-1].reason == "pipeline (provisioner) ReleaseAllocation: OK"
