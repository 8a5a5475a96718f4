"""The CLI and the agent with tokens: where the token comes from, and the
``kiln tokens`` / ``kiln whoami`` / ``kiln nodes enroll --agent-token-file``
commands, against a controller with authentication on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sec_fleet import SecuredController, dead_bmc

from agent.client import Agent
from agent.main import main as agent_main
from agent.nvml import open_backend
from controller.cli.main import main as kiln_main
from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2
from kiln_common.tokens import read_token_file


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredController]:
    controller = SecuredController(tmp_path_factory.mktemp("cli"))
    try:
        yield controller
    finally:
        controller.stop()


@pytest.fixture
def kiln(
    ctl: SecuredController,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Iterator[object]:
    """``kiln(*argv)`` in-process; no token unless the test gives one."""
    monkeypatch.delenv("KILN_TOKEN", raising=False)
    monkeypatch.setenv("KILN_CONFIG", str(tmp_path / "no-config.toml"))

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = kiln_main(["--controller", ctl.address, *argv])
        out, err = capsys.readouterr()
        return Result(code, out, err)

    yield run


@pytest.mark.timeout(60)
def test_without_a_token_the_cli_says_so_in_one_line(kiln: object) -> None:
    result = kiln("nodes", "list")  # type: ignore[operator]
    assert result.code == 1 and result.out == ""
    assert result.err.startswith("kiln: error: UNAUTHENTICATED: this controller needs credentials")
    assert result.err.count("\n") == 1


@pytest.mark.timeout(60)
def test_the_token_comes_from_the_environment(
    kiln: object, ctl: SecuredController, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_TOKEN", ctl.admin)
    result = kiln("whoami")  # type: ignore[operator]
    assert (result.code, result.out, result.err) == (0, "bootstrap-admin (admin, by token)\n", "")


@pytest.mark.timeout(60)
def test_the_token_file_wins_over_the_environment(
    kiln: object, ctl: SecuredController, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    viewer = tmp_path / "viewer.token"
    viewer.write_text(ctl.token("cli-viewer", "viewer") + "\n")
    monkeypatch.setenv("KILN_TOKEN", ctl.admin)
    result = kiln("--token-file", str(viewer), "whoami")  # type: ignore[operator]
    assert result.out == "cli-viewer (viewer, by token)\n"
    result = kiln("whoami", "--token-file", str(tmp_path / "missing"))  # type: ignore[operator]
    assert result.code == 2
    assert result.err == f"kiln: error: token file {tmp_path / 'missing'} not found\n"


@pytest.mark.timeout(60)
def test_the_token_comes_from_the_config_file(
    kiln: object, ctl: SecuredController, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "kiln" / "config.toml"
    config.parent.mkdir()
    (config.parent / "op.token").write_text(ctl.token("cli-op", "operator"))
    config.write_text('token_file = "op.token"\n')
    monkeypatch.setenv("KILN_CONFIG", str(config))
    assert kiln("whoami").out == "cli-op (operator, by token)\n"  # type: ignore[operator]
    config.write_text("token_file = [\n")
    result = kiln("whoami")  # type: ignore[operator]
    assert result.code == 2 and "cannot read config file" in result.err


@pytest.mark.timeout(60)
def test_a_token_is_never_taken_from_the_command_line(kiln: object) -> None:
    result = kiln("--token", "kiln.0123456789ab.secret", "whoami")  # type: ignore[operator]
    assert result.code == 2 and "never takes a token on the command line" in result.err
    assert "0123456789ab" not in result.err


@pytest.mark.timeout(60)
def test_tokens_create_list_revoke(
    kiln: object, ctl: SecuredController, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KILN_TOKEN", ctl.admin)
    made = kiln("tokens", "create", "ci-bot", "--role", "provisioner", "--ttl", "30d")  # type: ignore[operator]
    assert made.code == 0
    secret = made.out.strip()
    assert made.out == secret + "\n" and secret.startswith("kiln.")
    assert (
        made.err.startswith("token ci-bot (provisioner, expires ") and "shown this once" in made.err
    )

    listed = kiln("tokens", "list")  # type: ignore[operator]
    row = next(line.split() for line in listed.out.splitlines() if line.startswith("ci-bot "))
    assert row[1:3] == ["provisioner", "active"] and row[-1] == "bootstrap-admin"
    assert secret not in listed.out and secret.rsplit(".", 1)[1] not in listed.out

    out_file = tmp_path / "ci2.token"
    written = kiln("tokens", "create", "ci-2", "--role", "viewer", "--out", str(out_file))  # type: ignore[operator]
    assert written.code == 0 and "written to" in written.out and "kiln." not in written.out
    assert out_file.stat().st_mode & 0o777 == 0o600
    assert read_token_file(out_file).startswith("kiln.")

    assert kiln("tokens", "revoke", "ci-bot").out == "token ci-bot revoked\n"  # type: ignore[operator]
    monkeypatch.setenv("KILN_TOKEN", secret)
    refused = kiln("whoami")  # type: ignore[operator]
    assert refused.err == "kiln: error: UNAUTHENTICATED: token 'ci-bot' was revoked\n"
    monkeypatch.setenv("KILN_TOKEN", ctl.admin)
    every = kiln("tokens", "list", "--all")  # type: ignore[operator]
    assert any(
        line.split()[:3] == ["ci-bot", "provisioner", "revoked"] for line in every.out.splitlines()
    )


@pytest.mark.timeout(60)
async def test_enrol_writes_the_agent_token_and_the_agent_uses_it(
    ctl: SecuredController, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    admin_file, agent_file = tmp_path / "admin.token", tmp_path / "agent.token"
    admin_file.write_text(ctl.admin)
    password = tmp_path / "bmc.pass"
    password.write_text("pw\n")
    argv = [
        "--controller",
        ctl.address,
        "--token-file",
        str(admin_file),
        "nodes",
        "enroll",
        "cli-agent-n1",
        "--bmc",
        dead_bmc(),
        "--username",
        "admin",
        "--password-file",
        str(password),
        "--agent-token-file",
        str(agent_file),
    ]
    code = await asyncio.to_thread(kiln_main, argv)
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert "kiln." not in out
    assert agent_file.stat().st_mode & 0o777 == 0o600

    agent = Agent(
        ctl.address,
        "cli-agent-n1",
        open_backend("fake:h100"),
        backend="fake:h100",
        backoff=(0.1, 1.0),
        token=read_token_file(agent_file),
    )
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 20)
    finally:
        await agent.stop()
        await asyncio.wait_for(task, 10)
    node = await asyncio.to_thread(
        ctl.call, "GetNode", fleet_pb2.GetNodeRequest(name="cli-agent-n1"), ctl.admin
    )
    assert len(node.gpus) == 8


@pytest.mark.timeout(60)
def test_kiln_agent_with_a_missing_token_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "agent.token"
    argv = ["--controller", f"127.0.0.1:{free_port()}", "--nvml", "fake:h200"]
    assert agent_main([*argv, "--token-file", str(missing)]) == 2
    assert capsys.readouterr().err == f"kiln-agent: error: token file {missing} not found\n"


@pytest.mark.timeout(60)
def test_the_ansible_inventory_reads_with_a_viewer_token(ctl: SecuredController) -> None:
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "ansible" / "inventory" / "kiln_inventory.py"
    ctl.enroll("inv-n1")
    env = {k: v for k, v in os.environ.items() if k != "KILN_TOKEN"}
    env["KILN_CONTROLLER"] = ctl.address

    def inventory(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), "--list"],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = inventory()
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    listed = inventory(KILN_TOKEN=ctl.token("inventory", "viewer"))
    assert listed.returncode == 0, listed.stderr
    assert "inv-n1" in json.loads(listed.stdout)["kiln_nodes"]["hosts"]


@pytest.mark.timeout(60)
def test_on_loopback_without_auth_everyone_is_an_anonymous_admin_and_audited(
    controller_addr: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KILN_TOKEN", raising=False)
    base = ["--controller", controller_addr]
    assert kiln_main([*base, "whoami"]) == 0
    out = capsys.readouterr().out
    assert out == "anonymous (admin): this controller does not authenticate callers\n"
    assert kiln_main([*base, "tokens", "create", "later", "--role", "viewer"]) == 0
    capsys.readouterr()
    assert kiln_main([*base, "audit", "list", "--who", "anonymous"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[2], r[3], r[4], r[5]) for r in rows] == [("anonymous", "admin", "CreateToken", "OK")]
