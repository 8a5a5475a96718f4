"""The CLI's manners, offline: errors in plain words with a guess, colour only
on a terminal, shell completion from the parser itself."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from controller.cli.completion import script
from controller.cli.main import build_parser, main
from controller.cli.output import render_table, use_colour


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["nodse", "list"], "unknown 'nodse' (choose from nodes,"),
        (["nodse", "list"], "did you mean 'nodes'?"),
        (["nodes", "lsit"], "did you mean 'list'?"),
        (["alloc", "create", "--nodes", "abc"], "argument --nodes: 'abc' is not a whole number"),
        (["alloc", "create", "--nodes", "0"], "argument --nodes: must be 1 or more"),
        (["events", "watch", "--after", "x"], "'x' is not a whole number"),
        (["--timeout", "soon", "nodes", "list"], "'soon' is not a number of seconds"),
    ],
)
def test_usage_errors_say_what_was_expected(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    code, err = run(capsys, *argv)
    assert code == 2
    assert said in err
    assert "_positive" not in err and "_seq" not in err and "_timeout" not in err


def test_no_guess_when_nothing_is_close(capsys: pytest.CaptureFixture[str]) -> None:
    _, err = run(capsys, "zzzzzz")
    assert "unknown 'zzzzzz'" in err and "did you mean" not in err


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert use_colour(Tty()) and not use_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(Tty())
    rows = [("n1", "ready", "x"), ("n22", "quarantined", "y")]
    plain = render_table(("name", "state", "reason"), rows)
    coloured = render_table(("name", "state", "reason"), rows, state_column="state", colour=True)
    assert "\x1b[" not in plain
    assert "\x1b[32mready      \x1b[0m" in coloured and "\x1b[31mquarantined\x1b[0m" in coloured
    strip = coloured.replace("\x1b[32m", "").replace("\x1b[31m", "").replace("\x1b[0m", "")
    assert strip == plain  # colour never moves a column
    assert "\x1b" not in coloured.splitlines()[0]  # not the header


def complete(tmp_path: Path, words: list[str]) -> list[str]:
    """What the generated bash completion offers after ``words`` (the last is
    the word being typed)."""
    bash = shutil.which("bash")
    assert bash
    path = tmp_path / "kiln.bash"
    path.write_text(script(build_parser(), "bash"))
    quoted = " ".join(f"'{w}'" for w in words)
    line = (
        f"source {path}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
        '_kiln; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run([bash, "-c", line], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completion_offers_commands_subcommands_and_options(tmp_path: Path) -> None:
    assert complete(tmp_path, ["kiln", "nod"]) == ["nodes"]
    assert "list" in complete(tmp_path, ["kiln", "nodes", ""])
    assert complete(tmp_path, ["kiln", "nodes", "list", "--st"]) == ["--state"]
    # An option's value is not taken for a command.
    assert complete(tmp_path, ["kiln", "--controller", "h:1", "alloc", "cr"]) == ["create"]
    assert "bash" in complete(tmp_path, ["kiln", "completion", ""])


def test_completion_command_prints_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    bash = capsys.readouterr().out
    assert "complete -F _kiln kiln" in bash
    assert main(["completion", "zsh"]) == 0
    zsh = capsys.readouterr().out
    assert zsh.startswith("#compdef kiln") and "bashcompinit" in zsh


def test_human_units() -> None:
    from controller.cli.output import fmt_duration, fmt_mib, fmt_when

    assert fmt_mib(143771) == "140 GiB" and fmt_mib(5120) == "5.0 GiB" and fmt_mib(0) == "-"
    assert [fmt_duration(s) for s in (5, 119, 180, 3600 + 12 * 60, 2 * 86400 + 3 * 3600)] == [
        "5s",
        "119s",
        "3m",
        "1h12m",
        "2d3h",
    ]
    assert fmt_when(1_700_000_000, now=1_700_000_180) == "2023-11-14T22:13:20Z (3m ago)"
    assert fmt_when(0) == "-"
