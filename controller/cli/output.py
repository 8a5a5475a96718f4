"""Rendering for the ``kiln`` CLI: aligned tables, key/value blocks and JSON.

Everything here is pure: functions take values and return strings, except the
``emit_*`` helpers, which write to the *current* ``sys.stdout`` (looked up at
call time so that tests capturing output see it). JSON output mirrors the API
messages exactly: ``MessageToDict(preserving_proto_field_name=True)``.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
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


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Rows under upper-case ``headers`` in columns aligned with two spaces.

    The last column is not padded (no trailing blanks). Returns the text with
    no final newline; an empty ``rows`` still yields the header line.
    """
    table = [[h.upper() for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    lines = []
    for line in table:
        padded = [text.ljust(widths[i]) for i, text in enumerate(line[:-1])]
        lines.append("  ".join([*padded, line[-1]]).rstrip())
    return "\n".join(lines)


def render_fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key: value`` lines with the values aligned, for ``show`` commands."""
    width = max((len(key) for key, _ in pairs), default=0) + 1
    return "\n".join(f"{(key + ':').ljust(width)} {cell(value)}" for key, value in pairs)


def message_dict(message: Message) -> dict[str, Any]:
    """The API's JSON form of ``message`` (proto field names, defaults omitted)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


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
