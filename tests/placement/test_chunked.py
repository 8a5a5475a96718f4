"""``Chunked``: a tuple's reads, and a copy with changes that leaves the
original as it was, across chunk boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.placement.chunked import CHUNK, Chunked


def test_reads_as_the_tuple_it_was_built_from() -> None:
    items = tuple(range(3 * CHUNK + 5))
    c = Chunked(items)
    assert len(c) == len(items) and list(c) == list(items)
    assert [c[d] for d in range(len(items))] == list(items)
    assert c == Chunked(items) and c != Chunked(items[:-1])
    with pytest.raises(IndexError):
        c[len(items)]
    with pytest.raises(IndexError):
        c[-1]  # ids are never negative: a negative one is a bug, not the last item
    assert len(Chunked(())) == 0 and list(Chunked(())) == []


@given(
    size=st.integers(min_value=1, max_value=5 * CHUNK),
    changes=st.dictionaries(st.integers(min_value=0), st.integers(), max_size=20),
)
def test_replaced_changes_only_its_items_and_keeps_the_original(
    size: int, changes: dict[int, int]
) -> None:
    changes = {d % size: v for d, v in changes.items()}
    before = list(range(size))
    c = Chunked(before)
    new = c.replaced(changes)
    want = list(before)
    for d, v in changes.items():
        want[d] = v
    assert list(new) == want and [new[d] for d in range(size)] == want
    assert list(c) == before  # the old generation is untouched
    assert new == Chunked(want)


def test_replaced_refuses_an_index_out_of_range_and_changes_nothing() -> None:
    c = Chunked(range(10))
    with pytest.raises(IndexError):
        c.replaced({10: 1})
    assert list(c) == list(range(10))
