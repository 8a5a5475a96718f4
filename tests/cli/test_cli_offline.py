"""Behaviour that needs no controller: password files, an unreachable controller."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from controller.cli.client import CliError
from controller.cli.main import main
from controller.cli.nodes import read_password
from controller.sim.ports import free_port

SECRET = "s3cr3t-Pa55"


@pytest.fixture
def dead_controller() -> str:
    """An address where nothing listens."""
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize(
    ("content", "password"),
    [("pw\n", "pw"), ("pw\r\n", "pw"), ("pw", "pw"), ("p w \n\n", "p w ")],
)
def test_password_file_strips_trailing_newlines(
    tmp_path: Path, content: str, password: str
) -> None:
    path = tmp_path / "pw"
    path.write_text(content, encoding="utf-8")
    assert read_password(str(path)) == password


def test_password_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(SECRET + "\n"))
    assert read_password("-") == SECRET


def test_empty_password_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(CliError, match="holds no password"):
        read_password(str(path))


def test_missing_password_file_is_a_clear_error(
    tmp_path: Path, dead_controller: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    code = main(
        [
            "--controller",
            dead_controller,
            "nodes",
            "enroll",
            "n1",
            "--bmc",
            "ipmi://h",
            "--username",
            "admin",
            "--password-file",
            str(missing),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err == f"kiln: error: password file '{missing}' not found\n"
    assert captured.out == ""


def test_unreadable_password_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "nodes",
            "enroll",
            "n1",
            "--bmc",
            "ipmi://h",
            "--username",
            "admin",
            "--password-file",
            str(tmp_path),
        ]
    )  # a directory
    assert code == 1
    assert capsys.readouterr().err.startswith(
        f"kiln: error: cannot read password file '{tmp_path}'"
    )


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["nodes", "list"], id="nodes-list"),
        pytest.param(["nodes", "show", "n1"], id="nodes-show"),
        pytest.param(["nodes", "power", "n1", "on"], id="power-one"),
        pytest.param(["nodes", "power", "--all", "status"], id="power-many"),
        pytest.param(["racks", "list"], id="racks"),
        pytest.param(["alloc", "create", "--nodes", "1", "--wait"], id="alloc-create"),
        pytest.param(["events", "watch"], id="events-watch"),
        pytest.param(["sim", "fault", "n1", "--kind", "heat"], id="sim-fault"),
    ],
)
def test_unreachable_controller_is_one_clear_line(
    argv: list[str], dead_controller: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--controller", dead_controller, *argv]) == 1
    captured = capsys.readouterr()
    assert (
        captured.err == f"kiln: error: cannot reach controller at {dead_controller} (UNAVAILABLE)\n"
    )
    assert captured.out == ""


def test_unreachable_with_verbose_says_why(
    dead_controller: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--controller", dead_controller, "-v", "racks", "list"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach controller at {dead_controller} (UNAVAILABLE): " in err
    assert "Traceback" not in err


def test_enroll_against_dead_controller_never_prints_password(
    tmp_path: Path, dead_controller: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pw"
    path.write_text(SECRET + "\n", encoding="utf-8")
    code = main(
        [
            "--controller",
            dead_controller,
            "-vv",
            "nodes",
            "enroll",
            "n1",
            "--bmc",
            "ipmi://127.0.0.1:623",
            "--username",
            "admin",
            "--password-file",
            str(path),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert SECRET not in captured.out + captured.err
