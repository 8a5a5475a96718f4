"""Rotating secrets: a node's BMC credentials (``kiln nodes set-credentials``)
and the controller's sealing key (``kiln-controller rotate-key``).

BMC credentials are checked against the sushy-tools emulator with HTTP basic
auth; the key rotation runs the real ``kiln-controller`` entry point on a
database with sealed passwords, then starts a controller on the new key.
"""

from __future__ import annotations

import asyncio
import sqlite3
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography.fernet import Fernet

from controller.cli.main import main as kiln
from controller.main import main as kiln_controller
from controller.options import OptionError, parse
from controller.server import ControllerConfig, ControllerServer
from controller.sim.redfish_emulator import RedfishEmulator, SimSystem
from controller.store.key_rotation import next_key_path
from controller.store.secrets import SecretBox
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

USER, OLD, NEW = "operator", "old-bmc-pw-3301", "new-bmc-pw-8812"


async def cli(*argv: str) -> int:
    return await asyncio.to_thread(kiln, list(argv))


@pytest.fixture
async def rotated_bmc(tmp_path: Path) -> AsyncIterator[tuple[str, RedfishEmulator, Path]]:
    """A controller, and a BMC whose password was changed to NEW after the
    node was enrolled with OLD."""
    server = ControllerServer(
        ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path / "state", reconcile_interval=0.5)
    )
    address = await server.start()
    emulator = RedfishEmulator(
        [SimSystem(name="rf-1", uuid="11111111-2222-3333-4444-555555555551", power_state="On")],
        username=USER,
        password=NEW,
    )
    async with emulator:
        try:
            yield address, emulator, tmp_path
        finally:
            await server.stop()


def write(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    return path


@pytest.mark.timeout(120)
async def test_new_bmc_credentials_are_used_at_once_and_never_shown(
    rotated_bmc: tuple[str, RedfishEmulator, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    address, emulator, tmp = rotated_bmc
    c = ["--controller", address]
    old_file, new_file = write(tmp / "old.pass", OLD), write(tmp / "new.pass", NEW)
    url = emulator.system_url("rf-1")
    enroll = ["nodes", "enroll", "rf-1", "--bmc", url, "--username", USER]
    assert await cli(*c, *enroll, "--password-file", str(old_file)) == 0
    assert await cli(*c, "nodes", "power", "rf-1", "status") == 1
    assert "refused the credentials" in capsys.readouterr().err

    assert (
        await cli(
            *c,
            "nodes",
            "set-credentials",
            "rf-1",
            "--username",
            USER,
            "--password-file",
            str(new_file),
        )
        == 0
    )
    said = capsys.readouterr()
    assert "BMC credentials replaced (user operator)" in said.out
    assert await cli(*c, "nodes", "power", "rf-1", "status") == 0
    assert "on" in capsys.readouterr().out

    async with grpc.aio.insecure_channel(address) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        events = [e async for e in stub.WatchEvents(fleet_pb2.WatchEventsRequest(follow=False))]
        assert "node.credentials" in [e.kind for e in events]
        assert all(OLD not in str(e) and NEW not in str(e) for e in events)
        node = await stub.GetNode(fleet_pb2.GetNodeRequest(name="rf-1"))
        assert OLD not in str(node) and NEW not in str(node)
        # What cannot be stored is refused before anything changes.
        for request, code in (
            (fleet_pb2.SetNodeCredentialsRequest(name="rf-1", username=USER), "INVALID_ARGUMENT"),
            (fleet_pb2.SetNodeCredentialsRequest(name="rf-1", password=NEW), "INVALID_ARGUMENT"),
            (
                fleet_pb2.SetNodeCredentialsRequest(name="nope", username=USER, password=NEW),
                "NOT_FOUND",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SetNodeCredentials(request)
            assert caught.value.code().name == code
        power = await stub.PowerNode(
            fleet_pb2.PowerNodeRequest(name="rf-1", action=types_pb2.POWER_ACTION_STATUS)
        )
        assert power.power == types_pb2.POWER_STATE_ON


@pytest.mark.timeout(60)
async def test_an_ipmi_password_over_20_bytes_is_refused_and_the_old_one_kept(
    tmp_path: Path,
) -> None:
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path / "s"))
    address = await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await stub.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name="ipmi-1", bmc_url="ipmi://127.0.0.1:1623", username="u", password="short"
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SetNodeCredentials(
                    fleet_pb2.SetNodeCredentialsRequest(
                        name="ipmi-1", username="u", password="x" * 21
                    )
                )
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "x" * 21 not in (caught.value.details() or "")
        target = await server.fleet.nodes._store.read(  # type: ignore[union-attr]
            lambda tx: tx.nodes.bmc_target(tx.nodes.get("ipmi-1"))
        )
        assert target.password == "short"
    finally:
        await server.stop()


# -- rotate-key -------------------------------------------------------------------


async def enrolled_state(state: Path, passwords: dict[str, str]) -> None:
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=state))
    address = await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            for i, (name, password) in enumerate(passwords.items()):
                await stub.EnrollNode(
                    fleet_pb2.EnrollNodeRequest(
                        name=name,
                        bmc_url=f"redfish+http://127.0.0.1:{9000 + i}/redfish/v1/Systems/1",
                        username="admin",
                        password=password,
                    )
                )
    finally:
        await server.stop()


def stored_passwords(state: Path, key: bytes) -> dict[str, str]:
    box = SecretBox(key)
    with sqlite3.connect(state / "kiln.db") as db:
        rows = db.execute("SELECT name, bmc_password FROM nodes").fetchall()
    assert all(sealed.startswith("fernet:") for _, sealed in rows)
    return {name: box.open(sealed) for name, sealed in rows}


PASSWORDS = {"n1": "pw-one-1111", "n2": "pw-two-2222", "n3": "pw-three-3333"}


@pytest.mark.timeout(120)
async def test_rotate_key_reseals_every_password_and_the_controller_starts_on_the_new_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    await enrolled_state(state, PASSWORDS)
    key_file = state / "secret.key"
    old_key = key_file.read_bytes().strip()

    assert await asyncio.to_thread(kiln_controller, ["rotate-key", "--state-dir", str(state)]) == 0
    assert "re-sealed 3 BMC password(s)" in capsys.readouterr().out
    new_key = key_file.read_bytes().strip()
    assert new_key != old_key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    previous = state / "secret.key.previous"
    assert previous.read_bytes().strip() == old_key
    assert stat.S_IMODE(previous.stat().st_mode) == 0o600
    assert not next_key_path(key_file).exists()
    assert stored_passwords(state, new_key) == PASSWORDS
    # The old key opens nothing any more; the start-up check says so at once.
    with pytest.raises(OptionError, match="does not open the BMC passwords"):
        from controller.options import check_store

        check_store(parse(["--state-dir", str(state), "--secret-key-file", str(previous)]).config)
    # A controller on the new key serves the nodes and their BMCs' passwords.
    server = ControllerServer(parse(["--state-dir", str(state), "--listen", "127.0.0.1:0"]).config)
    await server.start()
    try:
        target = await server.fleet.nodes._store.read(  # type: ignore[union-attr]
            lambda tx: tx.nodes.bmc_target(tx.nodes.get("n2"))
        )
        assert target.password == PASSWORDS["n2"]
    finally:
        await server.stop()


@pytest.mark.timeout(120)
async def test_rotate_key_to_a_given_key_and_an_interrupted_rotation_is_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    await enrolled_state(state, PASSWORDS)
    key_file = state / "secret.key"
    given = tmp_path / "given.key"
    given.write_bytes(Fernet.generate_key())
    rotate = ["rotate-key", "--state-dir", str(state), "--new-key-file", str(given)]
    assert await asyncio.to_thread(kiln_controller, rotate) == 0
    assert key_file.read_bytes().strip() == given.read_bytes().strip()

    # Interrupted after the commit, before the key file was replaced: the
    # database is sealed under KEY.next while KEY is still the old key.
    current = key_file.read_bytes().strip()
    pending = Fernet.generate_key()
    box_old, box_new = SecretBox(current), SecretBox(pending)
    with sqlite3.connect(state / "kiln.db") as db:
        for name, sealed in db.execute("SELECT name, bmc_password FROM nodes").fetchall():
            db.execute(
                "UPDATE nodes SET bmc_password = ? WHERE name = ?",
                (box_new.seal(box_old.open(sealed)), name),
            )
    next_key_path(key_file).write_bytes(pending)
    from controller.options import check_store

    with pytest.raises(OptionError, match="rotate-key` again to finish it"):
        check_store(parse(["--state-dir", str(state)]).config)
    capsys.readouterr()
    assert await asyncio.to_thread(kiln_controller, ["rotate-key", "--state-dir", str(state)]) == 0
    assert "re-sealed 0 BMC password(s)" in capsys.readouterr().out
    assert key_file.read_bytes().strip() == pending
    assert stored_passwords(state, pending) == PASSWORDS
    check_store(parse(["--state-dir", str(state)]).config)


@pytest.mark.timeout(120)
async def test_rotate_key_refuses_while_a_controller_runs_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    await enrolled_state(state, PASSWORDS)
    key_file = state / "secret.key"
    before = key_file.read_bytes()
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=state))
    await server.start()
    try:
        code = await asyncio.to_thread(kiln_controller, ["rotate-key", "--state-dir", str(state)])
    finally:
        await server.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "a controller is using this database" in err[0]
    assert key_file.read_bytes() == before
    assert stored_passwords(state, before.strip()) == PASSWORDS
    # A key file that is not a key, and a state directory with no database.
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    code = await asyncio.to_thread(
        kiln_controller, ["rotate-key", "--state-dir", str(state), "--new-key-file", str(bad)]
    )
    assert code == 2 and "Fernet key" in capsys.readouterr().err
    assert not next_key_path(key_file).exists()
    code = await asyncio.to_thread(
        kiln_controller, ["rotate-key", "--state-dir", str(tmp_path / "empty")]
    )
    assert code == 2 and "holds no Kiln database" in capsys.readouterr().err
