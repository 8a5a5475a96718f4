"""The role table covers every RPC, and the pure rules around it.

``test_every_rpc_has_a_row`` fails when a service gains an RPC without a
rule: default deny would refuse it to everyone, so decide who may call it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from controller.api.auth.arguments import REDACTED, audit_arguments
from controller.api.auth.interceptor import on_loopback
from controller.api.auth.roles import FLEET_RULES, RULES, SIMULATION_ONLY, needed, rule_for
from controller.core.identity import Role
from controller.options import parse
from controller.server import ControllerConfig, ControllerServer
from kiln.v1 import agent_pb2, fleet_pb2

SERVICES = [
    fleet_pb2.DESCRIPTOR.services_by_name["FleetService"],
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"],
]
METHODS = {f"/{s.full_name}/{m.name}" for s in SERVICES for m in s.methods}


@pytest.mark.timeout(30)
def test_every_rpc_has_a_row() -> None:
    missing = sorted(METHODS - RULES.keys())
    assert not missing, f"RPCs without a row in controller/api/auth/roles.py: {missing}"
    assert not sorted(RULES.keys() - METHODS), "rows for RPCs that do not exist"


@pytest.mark.timeout(30)
def test_an_rpc_without_a_row_is_refused_to_everyone() -> None:
    assert rule_for("/kiln.v1.FleetService/DropEverything") is None


@pytest.mark.timeout(30)
def test_who_may_do_what() -> None:
    for name, rule in FLEET_RULES.items():
        assert Role.ADMIN in rule.roles, f"admin may do everything, not {name}"
        assert (Role.AGENT in rule.roles) == (name == "WhoAmI"), name
    connect = RULES["/kiln.v1.AgentService/Connect"]
    assert connect.roles == {Role.AGENT}
    viewer = {n for n, r in FLEET_RULES.items() if Role.VIEWER in r.roles}
    assert viewer == {
        "ListNodes",
        "GetNode",
        "ListRacks",
        "ExportTopology",
        "GetAllocation",
        "ListAllocations",
        "WatchEvents",
        "WhoAmI",
        "ListChecks",
        "GetAllocationReport",
    }
    assert not any(FLEET_RULES[n].mutating for n in viewer)
    assert SIMULATION_ONLY == {"/kiln.v1.FleetService/InjectFault"}
    assert FLEET_RULES["SetNodeCredentials"].roles == {Role.ADMIN}
    assert needed(FLEET_RULES["CreateAllocation"]) == "operator, provisioner or admin"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.1.2.3:0", True),
        ("[::1]:50051", True),
        ("localhost:50051", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        (":50051", False),
        ("10.0.0.5:50051", False),
        ("ctl.example:50051", False),
    ],
)
def test_authentication_is_on_by_default_off_loopback(listen: str, loopback: bool) -> None:
    assert on_loopback(listen) is loopback
    assert ControllerServer(ControllerConfig(listen=listen)).auth_enabled is not loopback
    assert ControllerServer(ControllerConfig(listen=listen, auth=True)).auth_enabled
    assert not ControllerServer(ControllerConfig(listen=listen, auth=False)).auth_enabled


@pytest.mark.timeout(30)
def test_the_options_say_it(tmp_path: Path) -> None:
    state = ["--state-dir", str(tmp_path / "state")]
    assert parse(state).config.auth is None
    assert parse([*state, "--auth"]).config.auth is True
    assert parse([*state, "--insecure-no-auth"]).config.auth is False
    config = parse([*state, "--simulation", "--bootstrap-token-file", str(tmp_path / "t")]).config
    assert config.simulation and config.bootstrap_token_file == tmp_path / "t"
    assert not parse(state).config.simulation


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            ["--auth", "--insecure-no-auth"], "not allowed with argument --auth", id="both"
        ),
        pytest.param(
            ["--bootstrap-token-file", "/nonexistent/dir/admin.token"],
            "no such directory",
            id="no-dir",
        ),
        pytest.param(["--bootstrap-token-file", "{tmp}"], "is a directory", id="a-dir"),
    ],
)
def test_bad_auth_options_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    from controller.main import main

    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main([*argv, "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln-controller: error: ") and expected in err, err
    assert err.count("\n") == 1


@pytest.mark.timeout(60)
async def test_insecure_no_auth_is_logged_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="controller.server")
    server = ControllerServer(
        ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path, auth=False)
    )
    try:
        await server.start()
    finally:
        await server.stop()
    [warning] = [r for r in caplog.records if "AUTHENTICATION IS OFF" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "--insecure-no-auth" in warning.getMessage()


@pytest.mark.timeout(30)
def test_audit_arguments_redact_secrets_and_stay_small() -> None:
    enrol = fleet_pb2.EnrollNodeRequest(name="n1", username="admin", password="hunter2")
    assert audit_arguments(enrol) == {"name": "n1", "username": "admin", "password": REDACTED}
    creds = fleet_pb2.SetNodeCredentialsRequest(name="n1", password="hunter2")
    assert audit_arguments(creds)["password"] == REDACTED
    drain = audit_arguments(fleet_pb2.DrainNodeRequest(name="n1", reason="x" * 3_000_000))
    assert drain["reason"].endswith("… (3000000 characters)") and len(drain["reason"]) < 300
    power = audit_arguments(fleet_pb2.PowerNodesRequest(names=[f"n{i}" for i in range(1000)]))
    assert len(power["names"]) == 33 and power["names"][-1] == "… 968 more"
    assert audit_arguments(iter(())) == {}
