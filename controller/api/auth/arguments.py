"""A request as the audit log keeps it: JSON values, secrets removed, bounded.

Fields that carry secrets (BMC passwords, tokens) are replaced by
``"[redacted]"`` wherever they appear in the message; long strings and lists
are cut so that one entry stays small whatever a caller sends (a 3 MB drain
reason is kept as its first 256 characters and its length).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

SECRET_FIELDS = frozenset({"password", "secret", "token", "private_key", "key_pem"})
REDACTED = "[redacted]"
MAX_STRING = 256
MAX_ITEMS = 32


def _clean(value: Any, depth: int = 0) -> Any:
    if isinstance(value, dict):
        return {
            k: (REDACTED if k in SECRET_FIELDS and v else _clean(v, depth + 1))
            for k, v in list(value.items())[:MAX_ITEMS]
        }
    if isinstance(value, list):
        kept = [_clean(v, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            kept.append(f"… {len(value) - MAX_ITEMS} more")
        return kept
    if isinstance(value, str) and len(value) > MAX_STRING:
        return f"{value[:MAX_STRING]}… ({len(value)} characters)"
    return value


def audit_arguments(request: object) -> dict[str, Any]:
    """``request`` (a protobuf message) as the audit log keeps it; ``{}`` for
    anything else (a client stream)."""
    if not isinstance(request, Message):
        return {}
    doc = json_format.MessageToDict(request, preserving_proto_field_name=True)
    cleaned = _clean(doc)
    return cleaned if isinstance(cleaned, dict) else {}
