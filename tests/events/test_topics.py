"""Topic naming and escaping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.events import Event, topic_segment, topics_for

CASES = [
    pytest.param(
        Event(1, 0, "node.power", node="r1n1"),
        ["kiln/v1/nodes/r1n1/events", "kiln/v1/events"],
        id="node",
    ),
    pytest.param(
        Event(1, 0, "allocation.ready", allocation="a-9"),
        ["kiln/v1/allocations/a-9/events", "kiln/v1/events"],
        id="allocation",
    ),
    pytest.param(
        Event(1, 0, "policy.action", node="n1", allocation="a1", rule="gpu-hot"),
        [
            "kiln/v1/nodes/n1/events",
            "kiln/v1/allocations/a1/events",
            "kiln/v1/rules/gpu-hot/events",
            "kiln/v1/events",
        ],
        id="node-allocation-rule",
    ),
    pytest.param(Event(1, 0, "fleet.note"), ["kiln/v1/events"], id="no-subject"),
    pytest.param(Event(1, 0, "node.power", node=""), ["kiln/v1/events"], id="empty-name-absent"),
    pytest.param(
        Event(1, 0, "node.power", node="rack/1+#"),
        ["kiln/v1/nodes/rack%2F1%2B%23/events", "kiln/v1/events"],
        id="wildcards-escaped",
    ),
    pytest.param(
        Event(1, 0, "node.power", node="$SYS"),
        ["kiln/v1/nodes/%24SYS/events", "kiln/v1/events"],
        id="leading-dollar",
    ),
    pytest.param(
        Event(1, 0, "node.power", node="50%"),
        ["kiln/v1/nodes/50%25/events", "kiln/v1/events"],
        id="percent",
    ),
]


@pytest.mark.parametrize(("event", "expected"), CASES)
def test_topics_for(event: Event, expected: list[str]) -> None:
    assert topics_for(event) == expected


def test_custom_prefix() -> None:
    assert topics_for(Event(1, 0, "node.power", node="n"), prefix="site-a/kiln") == [
        "site-a/kiln/nodes/n/events",
        "site-a/kiln/events",
    ]


@given(st.text(min_size=1), st.text(min_size=1))
def test_segments_are_safe_and_distinct(a: str, b: str) -> None:
    sa, sb = topic_segment(a), topic_segment(b)
    for s in (sa, sb):
        assert not set(s) & {"/", "+", "#", "\x00"}
        assert not s.startswith("$")
    assert (sa == sb) == (a == b)


def test_empty_segment_rejected() -> None:
    with pytest.raises(ValueError):
        topic_segment("")
