"""``kiln racks bring-up``: the members file, and one rack brought up by the
CLI against a controller and a simulated NVL72 rack (sushy-tools BMCs for the
trays, switch trays and power shelves; fake-NVML agents on the trays)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from peers import ControllerThread

from controller.cli.main import main as kiln
from controller.cli.racks import load_members
from controller.server import ControllerConfig
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, nvl72_rack
from kiln.v1 import types_pb2


def write_members(path: Path, fleet: SimFleet | None, password_file: Path) -> Path:
    specs = fleet.specs if fleet is not None else nvl72_rack(1, trays=2)
    doc = {
        "rack": "r01",
        "defaults": {"username": SIM_USERNAME, "password_file": str(password_file)},
        "members": [
            {
                "name": s.name,
                "kind": "compute" if s.kind == "gb200" else s.kind,
                "bmc_url": fleet.bmc_url(s.name)
                if fleet
                else f"redfish+http://127.0.0.1:9/{s.name}",
                "leaf": s.leaf,
            }
            for s in specs
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(30)
def test_the_members_file_is_read_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "bmc.pass"
    secret.write_text(SIM_PASSWORD + "\n")
    members = load_members(write_members(tmp_path / "m.yaml", None, secret), "r01")
    assert len(members) == 2 + 9 + 8
    kinds = {m.kind for m in members}
    assert kinds == {
        types_pb2.NODE_KIND_COMPUTE,
        types_pb2.NODE_KIND_SWITCH_TRAY,
        types_pb2.NODE_KIND_POWER_SHELF,
    }
    assert all(m.password == SIM_PASSWORD and m.rack == "r01" for m in members)

    def refused(doc: object, rack: str = "r01") -> str:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(doc))
        with pytest.raises(ValueError) as e:
            load_members(path, rack)
        assert SIM_PASSWORD not in str(e.value)
        return str(e.value)

    one = {"name": "t1", "bmc_url": "redfish://127.0.0.1/x", "username": "u"}
    assert "password_env or password_file" in refused({"members": [one]})
    monkeypatch.delenv("KILN_TEST_NO_SUCH", raising=False)
    assert "KILN_TEST_NO_SUCH is not set" in refused(
        {"members": [{**one, "password_env": "KILN_TEST_NO_SUCH"}]}
    )
    monkeypatch.setenv("KILN_TEST_BMC", SIM_PASSWORD)
    ok = {**one, "password_env": "KILN_TEST_BMC"}
    assert "kind 'gpu'" in refused({"members": [{**ok, "kind": "gpu"}]})
    assert "unknown key(s) colour" in refused({"members": [{**ok, "colour": "red"}]})
    assert "not 'r01'" in refused({"rack": "r02", "members": [ok]})
    assert "'members' list" in refused({"trays": [ok]})
    (only,) = load_members(write_members_doc(tmp_path, {"members": [ok]}), "r01")
    assert only.password == SIM_PASSWORD and only.kind == types_pb2.NODE_KIND_COMPUTE


def write_members_doc(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(180)
def test_bring_up_a_rack_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path / "ctl",
            reconcile_interval=0.2,
            sample_interval=0.5,
        )
    )
    address = controller.start()
    fleet = SimFleet(nvl72_rack(1, trays=3, switch_trays=2, power_shelves=2), watch_interval=0.3)
    controller.call(fleet.start(address))
    secret = tmp_path / "bmc.pass"
    secret.write_text(SIM_PASSWORD + "\n")
    try:
        members = write_members(tmp_path / "members.yaml", fleet, secret)
        capsys.readouterr()
        code = kiln(
            ["--controller", address, "racks", "bring-up", "r01", "--members", str(members)]
        )
        out = capsys.readouterr()
        assert code == 0, out.err
        assert "rack r01: ready in" in out.out and "takes work as a whole" in out.out
        for spec in fleet.specs:
            assert spec.name in out.out
        assert "powered_on" in out.err  # live progress on stderr

        # Again, adopting what is enrolled, as JSON lines: the last has the report.
        code = kiln(["-o", "json", "--controller", address, "racks", "bring-up", "r01"])
        out = capsys.readouterr()
        assert code == 0, out.err
        last = json.loads(out.out.strip().splitlines()[-1])
        assert last["phase"] == "done" and last["report"]["rack_ready"] is True
        assert len(last["report"]["trays"]) == 3 + 2 + 2

        code = kiln(["--controller", address, "racks", "list"])
        out = capsys.readouterr()
        assert code == 0 and "r01" in out.out
    finally:
        controller.call(fleet.stop())
        controller.stop()
