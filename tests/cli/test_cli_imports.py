"""What ``kiln`` imports: no server code, and no grpc, until a command needs it.

Each case runs in a fresh interpreter, because this test process has long
since imported the server.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controller.cli.main import build_parser

# The server's weight: SQLAlchemy and the controller's own server side. grpc
# is here too: it is imported only when a command dials.
SERVER_MODULES = (
    "sqlalchemy",
    "sqlmodel",
    "controller.server",
    "controller.core",
    "controller.store",
    "grpc",
)

_PROBE = """
import contextlib, io, json, sys
import controller.cli.main as cli

codes = []
with contextlib.redirect_stdout(io.StringIO()) as out:
    for argv in json.loads(sys.argv[1]):
        codes.append(cli.main(argv))
print(json.dumps({
    "codes": codes,
    "output": out.getvalue(),
    "loaded": [m for m in json.loads(sys.argv[2]) if m in sys.modules],
}))
"""


def run_cli(*argvs: list[str]) -> dict[str, object]:
    """Run ``kiln`` with each of ``argvs`` in one fresh interpreter; what it left loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argvs), json.dumps(SERVER_MODULES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


HELP_ARGS = [
    ["--help"],
    ["nodes", "--help"],
    ["nodes", "list", "--help"],
    ["nodes", "power", "--help"],
    ["racks", "list", "--help"],
    ["topology", "export", "--help"],
    ["alloc", "create", "--help"],
    ["events", "watch", "--help"],
    ["sim", "fault", "--help"],
]


def test_help_imports_no_server_code() -> None:
    result = run_cli(*HELP_ARGS)
    assert result["codes"] == [0] * len(HELP_ARGS)
    assert result["loaded"] == []
    assert "demo" in str(result["output"])  # listed without being imported


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["nodes", "list", "--bogus"], id="unknown-option"),
        pytest.param(["nodes", "show"], id="missing-argument"),
        pytest.param(["--timeout", "-1", "racks", "list"], id="bad-global-value"),
    ],
)
def test_usage_errors_import_no_server_code(argv: list[str]) -> None:
    result = run_cli(argv)
    assert result["codes"] == [2]
    assert result["loaded"] == []


def test_demo_help_loads_the_plugin() -> None:
    result = run_cli(["demo", "--help"])
    assert result["codes"] == [0]
    output = str(result["output"])
    assert "usage: kiln demo" in output
    assert "--racks" in output and "--controller" in output
    assert "controller.server" in result["loaded"]


def test_top_level_help_same_with_plugins_loaded() -> None:
    """Each placeholder's help line is its command's own (the whole parser,
    every command loaded, prints the same top-level help as none loaded)."""
    assert build_parser().format_help() == build_parser(load=()).format_help()
    assert build_parser().format_help() == build_parser(load={"demo"}).format_help()
