"""BMC passwords are sealed in the database and unsealed only to reach the BMC."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import grpc
import pytest
from sqlalchemy.engine import Engine

from controller.core.errors import FailedPrecondition, InvalidArgument
from controller.core.records import NodeRecord
from controller.server import ControllerConfig, ControllerServer
from controller.store.secrets import SecretBox
from controller.store.sql_store import SqlStore, SqlTx
from kiln.v1 import fleet_pb2, fleet_pb2_grpc


def test_seal_and_open_round_trip_and_the_key_file_is_private(tmp_path: Path) -> None:
    box = SecretBox.from_key_file(tmp_path / "k" / "secret.key")
    sealed = box.seal("hunter2")
    assert sealed.startswith("fernet:") and "hunter2" not in sealed
    assert box.open(sealed) == "hunter2"
    assert box.seal("hunter2") != sealed, "every seal is fresh"
    mode = stat.S_IMODE((tmp_path / "k" / "secret.key").stat().st_mode)
    assert mode == 0o600
    again = SecretBox.from_key_file(tmp_path / "k" / "secret.key")
    assert again.open(sealed) == "hunter2", "the same key file opens it after a restart"


def test_another_key_cannot_open_it_and_says_so_without_the_secret(tmp_path: Path) -> None:
    sealed = SecretBox.from_key_file(tmp_path / "a.key").seal("hunter2")
    other = SecretBox.from_key_file(tmp_path / "b.key")
    with pytest.raises(FailedPrecondition, match="--secret-key-file") as err:
        other.open(sealed)
    assert "hunter2" not in str(err.value)
    assert other.open("legacy-plain") == "legacy-plain"


def test_a_bad_key_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises(InvalidArgument, match="Fernet key"):
        SecretBox.from_key_file(tmp_path / "bad.key")
    with pytest.raises(InvalidArgument, match="does not exist"):
        SecretBox.from_key_file(tmp_path / "missing.key", create=False)


async def test_the_database_never_holds_the_password(tmp_path: Path) -> None:
    server = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path))
    address = await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await stub.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name="n1",
                    bmc_url="redfish+http://127.0.0.1:9/redfish/v1/Systems/1",
                    username="admin",
                    password="hunter2-at-rest",
                )
            )
            assert server.fleet is not None
            nodes = await server.fleet.nodes.records()
            assert (await server.fleet.nodes.target(nodes[0])).password == "hunter2-at-rest"
    finally:
        await server.stop()
    assert (tmp_path / "secret.key").exists()
    with sqlite3.connect(tmp_path / "kiln.db") as db:
        stored = db.execute("SELECT bmc_password FROM nodes").fetchone()[0]
        dump = "\n".join(db.iterdump())
    assert stored.startswith("fernet:")
    assert "hunter2-at-rest" not in dump
    for wal in tmp_path.glob("kiln.db*"):
        assert b"hunter2-at-rest" not in wal.read_bytes()


def test_an_opened_token_is_kept_and_a_changed_password_is_a_new_token(tmp_path: Path) -> None:
    box = SecretBox.from_key_file(tmp_path / "secret.key")
    first, second = box.seal("hunter2"), box.seal("correct-horse")
    assert box.open(first) == "hunter2"
    assert box.open(first) == "hunter2", "kept: the same token opens the same way"
    assert box.open(second) == "correct-horse"
    other = SecretBox.from_key_file(tmp_path / "other.key")
    with pytest.raises(FailedPrecondition):
        other.open(first)  # what one box keeps opens nothing for another key


async def test_bulk_targets_give_each_node_its_own_password_in_order(engine: Engine) -> None:
    """More nodes than one IN (...) binds, asked out of order with a node that
    is gone; a password changed since the last read is read anew."""
    store = SqlStore(engine)
    names = [f"n{i:04d}" for i in range(2000)]

    def enrol(tx: SqlTx) -> None:
        for name in names:
            url = f"redfish+http://127.0.0.1:9/redfish/v1/Systems/{name}"
            tx.nodes.add(NodeRecord(name=name, bmc_url=url, bmc_username="admin"), f"pw-{name}")

    try:
        await store.tx(enrol)
        nodes = await store.read(lambda tx: tx.nodes.find(with_health=False))
        asked = [*reversed(nodes), NodeRecord(name="gone", bmc_url="redfish://x")]
        targets = await store.read(lambda tx: tx.nodes.bmc_targets(asked))
        assert [t.node for t in targets] == [n.name for n in asked]
        assert [t.password for t in targets[:-1]] == [f"pw-{n.name}" for n in asked[:-1]]
        assert targets[-1].password == ""
        assert targets[0].url == asked[0].bmc_url and targets[0].username == "admin"

        await store.tx(lambda tx: tx.nodes.set_credentials(nodes[5], "root", "rotated"))
        again = await store.read(lambda tx: tx.nodes.bmc_targets(nodes[:10]))
        assert again[5].password == "rotated" and again[5].username == "root"
        assert again[4].password == f"pw-{names[4]}"
        one = await store.read(lambda tx: tx.nodes.bmc_target(nodes[5]))
        assert one == again[5]
    finally:
        store.close()
