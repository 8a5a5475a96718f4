"""JSON from outside has its nesting counted before it is parsed.

``json.loads`` recurses once a level. A BMC answer nested 100,000 deep used
to drive it to the recursion limit, and a garbage collection there ran other
objects' finalizers with no stack left (an "unraisable" RecursionError in
whatever finalizer ran). ``nesting`` counts the depth without recursion,
strings left out, so such text is refused before ``json.loads`` sees it: in
the Redfish driver, in a fault given to the API, and in a page token.
"""

from __future__ import annotations

import json

import pytest

from controller.bmc import redfish
from controller.bmc.redfish import MAX_JSON_DEPTH, _BadAnswer, _decode_document
from controller.core.json_depth import nesting, nests_deeper_than

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("depth", [1, 5, MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_the_scan_gives_the_depth_json_would_reach(depth: int) -> None:
    text = "[" * depth + "]" * depth
    assert nesting(text) == depth
    assert nests_deeper_than(text, MAX_JSON_DEPTH) == (depth > MAX_JSON_DEPTH)


def test_brackets_inside_strings_do_not_count() -> None:
    inner = '"' + "[{" * 200 + '\\"' + "]" * 10 + '"'
    doc = {"Name": json.loads(inner), "Members": [[[1]]]}
    text = json.dumps(doc)
    assert text.count("[") > MAX_JSON_DEPTH  # the scan does run
    assert nesting(text) == 4  # the object, then three lists
    assert _decode_document(text.encode(), "/x") == doc


def test_an_unterminated_string_runs_to_the_end_and_the_scan_stays_linear() -> None:
    # Every quote after the first is escaped: a scan that restarted at each
    # quote would be quadratic; this one reads the text once.
    text = "[" * 70 + '"' + '\\"[' * 200_000
    assert nesting(text) == 70
    with pytest.raises(_BadAnswer, match="nested deeper than 64 levels"):
        _decode_document(text.encode(), "/x")


def test_a_deep_answer_is_refused_without_calling_the_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def must_not_parse(*args: object, **kwargs: object) -> object:
        raise AssertionError("json.loads was called on a 100,000-deep answer")

    monkeypatch.setattr(redfish.json, "loads", must_not_parse)
    text = '{"a":' * 100_000 + "1" + "}" * 100_000
    with pytest.raises(_BadAnswer, match=f"/Systems/1: JSON nested deeper than {MAX_JSON_DEPTH}"):
        _decode_document(text.encode(), "/Systems/1")


def test_a_document_at_the_limit_is_parsed() -> None:
    text = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    doc = _decode_document(text.encode(), "/x")
    for _ in range(MAX_JSON_DEPTH - 1):
        doc = doc[0]
    assert doc == []


def test_text_that_is_not_json_is_measured_by_its_brackets() -> None:
    assert nesting("") == 0
    assert nesting("plain words") == 0
    assert nesting("]]]][[") == 0  # never above the top level
    assert nesting("[]" * 100 + "[[[]]]") == 3
    assert not nests_deeper_than("[" * 10, 10)
    assert nests_deeper_than("{" * 11, 10)
