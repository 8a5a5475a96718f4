"""An immutable sequence indexed by domain id whose copy-with-changes costs
the changes, not its length.

``Topology.with_specs`` makes a new generation each time a few nodes'
schedulability changes (every admission and release under a stream of
allocations). As one tuple of every domain's schedulable nodes, each new
generation copied the whole tuple twice: with 25,000 one-node domains,
a list and a tuple of 25,000 items per scheduling pass, the largest cost
of a pass that grew with the fleet. Here the items sit in chunks of
``CHUNK`` and a change copies the list of chunks and the chunks it touches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")

CHUNK_BITS = 6
CHUNK = 1 << CHUNK_BITS
_IN_CHUNK = CHUNK - 1


class Chunked(Generic[T]):
    """``items[d]``, ``len``, iteration and equality as a tuple's;
    ``replaced({d: item})`` for a new one with those items changed."""

    __slots__ = ("_chunks", "_len")

    def __init__(self, items: Iterable[T] = ()) -> None:
        whole = tuple(items)
        self._len = len(whole)
        self._chunks: tuple[tuple[T, ...], ...] = tuple(
            whole[i : i + CHUNK] for i in range(0, len(whole), CHUNK)
        )

    def __getitem__(self, d: int) -> T:
        if not 0 <= d < self._len:
            raise IndexError(f"index {d} out of range for {self._len} items")
        return self._chunks[d >> CHUNK_BITS][d & _IN_CHUNK]

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[T]:
        for chunk in self._chunks:
            yield from chunk

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Chunked):
            return NotImplemented
        return self._len == other._len and self._chunks == other._chunks

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Chunked({list(self)!r})"

    def replaced(self, changes: Mapping[int, T]) -> Chunked[T]:
        """These items with ``changes`` (index to item, each index in range)
        in their places; this one is untouched."""
        chunks = list(self._chunks)
        by_chunk: dict[int, list[tuple[int, T]]] = {}
        for d, item in changes.items():
            if not 0 <= d < self._len:
                raise IndexError(f"index {d} out of range for {self._len} items")
            by_chunk.setdefault(d >> CHUNK_BITS, []).append((d & _IN_CHUNK, item))
        for c, items in by_chunk.items():
            chunk = list(chunks[c])
            for i, item in items:
                chunk[i] = item
            chunks[c] = tuple(chunk)
        new: Chunked[T] = Chunked.__new__(Chunked)
        new._len = self._len
        new._chunks = tuple(chunks)
        return new
