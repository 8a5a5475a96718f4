"""The event record every state change produces, and its JSON form.

An :class:`Event` is written by the controller in the same database
transaction as the change it describes (the outbox pattern), gets a strictly
increasing ``seq`` there, and is later published to MQTT and streamed over
gRPC. Consumers order and de-duplicate by ``seq``: delivery is at least once.

The JSON form is one object with exactly the fields of :class:`Event`;
:data:`EVENT_SCHEMA` (JSON Schema draft 2020-12) is its contract.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from controller.core.errors import InvalidArgument
from controller.core.kinds import EventKind

__all__ = ["AUDIT_CALL_DATA_SCHEMA", "EVENT_SCHEMA", "KIND_PATTERN", "Event", "EventKind"]

KIND_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"

EVENT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:kiln:schema:v1:event",
    "title": "Kiln event",
    "type": "object",
    "additionalProperties": False,
    "required": ["seq", "at", "kind", "node", "allocation", "rule", "reason", "data"],
    "properties": {
        "seq": {
            "type": "integer",
            "minimum": 1,
            "description": "Strictly increasing per controller database; order and dedupe by it.",
        },
        "at": {"type": "number", "minimum": 0, "description": "Unix time in seconds."},
        "kind": {
            "type": "string",
            "pattern": KIND_PATTERN,
            "description": "Dotted kind, e.g. node.transition; see docs/events.md.",
        },
        "node": {"type": ["string", "null"], "minLength": 1},
        "allocation": {"type": ["string", "null"], "minLength": 1},
        "rule": {"type": ["string", "null"], "minLength": 1},
        "reason": {"type": "string"},
        "data": {"type": "object", "description": "Kind-specific details."},
    },
}

_TEXT: dict[str, Any] = {"type": "string"}

AUDIT_CALL_DATA_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:kiln:schema:v1:event:audit.call:data",
    "title": "Kiln audit.call event data",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "who",
        "role",
        "via",
        "subject",
        "method",
        "arguments",
        "code",
        "detail",
        "peer",
    ],
    "properties": {
        "who": {**_TEXT, "minLength": 1, "description": "Token, certificate or node name."},
        "role": {"enum": ["viewer", "operator", "provisioner", "admin", "agent", "-"]},
        "via": {"enum": ["token", "certificate", "none", "-"]},
        "subject": _TEXT,
        "method": {**_TEXT, "minLength": 1, "description": "The RPC, e.g. PowerNode."},
        "arguments": {"type": "object", "description": "The request, secrets redacted."},
        "code": {"type": "string", "pattern": "^[A-Z_]+$"},
        "detail": {**_TEXT, "maxLength": 200},
        "peer": _TEXT,
    },
}
"""The ``data`` of an ``audit.call`` event (docs/events.md)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened. ``data`` must be JSON-serialisable."""

    seq: int
    at: float
    kind: str
    node: str | None = None
    allocation: str | None = None
    rule: str | None = None
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """Compact JSON with sorted keys. Raises InvalidArgument if ``data``
        cannot be represented in JSON."""
        try:
            return json.dumps(
                {
                    "seq": self.seq,
                    "at": self.at,
                    "kind": self.kind,
                    "node": self.node,
                    "allocation": self.allocation,
                    "rule": self.rule,
                    "reason": self.reason,
                    "data": self.data,
                },
                sort_keys=True,
                separators=(",", ":"),
                allow_nan=False,
            )
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"event {self.seq} ({self.kind}) is not JSON: {e}") from e

    @classmethod
    def from_json(cls, text: str | bytes) -> Event:
        """Parse and check the JSON form. Raises InvalidArgument on any deviation
        from :data:`EVENT_SCHEMA`'s required fields and types."""
        try:
            doc = json.loads(text)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"event is not valid JSON: {e}") from e
        if not isinstance(doc, dict):
            raise InvalidArgument("event must be a JSON object")
        missing = sorted(set(EVENT_SCHEMA["required"]) - doc.keys())
        extra = sorted(doc.keys() - EVENT_SCHEMA["properties"].keys())
        if missing or extra:
            raise InvalidArgument(f"event fields: missing {missing}, unexpected {extra}")
        seq, at = doc["seq"], doc["at"]
        if not _is_int(seq) or seq < 1:
            raise InvalidArgument(f"event seq must be a positive integer, got {seq!r}")
        if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
            raise InvalidArgument(f"event {seq}: 'at' must be a number, got {at!r}")
        if not isinstance(doc["kind"], str) or not doc["kind"]:
            raise InvalidArgument(f"event {seq}: 'kind' must be a non-empty string")
        for name in ("node", "allocation", "rule"):
            if doc[name] is not None and not isinstance(doc[name], str):
                raise InvalidArgument(f"event {seq}: {name!r} must be a string or null")
        if not isinstance(doc["reason"], str):
            raise InvalidArgument(f"event {seq}: 'reason' must be a string")
        if not isinstance(doc["data"], dict):
            raise InvalidArgument(f"event {seq}: 'data' must be an object")
        return cls(
            seq=seq,
            at=float(at),
            kind=doc["kind"],
            node=doc["node"],
            allocation=doc["allocation"],
            rule=doc["rule"],
            reason=doc["reason"],
            data=doc["data"],
        )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
