"""Rendering for the ``kiln`` CLI: aligned tables, key/value blocks and JSON.

Everything here is pure: functions take values and return strings, except the
``emit_*`` helpers, which write to the *current* ``sys.stdout`` (looked up at
call time so that tests capturing output see it). JSON output is the API
message with every field present and enums as the tables' words
(``message_dict``; the schema per command is in ``docs/cli-json.md``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.protobuf.message import Message

MISSING = "-"
"""Shown in a table cell whose value is absent, zero-time or empty."""

_CAMEL_BOUNDARY = re.compile(r"(?<!^)(?=[A-Z])")

# Characters that steer a terminal rather than show: C0/C1 controls (ESC
# starts colour, title and hyperlink sequences) and the bidirectional
# overrides and isolates that reorder what follows them.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, keep: str = "") -> str:
    """``text`` with every control and bidi character shown as an escape
    (``\\x1b``, ``\\u202e``), so what a node, BMC or job named cannot
    move the cursor, retitle the window or reorder the line. ``keep`` lists
    controls to leave alone (``"\\n"`` for multi-line output)."""
    if text.isprintable() and not _BIDI.intersection(text):
        return text
    return "".join(
        _escape(ch)
        if ch not in keep and (ch in _BIDI or unicodedata.category(ch) in ("Cc", "Cf"))
        else ch
        for ch in text
    )


def enum_prefix(enum_name: str) -> str:
    """The value prefix protobuf style gives an enum: ``NodeState`` → ``NODE_STATE_``."""
    return _CAMEL_BOUNDARY.sub("_", enum_name).upper() + "_"


def short_enum(message: Message, field: str) -> str:
    """The enum ``field`` of ``message`` shown short and lowercase.

    ``NODE_STATE_READY`` → ``ready``; ``*_UNSPECIFIED`` → ``-``; a number the
    CLI does not know (a newer controller) → ``?<number>``.
    """
    descriptor = message.DESCRIPTOR.fields_by_name[field]
    number = int(getattr(message, field))
    enum_type = descriptor.enum_type
    value = enum_type.values_by_number.get(number)
    if value is None:
        return f"?{number}"
    return short_enum_name(value.name, enum_type.name)


def short_enum_name(value_name: str, enum_name: str) -> str:
    """``short_enum`` for a value name: strip the enum's prefix and lowercase it."""
    prefix = enum_prefix(enum_name)
    short = value_name[len(prefix) :] if value_name.startswith(prefix) else value_name
    if short == "UNSPECIFIED":
        return MISSING
    return short.lower()


def fmt_time(unix_seconds: float) -> str:
    """Unix seconds as ``YYYY-MM-DDTHH:MM:SSZ`` (UTC); 0 (never set) → ``-``."""
    if not unix_seconds:
        return MISSING
    moment = datetime.fromtimestamp(unix_seconds, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_when(unix_seconds: float, now: float | None = None) -> str:
    """``fmt_time`` with how long ago, for people: ``2026-12-01T17:00:00Z (3m ago)``."""
    if not unix_seconds:
        return MISSING
    now = time.time() if now is None else now
    return f"{fmt_time(unix_seconds)} ({fmt_duration(now - unix_seconds)} ago)"


def fmt_duration(seconds: float) -> str:
    """A span in its largest sensible unit: ``42s``, ``3m``, ``5h12m``, ``2d3h``."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def fmt_mib(mib: int) -> str:
    """Memory in GiB (``141 GiB``; one decimal under 10 GiB), ``-`` for none."""
    if mib <= 0:
        return MISSING
    gib = mib / 1024
    return f"{gib:.1f} GiB" if gib < 10 else f"{gib:.0f} GiB"


def fmt_opt(message: Message, field: str, unit: str = "", digits: int = 0) -> str:
    """An ``optional`` field with its unit, or ``-`` when the reading is absent."""
    if not message.HasField(field):
        return MISSING
    value = getattr(message, field)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def fmt_list(values: Iterable[Any], sep: str = ",") -> str:
    """Join values for one table cell; an empty list → ``-``."""
    text = sep.join(str(v) for v in values)
    return text or MISSING


def cell(value: Any) -> str:
    """One table cell: strings kept (newlines flattened), empty → ``-``."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value)
    if not text:
        return MISSING
    return terminal_safe(text.replace("\r", " ").replace("\n", " "))


# ANSI colours for state words, on a terminal only (``use_colour``).
STATE_COLOURS = {
    "ready": "32",  # green
    "allocated": "34",  # blue
    "enrolled": "33",  # yellow: on its way
    "inspecting": "33",
    "preparing": "33",
    "releasing": "33",
    "pending": "33",
    "draining": "35",  # magenta: taken out by an operator
    "maintenance": "35",
    "quarantined": "31",  # red: failed
    "failed": "31",
    "powered_off": "2",  # dim
    "released": "2",
}


def use_colour(stream: Any = None) -> bool:
    """Colour only on a terminal, never in a pipe or file, nor with
    ``NO_COLOR`` set (https://no-color.org) or ``TERM=dumb``."""
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def render_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    state_column: str | None = None,
    colour: bool = False,
) -> str:
    """Rows under upper-case ``headers`` in columns aligned with two spaces.

    The last column is not padded (no trailing blanks). Returns the text with
    no final newline; an empty ``rows`` still yields the header line. With
    ``colour``, the ``state_column`` cells are coloured by their word (after
    padding, so the columns stay aligned).
    """
    table = [[h.upper() for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    coloured = list(headers).index(state_column) if colour and state_column else -1
    lines = []
    for n, line in enumerate(table):
        padded = [text.ljust(widths[i]) for i, text in enumerate(line[:-1])] + [line[-1]]
        code = STATE_COLOURS.get(line[coloured]) if n and coloured >= 0 else None
        if code:
            padded[coloured] = f"\x1b[{code}m{padded[coloured]}\x1b[0m"
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def render_fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key: value`` lines with the values aligned, for ``show`` commands."""
    width = max((len(key) for key, _ in pairs), default=0) + 1
    return "\n".join(f"{(key + ':').ljust(width)} {cell(value)}" for key, value in pairs)


def message_dict(message: Message) -> dict[str, Any]:
    """The JSON a pipeline reads (``docs/cli-json.md``): the API message with
    its proto field names, every field present (zero, false and empty
    included), and enums as the lower-case words the tables show
    (``NODE_STATE_READY`` → ``ready``; unset → ``""``)."""
    from google.protobuf import json_format  # only when JSON is asked for

    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _short_enums(message.DESCRIPTOR, data)


def _short_enums(descriptor: Any, data: dict[str, Any]) -> dict[str, Any]:
    for field in descriptor.fields:
        if field.name not in data:
            # Only a field with presence is left out (an unset message or
            # optional reading): present as null, so every key is there.
            data[field.name] = None
            continue
        value = data[field.name]
        if field.enum_type is not None:
            enum = field.enum_type.name
            data[field.name] = (
                [_enum_word(v, enum) for v in value]
                if field.is_repeated
                else _enum_word(value, enum)
            )
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if field.is_repeated:
                data[field.name] = [_short_enums(field.message_type, v) for v in value]
            elif isinstance(value, dict):
                _short_enums(field.message_type, value)
    return data


def _enum_word(value: Any, enum_name: str) -> Any:
    if not isinstance(value, str):  # a number this CLI does not know (a newer controller)
        return value
    word = short_enum_name(value, enum_name)
    return "" if word == MISSING else word


def emit_table(text: str) -> None:
    """Write a ``render_table`` result: its cells are already terminal-safe,
    and its colours (if any) are the CLI's own."""
    sys.stdout.write(text + "\n")


def emit(text: str) -> None:
    """Write ``text`` and a newline to stdout, controls and bidi escaped."""
    sys.stdout.write(terminal_safe(text, keep="\n\t") + "\n")


def emit_json(message: Message) -> None:
    """Write ``message`` as indented JSON to stdout."""
    emit(json.dumps(message_dict(message), indent=2))


def emit_json_line(message: Message) -> None:
    """Write ``message`` as one compact JSON object on one line, then flush."""
    emit(json.dumps(message_dict(message), separators=(",", ":")))
    sys.stdout.flush()
