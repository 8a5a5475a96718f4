"""One controller per address: a served address is refused at once, and a
standby binds its own before it waits, serving only health until it is active.

gRPC turns SO_REUSEPORT on by default; with it, a second controller on
another database could bind the same address and clients would alternate
between the two fleets.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from startup_runs import NOT_SERVING, SERVING, Controller, run

from controller.server import STANDBY, ControllerConfig, ControllerServer, ListenError
from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2, fleet_pb2_grpc


def enroll(address: str, name: str) -> None:
    with grpc.insecure_channel(address) as channel:
        fleet_pb2_grpc.FleetServiceStub(channel).EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name=name,
                username="u",
                password="p",
                bmc_url=f"redfish+http://127.0.0.1:9/redfish/v1/Systems/{name}",
            ),
            timeout=10,
        )


def node_names(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        reply = fleet_pb2_grpc.FleetServiceStub(channel).ListNodes(
            fleet_pb2.ListNodesRequest(), timeout=10
        )
    return {n.name for n in reply.nodes}


@pytest.fixture
def active(tmp_path: Path) -> Iterator[Controller]:
    """A controller serving ``tmp_path/a`` (SQLite) with node ``n1`` enrolled."""
    controller = Controller(["--state-dir", str(tmp_path / "a")], free_port())
    try:
        controller.wait_health(SERVING)
        enroll(controller.address, "n1")
        yield controller
    finally:
        controller.finish()


def test_a_second_controller_on_a_served_address_refuses_to_start(
    active: Controller, tmp_path: Path
) -> None:
    # Another working directory, so another database: the split-brain setup.
    second = run(["--listen", active.address, "--state-dir", str(tmp_path / "b")])
    assert second.code == 2, second
    assert second.lines == [
        f"kiln-controller: error: --listen {active.address}: address already in use "
        "(by another controller or program)"
    ]
    assert "listening" not in second.stdout
    assert not (tmp_path / "b" / "kiln.db.lock").exists(), "refused before waiting for a lock"
    for _ in range(20):  # every new connection still reaches the one fleet
        assert node_names(active.address) == {"n1"}


def test_a_standby_whose_port_is_taken_fails_at_once(active: Controller, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as squatter:  # another program's port
        port = squatter.getsockname()[1]
        standby = run(
            ["--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "a")], timeout=30
        )
    assert standby.code == 2, standby
    assert standby.lines == [
        f"kiln-controller: error: --listen 127.0.0.1:{port}: address already in use "
        "(by another controller or program)"
    ]
    assert "Traceback" not in standby.stderr
    assert standby.seconds < 20, "it must not wait for the lock first"
    assert active.proc.poll() is None and node_names(active.address) == {"n1"}


def test_a_standby_serves_health_only_until_it_takes_over(
    active: Controller, tmp_path: Path
) -> None:
    standby = Controller(["--state-dir", str(tmp_path / "a")], free_port())
    try:
        standby.wait_health(NOT_SERVING)  # bound, and saying it is not the one to use
        with grpc.insecure_channel(standby.address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                fleet_pb2_grpc.FleetServiceStub(channel).ListNodes(
                    fleet_pb2.ListNodesRequest(), timeout=10
                )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == STANDBY
        active.finish()
        standby.wait_health(SERVING)
        assert node_names(standby.address) == {"n1"}
    finally:
        _out, err = standby.finish()
    assert standby.proc.returncode == 0 and "Traceback" not in err, err


async def test_the_server_binds_without_so_reuseport(tmp_path: Path) -> None:
    first = ControllerServer(ControllerConfig(listen="127.0.0.1:0", state_dir=tmp_path / "a"))
    address = await first.start()
    second = ControllerServer(ControllerConfig(listen=address, state_dir=tmp_path / "b"))
    try:
        with pytest.raises(ListenError, match="address already in use"):
            await asyncio.wait_for(second.start(), 10)
        # Its socket has SO_REUSEPORT off: even a server that asks for it
        # (gRPC's default) cannot share the address.
        with pytest.raises(RuntimeError, match="Failed to bind"):
            grpc.aio.server().add_insecure_port(address)
    finally:
        await second.stop()
        await first.stop()
