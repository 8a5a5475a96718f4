"""The ``kiln`` argument parser: options, selectors, validation, plug-ins."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest

from controller.cli import main as cli_main
from controller.cli.alloc import build_spec
from controller.cli.main import build_parser, main
from controller.cli.sim import build_fault
from kiln.v1 import fleet_pb2, types_pb2


def parse(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


def test_global_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_CONTROLLER", raising=False)
    args = parse("nodes", "list")
    assert (args.controller, args.output, args.timeout, args.verbose) == (
        "127.0.0.1:50051",
        "table",
        30.0,
        0,
    )


def test_controller_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CONTROLLER", "10.0.0.5:7000")
    assert parse("racks", "list").controller == "10.0.0.5:7000"
    assert parse("--controller", "h:1", "racks", "list").controller == "h:1"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["-o", "json", "--timeout", "5", "nodes", "list"], id="before-command"),
        pytest.param(["nodes", "list", "-o", "json", "--timeout", "5"], id="after-command"),
        pytest.param(
            ["--output", "table", "nodes", "list", "--output", "json", "--timeout", "5"],
            id="after-wins",
        ),
    ],
)
def test_global_options_anywhere(argv: list[str]) -> None:
    args = parse(*argv)
    assert args.output == "json"
    assert args.timeout == 5.0


def test_node_state_filter_accepts_short_names() -> None:
    assert parse("nodes", "list", "--state", "ready").state == types_pb2.NODE_STATE_READY
    assert (
        parse("nodes", "list", "--state", "powered-off").state == types_pb2.NODE_STATE_POWERED_OFF
    )


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["nodes", "list", "--state", "sleepy"], id="unknown-state"),
        pytest.param(["nodes"], id="missing-subcommand"),
        pytest.param(["alloc", "create"], id="alloc-without-size"),
        pytest.param(["alloc", "create", "--nodes", "2", "--racks", "1"], id="alloc-both-sizes"),
        pytest.param(["alloc", "create", "--nodes", "0"], id="alloc-zero-nodes"),
        pytest.param(["alloc", "create", "--nodes", "2", "--topology", "rack"], id="bad-topology"),
        pytest.param(["nodes", "power", "n1", "explode"], id="bad-power-action"),
        pytest.param(["nodes", "power", "on"], id="power-without-target"),
        pytest.param(["nodes", "power", "n1", "--all", "on"], id="power-name-and-all"),
        pytest.param(["nodes", "power", "--rack", "r1", "--all", "off"], id="power-rack-and-all"),
        pytest.param(
            ["nodes", "power", "--all", "on", "--concurrency", "-1"], id="neg-concurrency"
        ),
        pytest.param(["nodes", "enroll", "n1", "--bmc", "ipmi://h"], id="enroll-missing-creds"),
        pytest.param(["topology", "export", "--format", "dot"], id="bad-topology-format"),
        pytest.param(["sim", "fault", "n1", "--kind", "heat", "--set", "novalue"], id="bad-set"),
        pytest.param(["--timeout", "-3", "racks", "list"], id="negative-timeout"),
        pytest.param(["events", "watch", "--after", "-1"], id="negative-seq"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert "Traceback" not in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("nodes", "racks", "topology", "alloc", "events", "sim"):
        assert command in out


@pytest.mark.parametrize(
    ("argv", "names", "rack", "all_nodes", "action"),
    [
        pytest.param(["n1", "on"], ["n1"], "", False, "on", id="one-name"),
        pytest.param(["n1", "n2", "force-off"], ["n1", "n2"], "", False, "force-off", id="names"),
        pytest.param(["--rack", "r07", "cycle"], [], "r07", False, "cycle", id="rack"),
        pytest.param(["--all", "status"], [], "", True, "status", id="all"),
    ],
)
def test_power_selectors(
    argv: list[str], names: list[str], rack: str, all_nodes: bool, action: str
) -> None:
    args = parse("nodes", "power", *argv)
    assert (args.names, args.rack, args.all, args.action) == (names, rack, all_nodes, action)


def test_alloc_spec_from_options() -> None:
    args = parse(
        "alloc",
        "create",
        "--racks",
        "2",
        "--gpu",
        "GB200",
        "--topology",
        "spine",
        "--preferred",
        "--segment",
        "18",
        "--spares",
        "1",
        "--exclusive",
        "--queue",
        "research",
        "--priority",
        "-5",
        "--profile",
        "train",
        "--key",
        "job-42",
    )
    spec = build_spec(args)
    expected = fleet_pb2.AllocationSpec(
        racks=2,
        gpu_model="GB200",
        topology=fleet_pb2.TOPOLOGY_LEVEL_SPINE,
        preferred=True,
        segment=18,
        spares_per_domain=1,
        exclusive=True,
        queue="research",
        priority=-5,
        profile="train",
    )
    assert spec == expected
    assert args.key == "job-42"
    assert not args.wait


def test_alloc_defaults_to_any_topology() -> None:
    spec = build_spec(parse("alloc", "create", "--nodes", "3"))
    assert (spec.nodes, spec.racks, spec.topology) == (3, 0, fleet_pb2.TOPOLOGY_LEVEL_ANY)


def test_fault_from_flags_and_settings() -> None:
    args = parse(
        "sim",
        "fault",
        "n1",
        "--kind",
        "heat",
        "--gpu",
        "0",
        "--target-c",
        "95",
        "--set",
        "ramp_s=30",
        "--set",
        "note=slow fan",
        "--set",
        "links=[1,2]",
        "--set",
        "gpu=3",
    )
    fault = build_fault(args)
    assert fault == {
        "kind": "heat",
        "gpu": 3,
        "target_c": 95.0,
        "ramp_s": 30,
        "note": "slow fan",
        "links": [1, 2],
    }
    assert json.loads(json.dumps(fault)) == fault


def test_fault_omits_flags_not_given() -> None:
    fault = build_fault(parse("sim", "fault", "n1", "--kind", "xid", "--code", "79"))
    assert fault == {"kind": "xid", "code": 79}


def fake_plugin(monkeypatch: pytest.MonkeyPatch, seen: list[Any]) -> None:
    """A ``demo`` plug-in recording its registrations (``"register"``) and runs (args)."""

    def run(args: Any) -> int:
        seen.append((args.racks, args.controller))
        return 7

    def register(subparsers: Any) -> None:
        seen.append("register")
        p = subparsers.add_parser("demo", help="a simulated fleet")
        p.add_argument("--racks", type=int, default=1)
        p.set_defaults(func=run)

    plugin = types.ModuleType("kiln_test_demo_plugin")
    plugin.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, plugin.__name__, plugin)
    spec = cli_main.Plugin("demo", plugin.__name__, "a simulated fleet")
    others = tuple(p for p in cli_main._PLUGINS if p.command != "demo")
    monkeypatch.setattr(cli_main, "_PLUGINS", (*others, spec))


def test_demo_plugin_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plug-in module's register(subparsers) adds a command whose func gets the args."""
    seen: list[Any] = []
    fake_plugin(monkeypatch, seen)
    assert main(["demo", "--racks", "2", "--controller", "127.0.0.1:9"]) == 7
    assert seen == ["register", (2, "127.0.0.1:9")]


def test_plugin_registered_only_when_chosen(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Any] = []
    fake_plugin(monkeypatch, seen)
    assert main(["--help"]) == 0
    assert main(["racks", "--help"]) == 0
    assert main(["nodes", "show"]) == 2
    assert seen == []
    assert "a simulated fleet" in capsys.readouterr().out
    assert main(["demo", "--help"]) == 0
    assert seen == ["register"]
    assert "--racks" in capsys.readouterr().out


def test_missing_plugin_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = cli_main.Plugin("nothing", "controller.cli.no_such_plugin", "not installed")
    monkeypatch.setattr(cli_main, "_PLUGINS", (*cli_main._PLUGINS, missing))
    assert parse("racks", "list").command == "racks"
    assert "nothing" not in build_parser().format_help()
