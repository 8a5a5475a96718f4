"""A catalogue image provisioned onto a simulated node, end to end.

The real sushy-tools emulator (with Kiln's one-time-boot addition) is the
BMC; the image is served from a loopback HTTP server; the node's simulated
agent restarts when the emulator boots it, as a node booting the image would.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from fleet_waits import wait_all_ready

from controller.server import ControllerConfig, ControllerServer
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet
from images.catalog import load_catalog
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

pytestmark = pytest.mark.timeout(180)

IMAGES = Path(__file__).resolve().parents[2] / "images"
NODE = "h200-n01"
# A stream's deadline: a stuck provisioning fails its test instead of
# outliving the test's timeout (which would end the whole run).
STREAM_S = 90.0


async def _env(
    tmp_path: Path, image_server: str, **config: Any
) -> tuple[ControllerServer, SimFleet, str]:
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.5,
            image_server=image_server,
            **config,
        )
    )
    address = await server.start()
    fleet = SimFleet(default_fleet(nvl72_racks=0, hgx_nodes=1), watch_interval=0.2)
    await fleet.start(address)
    return server, fleet, address


@pytest.fixture
async def env(
    tmp_path: Path, image_server: str
) -> AsyncIterator[tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet]]:
    server, fleet, address = await _env(tmp_path, image_server)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await _enroll(stub, fleet)
            yield stub, fleet
    finally:
        await fleet.stop()
        await server.stop()


async def _enroll(stub: fleet_pb2_grpc.FleetServiceStub, fleet: SimFleet) -> None:
    for spec in fleet.specs:
        await stub.EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name=spec.name,
                bmc_url=fleet.bmc_url(spec.name),
                username=SIM_USERNAME,
                password=SIM_PASSWORD,
                rack=spec.rack,
            )
        )


async def test_catalogue_image_is_provisioned_and_the_node_comes_back_ready(
    env: tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet], image_server: str
) -> None:
    stub, fleet = env
    await wait_all_ready(stub)
    node = fleet.nodes[NODE]
    boots_before = node.boots
    url = f"{image_server}/testdata/kiln-test.iso"

    started = time.monotonic()
    stream = stub.ProvisionNodes(
        fleet_pb2.ProvisionNodesRequest(names=[NODE], image="kiln-test"), timeout=STREAM_S
    )
    lines = [line async for line in stream]
    took = time.monotonic() - started

    phases = [line.phase for line in lines]
    assert phases == [
        "queued",
        "media_inserted",
        "boot_set",
        "power_cycled",
        "agent_back",
        "inspecting",
    ], lines
    assert all(line.ok and line.image == "kiln-test" and line.image_url == url for line in lines)
    assert lines[-1].done == lines[-1].total == 1
    # The BMC booted it from the image on its virtual CD, through a one-time
    # override, which the boot ended. (The emulator's record of the boot, not
    # a poll of its transient state: the override lasts only until the
    # power-cycle, which a poll every 50 ms may miss.)
    system = await fleet.emulator.system(NODE)
    last = system["Oem"]["KilnSim"]["LastBoot"]
    assert last == {"Device": "Cd", "Image": url, "Override": "Once"}
    assert system["Boot"]["BootSourceOverrideEnabled"] == "Disabled"
    # The agent restarted as a booted node's would; the media was ejected after.
    assert node.boots == boots_before + 1 and node.history[-3:] == ["reboot", "off", "on"]
    assert not (await fleet.emulator.virtual_cd(NODE))["Inserted"]
    # Back through inspection to ready, with the operation cleared.
    await wait_all_ready(stub)
    got = await stub.GetNode(fleet_pb2.GetNodeRequest(name=NODE))
    assert got.state == types_pb2.NODE_STATE_READY
    events = [e async for e in stub.WatchEvents(fleet_pb2.WatchEventsRequest(node=NODE))]
    moves = [(e.data.get("from_state"), e.data.get("to_state")) for e in _transitions(events)]
    assert ("ready", "provisioning") in moves and ("provisioning", "inspecting") in moves
    print(f"\nprovisioned {NODE} in {took:.2f} s (request to inspecting)")


def _transitions(events: list[Any]) -> list[Any]:
    class E:
        def __init__(self, e: Any) -> None:
            self.data = dict(yaml.safe_load(e.data_json) or {}) if e.data_json else {}
            self.at = float(e.at)

    return [E(e) for e in events if e.kind == "node.transition"]


@pytest.mark.parametrize(
    ("image", "code", "words"),
    [
        ("no-such-image", grpc.StatusCode.INVALID_ARGUMENT, "no image named"),
        ("talos-v1.9.5-nvidia-amd64", grpc.StatusCode.FAILED_PRECONDITION, "no pinned sha256"),
        ("", grpc.StatusCode.INVALID_ARGUMENT, "name an image"),
    ],
)
async def test_bad_images_are_refused_before_anything_happens(
    env: tuple[fleet_pb2_grpc.FleetServiceStub, SimFleet], image: str, code: Any, words: str
) -> None:
    stub, fleet = env
    await wait_all_ready(stub)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.ProvisionNodes(
            fleet_pb2.ProvisionNodesRequest(names=[NODE], image=image), timeout=STREAM_S
        ):
            pass
    assert err.value.code() == code and words in (err.value.details() or "")
    got = await stub.GetNode(fleet_pb2.GetNodeRequest(name=NODE))
    assert got.state == types_pb2.NODE_STATE_READY
    assert not (await fleet.emulator.virtual_cd(NODE))["Inserted"]


async def test_a_bad_checksum_is_refused_before_anything_happens(
    tmp_path: Path, image_server: str
) -> None:
    catalog = yaml.safe_load((IMAGES / "catalog.yaml").read_text())
    for entry in catalog["images"]:
        if entry["name"] == "kiln-test":
            entry["sha256"] = "0" * 64
        if isinstance(entry.get("source", {}).get("schematic"), str):
            entry["source"]["schematic"] = str(IMAGES / entry["source"]["schematic"])
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    server, fleet, address = await _env(tmp_path, image_server, images=load_catalog(path))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await _enroll(stub, fleet)
            await wait_all_ready(stub)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.ProvisionNodes(
                    fleet_pb2.ProvisionNodesRequest(names=[NODE], image="kiln-test"),
                    timeout=STREAM_S,
                ):
                    pass
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "the catalogue pins " + "0" * 64 in (err.value.details() or "")
            assert not (await fleet.emulator.virtual_cd(NODE))["Inserted"]
    finally:
        await fleet.stop()
        await server.stop()


async def test_an_agent_that_never_comes_back_is_named_and_quarantined(
    tmp_path: Path, image_server: str
) -> None:
    from controller.core.provisioning import ProvisionLimits

    server, fleet, address = await _env(
        tmp_path, image_server, provision_limits=ProvisionLimits(agent_timeout_s=2.0)
    )
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await _enroll(stub, fleet)
            await wait_all_ready(stub)
            # The simulated node never runs the new OS. (Setting a long watch
            # interval raced: a watch pass already sleeping its short interval
            # saw the power cycle and started the agent.)
            await fleet.pause_power_following()
            lines = [
                line
                async for line in stub.ProvisionNodes(
                    fleet_pb2.ProvisionNodesRequest(names=[NODE], image="kiln-test"),
                    timeout=STREAM_S,
                )
            ]
            assert lines[-1].phase == "failed" and not lines[-1].ok
            assert lines[-1].error == "provisioning kiln-test: no agent after 2 s"
            got = await stub.GetNode(fleet_pb2.GetNodeRequest(name=NODE))
            assert got.state == types_pb2.NODE_STATE_QUARANTINED
            assert got.state_reason == "provisioning kiln-test: no agent after 2 s"
    finally:
        await fleet.stop()
        await server.stop()


async def test_a_controller_restarted_mid_provisioning_resumes_it(
    tmp_path: Path, image_server: str
) -> None:
    """Stopped once the node was power-cycled, a new controller on the same
    database and address finds the node provisioning and finishes it: the
    agent of the booted node registers with it, and the node is inspected
    and ready."""
    from controller.sim.ports import free_port

    listen = f"127.0.0.1:{free_port()}"
    config = ControllerConfig(
        listen=listen,
        state_dir=tmp_path,
        reconcile_interval=0.2,
        sample_interval=0.5,
        image_server=image_server,
    )
    first = ControllerServer(config)
    address = await first.start()
    fleet = SimFleet(default_fleet(nvl72_racks=0, hgx_nodes=1), watch_interval=0.2)
    await fleet.start(address)
    second: ControllerServer | None = None
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await _enroll(stub, fleet)
            await wait_all_ready(stub)
            # The node's OS stays down until the first controller has gone.
            await fleet.pause_power_following()
            stream = stub.ProvisionNodes(
                fleet_pb2.ProvisionNodesRequest(names=[NODE], image="kiln-test"),
                timeout=STREAM_S,
            )
            async for line in stream:
                if line.phase == "power_cycled":
                    break
            stream.cancel()
        await first.stop()  # the node is booting; nobody is there when its agent dials
        stopped_at = time.time()

        second = ControllerServer(config)
        assert await second.start() == address
        fleet.resume_power_following()
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            # The booted node's agent may dial the new controller at once, so the
            # node can be past provisioning already: the events say who ended it.
            await wait_all_ready(stub)
            events = [e async for e in stub.WatchEvents(fleet_pb2.WatchEventsRequest(node=NODE))]
            transitions = _transitions(events)
            moves = [(e.data.get("from_state"), e.data.get("to_state")) for e in transitions]
            assert moves.count(("ready", "provisioning")) == 1
            ended = [
                e
                for e in transitions
                if (e.data.get("from_state"), e.data.get("to_state"))
                == ("provisioning", "inspecting")
            ]
            assert len(ended) == 1 and ended[0].at >= stopped_at, "the new controller ended it"
            assert not (await fleet.emulator.virtual_cd(NODE))["Inserted"]
            last = (await fleet.emulator.system(NODE))["Oem"]["KilnSim"]["LastBoot"]
            assert last["Device"] == "Cd" and last["Override"] == "Once"
    finally:
        await fleet.stop()
        if second is not None:
            await second.stop()
