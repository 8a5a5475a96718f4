"""What a node, BMC or job names reaches the operator's terminal as text,
never as control sequences: tables, show blocks, event lines and errors."""

from __future__ import annotations

import io
import sys

import pytest

from controller.cli import main as cli_main
from controller.cli.output import emit, render_fields, render_table, terminal_safe

pytestmark = pytest.mark.timeout(30)

HOSTILE = [
    ("osc-title", "spine\x1b]0;owned\x07-1", "\\x1b", "\\x07"),
    ("csi-clear", "r01\x1b[2J\x1b[H", "\\x1b", "[2J"),
    ("bidi-override", "gpu\u202eledom", "\\u202e", "ledom"),
    ("bidi-isolate", "a\u2066b\u2069c", "\\u2066", "\\u2069"),
    ("c1-csi", "x\x9by", "\\x9b", "y"),
    ("backspace", "ok\x08\x08no", "\\x08", "no"),
]
IDS = [h[0] for h in HOSTILE]


def steers(text: str) -> bool:
    """Whether ``text`` holds a character a terminal would act on."""
    return any(
        (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 or c in "\u202e\u2066\u2069"
        for c in text
    )


@pytest.mark.parametrize(("case", "value", "shown", "kept"), HOSTILE, ids=IDS)
def test_table_cells_show_controls_as_escapes(case: str, value: str, shown: str, kept: str) -> None:
    table = render_table(["name", "spine"], [["n1", value]])
    assert not steers(table)
    assert shown in table and kept in table


@pytest.mark.parametrize(("case", "value", "shown", "kept"), HOSTILE, ids=IDS)
def test_show_blocks_and_plain_lines_are_safe(
    case: str, value: str, shown: str, kept: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    emit(render_fields([("reason", value)]))
    emit(f"event {value}\nsecond line")  # a line built by hand, not through a table
    text = out.getvalue()
    assert not steers(text)
    assert shown in text and text.count("\n") == 3  # real newlines survive in plain output


def test_plain_text_is_left_as_it_is() -> None:
    for text in ["gb200-r01-t03", "Grüße", "温度 88 °C", "a b\tc"]:
        assert terminal_safe(text, keep="\t") == text


def test_an_error_message_echoing_a_name_is_safe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main._fail("node 'x\x1b]0;owned\x07' not found")
    err = capsys.readouterr().err
    assert code != 0 and not steers(err) and "\\x1b" in err
