"""The event record, its JSON form and its schema."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from controller.core.errors import InvalidArgument
from controller.events import EVENT_SCHEMA, Event, EventKind
from controller.events.model import KIND_PATTERN

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events.md"

EXAMPLES = [
    pytest.param(
        Event(
            1,
            1_700_000_000.5,
            "node.transition",
            node="r1n1",
            reason="drain requested",
            data={"from": "ready", "to": "draining"},
        ),
        id="node-transition",
    ),
    pytest.param(
        Event(
            2,
            1_700_000_001.0,
            "policy.action",
            node="r1n1",
            rule="gpu-hot",
            reason="gpu3 margin 2 C",
            data={"action": "drain", "dry_run": False, "suppressed": None},
        ),
        id="policy-action",
    ),
    pytest.param(
        Event(
            3,
            1_700_000_002,
            "allocation.created",
            allocation="a-17",
            data={"nodes": ["r1n1", "r1n2"], "priority": 5},
        ),
        id="allocation-created",
    ),
    pytest.param(Event(4, 0, "node.health"), id="bare-minimum"),
]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(EVENT_SCHEMA)
    return jsonschema.Draft202012Validator(EVENT_SCHEMA)


@pytest.mark.parametrize("event", EXAMPLES)
def test_emitted_json_validates_and_round_trips(
    event: Event, validator: jsonschema.Draft202012Validator
) -> None:
    text = event.to_json()
    validator.validate(json.loads(text))
    assert Event.from_json(text) == event
    assert Event.from_json(text.encode()) == event


def valid_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(Event(7, 10.0, "node.power", node="n1").to_json())
    doc.update(changes)
    return doc


INVALID = [
    pytest.param(valid_doc(seq=0), id="seq-zero"),
    pytest.param(valid_doc(seq="7"), id="seq-string"),
    pytest.param(valid_doc(seq=True), id="seq-bool"),
    pytest.param(valid_doc(at="yesterday"), id="at-string"),
    pytest.param(valid_doc(node=5), id="node-number"),
    pytest.param(valid_doc(reason=None), id="reason-null"),
    pytest.param(valid_doc(data=[1, 2]), id="data-list"),
    pytest.param(valid_doc(extra=1), id="unknown-field"),
    pytest.param({k: v for k, v in valid_doc().items() if k != "kind"}, id="missing-kind"),
    pytest.param({k: v for k, v in valid_doc().items() if k != "rule"}, id="missing-rule"),
]


@pytest.mark.parametrize("doc", INVALID)
def test_invalid_documents_fail_schema_and_parser(
    doc: dict[str, Any], validator: jsonschema.Draft202012Validator
) -> None:
    assert not validator.is_valid(doc)
    with pytest.raises(InvalidArgument):
        Event.from_json(json.dumps(doc))


@pytest.mark.parametrize("text", ["not json", "[1]", "null"], ids=["garbage", "array", "null"])
def test_from_json_rejects_non_objects(text: str) -> None:
    with pytest.raises(InvalidArgument):
        Event.from_json(text)


@pytest.mark.parametrize(
    "data", [{"x": object()}, {"t": math.nan}], ids=["unencodable-object", "nan"]
)
def test_to_json_rejects_data_json_cannot_carry(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match="is not JSON"):
        Event(1, 0.0, "node.health", data=data).to_json()


def test_every_kind_matches_the_schema_pattern_and_is_documented() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for kind in EventKind:
        assert re.match(KIND_PATTERN, kind.value), kind
        assert f"`{kind.value}`" in docs, f"{kind.value} missing from docs/events.md"


def test_schema_rejects_malformed_kind(validator: jsonschema.Draft202012Validator) -> None:
    assert not validator.is_valid(valid_doc(kind="NodeTransition"))
    assert not validator.is_valid(valid_doc(kind="node."))
    assert validator.is_valid(valid_doc(kind="future.kind_we_do_not_know"))
