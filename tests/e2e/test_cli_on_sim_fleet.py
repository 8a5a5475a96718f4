"""The operator's view: the `kiln` CLI against a controller and a simulated
fleet of GB200 NVL72 racks (sushy-tools BMCs, fake-NVML agents)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from peers import ControllerThread

from controller.cli.main import main as kiln
from controller.server import ControllerConfig
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, default_fleet


@pytest.fixture(scope="module")
def fleet_addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path_factory.mktemp("ctl"),
            reconcile_interval=0.2,
            sample_interval=1.0,
        )
    )
    address = controller.start()
    fleet = SimFleet(default_fleet(nvl72_racks=2, hgx_nodes=2), watch_interval=0.5)
    controller.call(fleet.start(address))
    password_file = tmp_path_factory.mktemp("secrets") / "bmc.pass"
    password_file.write_text(SIM_PASSWORD + "\n")
    try:
        for spec in fleet.specs:
            assert (
                kiln(
                    [
                        "--controller",
                        address,
                        "nodes",
                        "enroll",
                        spec.name,
                        "--bmc",
                        fleet.bmc_url(spec.name),
                        "--username",
                        SIM_USERNAME,
                        "--password-file",
                        str(password_file),
                        "--rack",
                        spec.rack,
                        "--leaf",
                        spec.leaf,
                        "--spine",
                        spec.spine,
                    ]
                )
                == 0
            )
        wait_all_ready(address)
        yield address
    finally:
        controller.call(fleet.stop())
        controller.stop()


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    code = kiln(["-o", "json", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def wait_all_ready(address: str) -> None:
    from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

    deadline = time.monotonic() + 90
    with grpc.insecure_channel(address) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        while True:
            nodes = stub.ListNodes(fleet_pb2.ListNodesRequest()).nodes
            if all(n.state == types_pb2.NODE_STATE_READY and n.schedulable for n in nodes):
                return
            assert time.monotonic() < deadline, "fleet never became ready"
            time.sleep(0.3)


def test_placement_through_the_cli(fleet_addr: str, capsys: pytest.CaptureFixture[str]) -> None:
    c = ["--controller", fleet_addr]
    rack = run_json(capsys, *c, "alloc", "create", "--racks", "1", "--key", "one-rack")
    assert len(rack["nodes"]) == 18 and len(rack["domains"]) == 1
    assert {n.rsplit("-t", 1)[0] for n in rack["nodes"]} == {rack["nodes"][0].rsplit("-t", 1)[0]}

    sixteen = run_json(
        capsys,
        *c,
        "alloc",
        "create",
        "--nodes",
        "16",
        "--topology",
        "nvlink",
        "--gpu",
        "GB200",
        "--key",
        "sixteen",
    )
    assert len(sixteen["nodes"]) == 16 and len(sixteen["domains"]) == 1
    assert not set(sixteen["nodes"]) & set(rack["nodes"])

    # Can never fit: refused with a clear reason, nothing stored.
    capsys.readouterr()
    assert kiln([*c, "alloc", "create", "--nodes", "19", "--topology", "nvlink"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kiln: error: FAILED_PRECONDITION") and "never fit" in err
    assert "Traceback" not in err

    # Cannot fit now (only 2 trays free in the second rack): waits, with its reason.
    waiting = run_json(
        capsys,
        *c,
        "alloc",
        "create",
        "--nodes",
        "4",
        "--topology",
        "nvlink",
        "--gpu",
        "GB200",
        "--key",
        "later",
    )
    assert waiting["state"] == "pending" and not waiting.get("nodes")
    capsys.readouterr()
    assert kiln([*c, "alloc", "show", waiting["id"]]) == 0
    shown = capsys.readouterr().out
    assert "pending" in shown.lower() and waiting["reason"] in shown

    assert kiln([*c, "alloc", "release", sixteen["id"]]) == 0
    deadline = time.monotonic() + 30
    while True:
        now = run_json(capsys, *c, "alloc", "show", waiting["id"])
        if now["state"] == "ready":
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.3)
    assert len(now["nodes"]) == 4 and len(now["domains"]) == 1
    for ident in (rack["id"], now["id"]):
        assert kiln([*c, "alloc", "release", ident]) == 0


def test_topology_exports(fleet_addr: str, capsys: pytest.CaptureFixture[str]) -> None:
    c = ["--controller", fleet_addr]
    capsys.readouterr()
    assert kiln([*c, "topology", "export", "--format", "slurm"]) == 0
    slurm = capsys.readouterr().out
    assert "BlockName=" in slurm and "gb200-r01-t[01-18]" in slurm
    assert "BlockSizes=" in slurm
    assert kiln([*c, "topology", "export", "--format", "k8s"]) == 0
    labels = capsys.readouterr().out
    line = next(ln for ln in labels.splitlines() if ln.startswith("gb200-r02-t01 "))
    assert "nvidia.com/gpu.clique=" in line and "kiln.dev/rack=r02" in line


def test_racks_list_shows_nvlink_domains(
    fleet_addr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    racks = run_json(capsys, "--controller", fleet_addr, "racks", "list")
    by_name = {r["name"]: r for r in racks["racks"]}
    assert by_name["r01"]["nodes"] == 18 and by_name["r01"]["gpus"] == 72
    assert by_name["r01"]["nvlink_domain"] != by_name["r02"]["nvlink_domain"]


def test_enroll_password_never_echoed(
    fleet_addr: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    capsys.readouterr()
    assert kiln(["--controller", fleet_addr, "-o", "json", "nodes", "show", "gb200-r01-t01"]) == 0
    out = capsys.readouterr()
    assert SIM_PASSWORD not in out.out + out.err
    shown = json.loads(out.out)
    assert shown["gpu_count"] == 4 and len(shown["gpus"]) == 4
