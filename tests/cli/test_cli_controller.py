"""The CLI against a real controller (``controller_addr``: SQLite, 127.0.0.1).

Nodes are enrolled with BMC URLs on loopback ports where nothing listens, so
every BMC call fails fast with a refused connection.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.cli.main import main
from controller.sim.ports import free_port

SECRET = "Tr0ub4dor&3-never-print-me"


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


Kiln = Callable[..., Result]


@pytest.fixture
def kiln(controller_addr: str, capsys: pytest.CaptureFixture[str]) -> Kiln:
    """``kiln(*argv)`` runs the CLI in-process against the test controller."""

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main(["--controller", controller_addr, *argv])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "bmc-password"
    path.write_text(SECRET + "\n", encoding="utf-8")
    return path


def dead_bmc() -> str:
    return f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/1"


def enroll(kiln: Kiln, password_file: Path, name: str, rack: str = "r1", bmc: str = "") -> Result:
    return kiln(
        "nodes",
        "enroll",
        name,
        "--bmc",
        bmc or dead_bmc(),
        "--username",
        "admin",
        "--password-file",
        str(password_file),
        "--rack",
        rack,
    )


def assert_one_error_line(result: Result, prefix: str) -> None:
    assert result.code == 1
    assert result.out == ""
    assert result.err.startswith(prefix), result.err
    assert result.err.count("\n") == 1
    assert "Traceback" not in result.err


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["nodes", "show", "ghost"], id="show"),
        pytest.param(["nodes", "drain", "ghost", "--reason", "x"], id="drain"),
        pytest.param(["nodes", "undrain", "ghost"], id="undrain"),
        pytest.param(["nodes", "power", "ghost", "status"], id="power"),
        pytest.param(["-o", "json", "nodes", "show", "ghost"], id="show-json"),
        pytest.param(["sim", "fault", "ghost", "--kind", "heat"], id="sim-fault"),
    ],
)
def test_unknown_node_is_not_found(kiln: Kiln, argv: list[str]) -> None:
    result = kiln(*argv)
    assert_one_error_line(result, "kiln: error: NOT_FOUND: ")
    assert "'ghost'" in result.err


@pytest.mark.parametrize("command", ["show", "release"])
def test_unknown_allocation_is_not_found(kiln: Kiln, command: str) -> None:
    assert_one_error_line(kiln("alloc", command, "a-nope"), "kiln: error: NOT_FOUND: ")


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://127.0.0.1:8000", id="wrong-scheme"),
        pytest.param("redfish://", id="no-host"),
        pytest.param("ipmi://127.0.0.1:99999", id="port-out-of-range"),
        pytest.param("not a url", id="garbage"),
    ],
)
def test_malformed_bmc_url_is_invalid_argument(kiln: Kiln, password_file: Path, url: str) -> None:
    result = enroll(kiln, password_file, "n1", bmc=url)
    assert_one_error_line(result, "kiln: error: INVALID_ARGUMENT: ")
    assert "BMC URL" in result.err
    assert SECRET not in result.err
    assert kiln("nodes", "show", "n1").code == 1  # nothing was stored


def test_enroll_never_echoes_the_password(kiln: Kiln, password_file: Path) -> None:
    bmc = dead_bmc()
    results = [
        enroll(kiln, password_file, "gb200-r01-t01", bmc=bmc),
        enroll(kiln, password_file, "gb200-r01-t01", bmc=bmc),  # again: idempotent
        kiln("-vv", "nodes", "show", "gb200-r01-t01"),
        kiln("-o", "json", "nodes", "show", "gb200-r01-t01"),
        kiln("-o", "json", "nodes", "list"),
        kiln("-o", "json", "events", "watch", "--no-follow"),
        enroll(kiln, password_file, "gb200-r01-t01", rack="r2", bmc=bmc),  # a conflict
    ]
    assert [r.code for r in results] == [0, 0, 0, 0, 0, 0, 1]
    assert results[0].out.startswith("node gb200-r01-t01 enrolled: state ")
    assert results[-1].err.startswith("kiln: error: ALREADY_EXISTS: ")
    for result in results:
        assert SECRET not in result.out + result.err


def test_enroll_reads_the_password_from_stdin(kiln: Kiln, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(SECRET + "\n"))
    result = kiln(
        "nodes", "enroll", "n1", "--bmc", dead_bmc(), "--username", "admin", "--password-file", "-"
    )
    assert result.code == 0, result.err
    assert SECRET not in result.out + result.err


def test_nodes_list_and_show(kiln: Kiln, password_file: Path) -> None:
    for name, rack in (("a1", "r1"), ("a2", "r1"), ("b1", "r2")):
        assert enroll(kiln, password_file, name, rack=rack).code == 0

    table = kiln("nodes", "list", "--rack", "r1")
    assert table.code == 0
    lines = table.out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "RACK", "STATE"]
    assert sorted(line.split()[0] for line in lines[1:]) == ["a1", "a2"]

    listed = json.loads(kiln("nodes", "list", "-o", "json").out)
    assert sorted(n["name"] for n in listed["nodes"]) == ["a1", "a2", "b1"]
    assert all(n["state"] in ("enrolled", "inspecting") for n in listed["nodes"])

    shown = json.loads(kiln("-o", "json", "nodes", "show", "b1").out)
    assert (shown["name"], shown["rack"], shown["bmc_username"]) == ("b1", "r2", "admin")
    detail = kiln("nodes", "show", "b1").out
    assert "name:" in detail and "b1" in detail and shown["bmc_url"] in detail


def test_state_filter(kiln: Kiln, password_file: Path) -> None:
    assert enroll(kiln, password_file, "n1").code == 0
    assert json.loads(kiln("-o", "json", "nodes", "list", "--state", "ready").out)["nodes"] == []
    assert kiln("nodes", "list", "--state", "ready").out.splitlines()[1:] == []


def test_drain_and_undrain(kiln: Kiln, password_file: Path) -> None:
    assert enroll(kiln, password_file, "n1").code == 0
    drained = kiln("nodes", "drain", "n1", "--reason", "fan swap")
    assert drained.code == 0
    assert drained.out == "node n1 drained: state draining (fan swap)\n"
    undrained = kiln("-o", "json", "nodes", "undrain", "n1")
    assert undrained.code == 0
    assert json.loads(undrained.out)["state"] != "draining"


def test_alloc_larger_than_the_fleet_is_refused(kiln: Kiln, password_file: Path) -> None:
    assert enroll(kiln, password_file, "n1").code == 0
    result = kiln("alloc", "create", "--nodes", "100", "--key", "too-big")
    assert_one_error_line(result, "kiln: error: FAILED_PRECONDITION: ")
    assert "fit" in result.err
    # all or nothing: no allocation was left behind
    assert json.loads(kiln("-o", "json", "alloc", "list", "--all").out)["allocations"] == []
    assert kiln("alloc", "list").out == "ID  STATE  REQUEST  QUEUE  PRIO  NODES  CREATED  REASON\n"


def test_racks_and_topology(kiln: Kiln, password_file: Path) -> None:
    for name in ("t1", "t2"):
        assert enroll(kiln, password_file, name, rack="r7").code == 0
    racks = kiln("racks", "list")
    assert racks.code == 0
    row = racks.out.splitlines()[1].split()
    assert (row[0], row[3]) == ("r7", "2")
    assert json.loads(kiln("-o", "json", "racks", "list").out)["racks"][0]["nodes"] == 2

    slurm = kiln("topology", "export", "--format", "slurm")
    assert slurm.code == 0 and "t1" in slurm.out and "t2" in slurm.out
    labels = kiln("topology", "export", "--format", "k8s").out.splitlines()
    assert sorted(line.split()[0] for line in labels) == ["t1", "t2"]


def test_events_watch_without_follow(kiln: Kiln, password_file: Path) -> None:
    assert enroll(kiln, password_file, "n1").code == 0
    assert enroll(kiln, password_file, "n2").code == 0
    table = kiln("events", "watch", "--no-follow", "--node", "n2")
    assert table.code == 0
    lines = table.out.splitlines()
    assert lines, "no events for n2"
    assert all(line.split()[3] == "n2" for line in lines)
    assert any(line.split()[2] == "node.enrolled" for line in lines)

    everything = kiln("-o", "json", "events", "watch", "--no-follow")
    events = [json.loads(line) for line in everything.out.splitlines()]
    seqs = [int(e["seq"]) for e in events]
    assert seqs == sorted(seqs) and len(seqs) > len(lines)
    later = kiln("-o", "json", "events", "watch", "--no-follow", "--after", str(seqs[0]))
    assert min(int(json.loads(x)["seq"]) for x in later.out.splitlines()) > seqs[0]


def test_events_watch_exits_0_on_ctrl_c(
    kiln: Kiln, controller_addr: str, password_file: Path
) -> None:
    assert enroll(kiln, password_file, "n1").code == 0
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller.cli.main",
            "--controller",
            controller_addr,
            "events",
            "watch",
            "--from-start",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the watch is running once it printed an event
        assert "node.enrolled" in first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err  # what it said, should this ever fail
    assert err == ""


def test_sim_fault_without_an_agent_is_the_controllers_error(
    kiln: Kiln, password_file: Path
) -> None:
    assert enroll(kiln, password_file, "n1").code == 0
    result = kiln("sim", "fault", "n1", "--kind", "heat", "--gpu", "0", "--target-c", "95")
    # UNAVAILABLE from the controller itself must not read as "cannot reach controller"
    assert_one_error_line(result, "kiln: error: UNAVAILABLE: ")
    assert "cannot reach controller" not in result.err


def test_power_one_node_with_a_dead_bmc(kiln: Kiln, password_file: Path) -> None:
    assert enroll(kiln, password_file, "n1").code == 0
    result = kiln("nodes", "power", "n1", "status")
    assert_one_error_line(result, "kiln: error: UNAVAILABLE: ")
    assert "BMC" in result.err
    assert "cannot reach controller" not in result.err


def test_bulk_power_reports_each_failure(kiln: Kiln, password_file: Path) -> None:
    for name in ("p1", "p2", "p3"):
        assert enroll(kiln, password_file, name, rack="r9").code == 0
    result = kiln("nodes", "power", "--rack", "r9", "status", "--concurrency", "2")
    assert result.code == 1
    lines = result.out.splitlines()
    assert lines[0] == "power status: 3 nodes, 0 ok, 3 failed"
    assert lines[1].split() == ["NODE", "ERROR"]
    assert [line.split()[0] for line in lines[2:]] == ["p1", "p2", "p3"]
    assert all("unreachable" in line for line in lines[2:])
    progress = result.err.splitlines()
    assert sorted(line.split()[0] for line in progress) == ["[1/3]", "[2/3]", "[3/3]"]
    assert all("FAILED:" in line for line in progress)
    assert SECRET not in result.out + result.err


def test_bulk_power_json_lines(kiln: Kiln, password_file: Path) -> None:
    for name in ("p1", "p2"):
        assert enroll(kiln, password_file, name).code == 0
    result = kiln("-o", "json", "nodes", "power", "p1", "p2", "status")
    assert result.code == 1
    messages = [json.loads(line) for line in result.out.splitlines()]
    assert sorted(m["node"] for m in messages) == ["p1", "p2"]
    assert all(m["total"] == 2 and not m.get("ok") for m in messages)


def test_a_repeated_create_and_a_second_release_say_so(kiln: Kiln, password_file: Path) -> None:
    assert enroll(kiln, password_file, "rep1").code == 0  # not inspected: requests wait
    first = kiln("-o", "json", "alloc", "create", "--nodes", "1", "--key", "same-key")
    assert first.code == 0 and first.err == ""
    again = kiln("-o", "json", "alloc", "create", "--nodes", "1", "--key", "same-key")
    ident = json.loads(first.out)["id"]
    assert json.loads(again.out)["id"] == ident
    assert f"key 'same-key' was used before: this is its allocation {ident}, not new" in again.err
    assert kiln("alloc", "release", ident).out == f"allocation {ident}: released\n"
    assert kiln("alloc", "release", ident).out == (
        f"allocation {ident}: already released (nothing to do)\n"
    )


def test_events_watch_starts_from_now(
    controller_addr: str, kiln: Kiln, password_file: Path
) -> None:
    assert enroll(kiln, password_file, "before-watch").code == 0
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller.cli.main",
            "--controller",
            controller_addr,
            "events",
            "watch",
            "--kind",
            "node.enrolled",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2.0)  # the watch has connected (it prints nothing until an event)
        assert enroll(kiln, password_file, "after-watch").code == 0
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "node.enrolled" in first and "after-watch" in first, first
        seq, _, kind = first.split()[:3]
        assert first.index(kind) == 6 + 2 + 20 + 2  # seq right-aligned in 6, time, kind
        assert seq.isdigit()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_nodes_remove(kiln: Kiln, password_file: Path) -> None:
    assert enroll(kiln, password_file, "retire-me").code == 0
    removed = kiln("nodes", "remove", "retire-me", "--reason", "end of life")
    assert removed.code == 0 and removed.out == "node retire-me removed\n"
    gone = kiln("nodes", "show", "retire-me")
    assert_one_error_line(gone, "kiln: error: NOT_FOUND: node 'retire-me' not found")
    events = kiln("events", "watch", "--no-follow", "--node", "retire-me", "--kind", "node.")
    assert "node.enrolled" in events.out and "node.removed" in events.out
    assert "end of life" in events.out
    assert kiln("nodes", "remove", "retire-me").code == 1  # already gone: NOT_FOUND
