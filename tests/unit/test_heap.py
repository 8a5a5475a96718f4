"""The collector settings a serving controller runs with (``controller/heap.py``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from controller import heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class _Node:
    def __init__(self) -> None:
        self.me: _Node | None = None


def test_settle_freezes_the_heap_and_collects_less_often(restored_gc: None) -> None:
    kept = [[f"node{i}"] for i in range(1000)]  # a loaded fleet, say
    heap.settle()
    assert gc.get_threshold() == (heap.YOUNG, heap.OLDER, heap.OLDER)
    assert heap.YOUNG > 700, "collects less often than CPython's default"
    assert gc.get_freeze_count() >= len(kept), "what existed is out of the collector's sight"
    assert gc.is_tracked(kept[0])
    assert not any(o is kept[0] for o in gc.get_objects()), "no longer in a generation"


def test_cycles_made_after_settle_are_still_collected(restored_gc: None) -> None:
    heap.settle()
    node = _Node()
    node.me = node  # a cycle: reference counting alone never frees it
    gone = weakref.ref(node)
    del node
    assert gone() is not None
    gc.collect()
    assert gone() is None
