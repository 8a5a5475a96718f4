"""No token secret is kept or shown anywhere but in the one answer that made it.

A session makes and uses operator and agent tokens; then the SQLite file
(and its write-ahead log), every log record, every other API response and
a real ``kiln-controller`` process's output are searched for each secret.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from sec_fleet import BMC_PASSWORD, SecuredController

from controller.cli.main import main as kiln_main
from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2


def secret_parts(token: str) -> list[str]:
    """What must never be found: the whole token, and its secret part alone."""
    return [token, token.rsplit(".", 1)[-1]]


def database_bytes(state_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(state_dir.glob("kiln.db*")))


@pytest.mark.timeout(120)
def test_no_secret_in_the_database_logs_or_responses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ctl = SecuredController(tmp_path)
    responses: list[bytes] = []
    try:
        secrets = {"admin": ctl.admin}
        for role in ("viewer", "operator", "provisioner"):
            secrets[role] = ctl.token(f"s-{role}", role, ttl_s=3600)
        ctl.enroll("sec-n1", secrets["provisioner"])
        secrets["agent"] = ctl.call(
            "IssueAgentToken", fleet_pb2.IssueAgentTokenRequest(node="sec-n1"), ctl.admin
        ).token
        for token in secrets.values():  # each used, as well as refused
            try:
                ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), token)
            except grpc.RpcError as e:
                responses.append((e.details() or "").encode())
        revoked = ctl.call("RevokeToken", fleet_pb2.RevokeTokenRequest(name="s-viewer"), ctl.admin)
        responses.append(revoked.SerializeToString())
        try:
            ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), secrets["viewer"])
        except grpc.RpcError as e:
            responses.append((e.details() or "").encode())
        for rpc, request in [
            ("ListTokens", fleet_pb2.ListTokensRequest(include_revoked=True)),
            ("ListAudit", fleet_pb2.ListAuditRequest()),
            ("ListNodes", fleet_pb2.ListNodesRequest()),
            ("GetNode", fleet_pb2.GetNodeRequest(name="sec-n1")),
            ("WhoAmI", fleet_pb2.WhoAmIRequest()),
        ]:
            responses.append(ctl.call(rpc, request, ctl.admin).SerializeToString())
        events = ctl.stream("WatchEvents", fleet_pb2.WatchEventsRequest(follow=False), ctl.admin)
        responses += [e.SerializeToString() for e in events]
        listed = ctl.call("ListTokens", fleet_pb2.ListTokensRequest(), ctl.admin).tokens
        assert {t.name for t in listed} >= {"bootstrap-admin", "s-operator", "agent:sec-n1"}
    finally:
        ctl.stop()
    stored = database_bytes(tmp_path)
    assert b"scrypt$" in stored  # the hashes are there, and nothing else
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    for role, token in secrets.items():
        for part in secret_parts(token):
            assert part.encode() not in stored, f"{role} token in the database"
            assert part not in logged, f"{role} token in the log"
            assert not any(part.encode() in r for r in responses), f"{role} token in a response"
    assert BMC_PASSWORD.encode() not in stored
    assert BMC_PASSWORD not in logged


def controller_command(state: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "controller.main",
        "--listen",
        f"127.0.0.1:{port}",
        "--state-dir",
        str(state),
        "--reconcile-interval",
        "0.3",
        "-v",
        *extra,
    ]


def wait_serving(port: int, proc: subprocess.Popen[str]) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 30
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        while True:
            try:
                answer = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=2
                )
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return  # NOT_SERVING: bound, still starting (the token comes first)
                assert proc.poll() is None, "the controller exited"
                assert time.monotonic() < deadline, "the controller never served"
                time.sleep(0.2)
            except grpc.RpcError:
                assert proc.poll() is None, "the controller exited"
                assert time.monotonic() < deadline, "the controller never answered"
                time.sleep(0.2)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


@pytest.mark.timeout(180)
def test_a_controller_process_bootstraps_once_and_never_logs_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, token_file, port = tmp_path / "state", tmp_path / "admin.token", free_port()
    command = controller_command(state, port, "--auth", "--bootstrap-token-file", str(token_file))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    made = other_admin = ""
    try:
        wait_serving(port, proc)
        admin = token_file.read_text().strip()
        assert token_file.stat().st_mode & 0o777 == 0o600
        capsys.readouterr()
        base = ["--controller", f"127.0.0.1:{port}", "--token-file", str(token_file)]
        assert kiln_main([*base, "tokens", "create", "ci", "--role", "operator"]) == 0
        made = capsys.readouterr().out.strip()
        assert made.startswith("kiln.")
        assert kiln_main([*base, "tokens", "list"]) == 0
        listed = capsys.readouterr().out
        assert "ci" in listed and made not in listed and admin not in listed
        # Once there are other admins the bootstrap token goes; a restart makes none.
        assert kiln_main([*base, "tokens", "create", "root2", "--role", "admin"]) == 0
        other_admin = capsys.readouterr().out.strip()
        assert kiln_main([*base, "tokens", "revoke", "bootstrap-admin"]) == 0
    finally:
        first = stop(proc) if proc.poll() is None else ""
    assert "authentication on" in first and "wrote a new admin token" in first
    for part in [*secret_parts(admin), *secret_parts(made), *secret_parts(other_admin)]:
        assert part not in first

    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        wait_serving(port, proc)
    finally:
        second = stop(proc) if proc.poll() is None else ""
    assert token_file.read_text().strip() == admin  # a restart changes nothing
    assert "has (or had) an admin token" in second and "wrote a new admin token" not in second
    for part in [*secret_parts(admin), *secret_parts(made), *secret_parts(other_admin)]:
        assert part.encode() not in database_bytes(state)


@pytest.mark.timeout(60)
async def test_a_bootstrap_token_that_cannot_be_written_is_not_made(tmp_path: Path) -> None:
    from controller.server import ControllerConfig, ControllerServer

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    state = tmp_path / "state"
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0", state_dir=state, auth=True, bootstrap_token_file=blocker / "t"
        )
    )
    try:
        with pytest.raises(OSError):
            await server.start()
    finally:
        await server.stop()
    token_file = tmp_path / "admin.token"
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0", state_dir=state, auth=True, bootstrap_token_file=token_file
        )
    )
    try:
        await server.start()  # the next start makes it: nothing was stored the first time
        assert server.fleet is not None
        listed = await server.fleet.list_tokens()
        assert [(t.name, t.role) for t in listed] == [("bootstrap-admin", "admin")]
        caller = await server.fleet.authenticate(token_file.read_text().strip())
        assert caller.name == "bootstrap-admin"
    finally:
        await server.stop()
