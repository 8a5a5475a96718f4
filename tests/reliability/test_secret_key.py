"""A ``--secret-key-file`` that cannot open the stored BMC passwords stops the
controller at start-up, instead of failing every BMC call afterwards."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from cryptography.fernet import Fernet
from startup_runs import SERVING, Controller, run

from controller.server import ControllerConfig, ControllerServer
from controller.sim.ports import free_port
from controller.store.engine import default_sqlite_url
from controller.store.startup_checks import (
    SecretKeyMismatch,
    SecretKeyMissing,
    check_secret_key,
)
from kiln.v1 import fleet_pb2, fleet_pb2_grpc


@pytest.fixture
async def state(tmp_path: Path) -> Path:
    """A state directory whose database holds one sealed BMC password."""
    state = tmp_path / "state"
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=state))
    address = await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            await fleet_pb2_grpc.FleetServiceStub(channel).EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name="n1",
                    username="admin",
                    password="s3cr3t",
                    bmc_url="redfish+http://127.0.0.1:9/redfish/v1/Systems/1",
                )
            )
    finally:
        await server.stop()
    return state


def test_another_key_is_refused_in_one_line(state: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.key"
    other.write_bytes(Fernet.generate_key())
    done = run(["--state-dir", str(state), "--secret-key-file", str(other)])
    assert done.code == 2, done
    assert done.lines == [
        f"kiln-controller: error: --secret-key-file {other}: this key does not open the BMC "
        "passwords stored in the database (they were sealed with another key); give the key "
        "file the nodes were enrolled under"
    ]
    assert "listening" not in done.stdout


def test_a_missing_key_is_refused_not_replaced(state: Path) -> None:
    (state / "secret.key").rename(state / "secret.key.moved")
    done = run(["--state-dir", str(state)])
    assert done.code == 2, done
    assert len(done.lines) == 1 and "no such key file" in done.lines[0], done.stderr
    assert not (state / "secret.key").exists(), "a new key would never open the old passwords"


def test_the_right_key_starts(state: Path) -> None:
    controller = Controller(["--state-dir", str(state)], free_port())
    try:
        controller.wait_health(SERVING)
    finally:
        _out, err = controller.finish()
    assert controller.proc.returncode == 0, err


def test_the_check_tries_a_sealed_password_only_when_there_is_one(
    state: Path, tmp_path: Path
) -> None:
    url = default_sqlite_url(state)
    check_secret_key(url, state / "secret.key")
    with pytest.raises(SecretKeyMissing):
        check_secret_key(url, tmp_path / "absent.key")
    other = tmp_path / "other.key"
    other.write_bytes(Fernet.generate_key())
    with pytest.raises(SecretKeyMismatch):
        check_secret_key(url, other)
    fresh = default_sqlite_url(tmp_path / "fresh")
    check_secret_key(fresh, tmp_path / "absent.key")  # nothing sealed: any key will do
    assert not (tmp_path / "absent.key").exists()
