"""PostgreSQL going away: the active controller (and a standby) stands down
with one line and exit status 3, the code the systemd unit restarts on."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from peers import postgres_server
from sqlalchemy import create_engine, text
from startup_runs import NOT_SERVING, SERVING, Controller

from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

pytestmark = pytest.mark.postgres


class Postgres:
    def __init__(self, url: str) -> None:
        self.url = url
        engine = create_engine(url)
        with engine.connect() as conn:
            self._data = Path(str(conn.execute(text("SHOW data_directory")).scalar()))
        engine.dispose()

    def stop(self) -> None:
        """Fast shutdown, as ``systemctl stop postgresql`` does: every session ends."""
        pid = int((self._data / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGINT)


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL server of this test's own, since the test stops it."""
    with postgres_server() as url:
        yield Postgres(url)


def controller_on(postgres: Postgres, tmp_path: Path) -> Controller:
    return Controller(
        [
            "--db",
            postgres.url,
            "--secret-key-file",
            str(tmp_path / "secret.key"),
            "--state-dir",
            str(tmp_path / "state"),
            "--reconcile-interval",
            "0.2",
            "--power-sync-interval",
            "1",
            "--bmc-thermal-interval",
            "1",
        ],
        free_port(),
    )


def busy(address: str) -> None:
    """Enrol nodes, so every loop (lifecycle, power sync, policies) uses the database."""
    with grpc.insecure_channel(address) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        for i in range(5):
            stub.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name=f"n{i}",
                    username="u",
                    password="p",
                    bmc_url=f"redfish+http://127.0.0.1:9/redfish/v1/Systems/{i}",
                ),
                timeout=10,
            )


def assert_stood_down(controller: Controller, started: float) -> None:
    code = controller.wait_exit(within=30)
    _out, err = controller.finish()
    assert code == 3, err
    assert time.monotonic() - started < 20, "stands down promptly"
    assert "Traceback" not in err, err
    fatal = [line for line in err.splitlines() if " ERROR " in line or "error:" in line]
    assert len(fatal) == 1, err
    assert fatal[0].startswith("kiln-controller: error: stood down: lost the database: "), err
    assert err.splitlines()[-1] == fatal[0], "the last word"


def test_the_active_controller_stands_down_with_one_line(
    postgres: Postgres, tmp_path: Path
) -> None:
    active = controller_on(postgres, tmp_path)
    try:
        active.wait_health(SERVING)
        busy(active.address)
        time.sleep(1.5)  # the loops have been round at least once
        started = time.monotonic()
        postgres.stop()
        assert_stood_down(active, started)
    finally:
        active.finish()


def test_a_standby_stands_down_with_one_line(postgres: Postgres, tmp_path: Path) -> None:
    active = controller_on(postgres, tmp_path)
    try:
        active.wait_health(SERVING)
        standby = controller_on(postgres, tmp_path)  # started second, so it waits
        try:
            standby.wait_health(NOT_SERVING)
            started = time.monotonic()
            postgres.stop()
            assert_stood_down(standby, started)
            assert_stood_down(active, started)
        finally:
            standby.finish()
    finally:
        active.finish()
