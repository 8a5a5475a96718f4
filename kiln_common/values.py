"""Immutable value classes that cost no more to build than plain ones.

A frozen dataclass sets each field in ``__init__`` through
``object.__setattr__``: for a GPU's health (30 fields) that is 3.3 us
against 0.8 us for the same class unfrozen, and the controller builds two
such objects for every GPU of every agent report (25,000 nodes of 8 GPUs).

``value_class`` gives the type checker a frozen dataclass (mypy refuses any
assignment to a field, so no code in ``controller/`` or ``agent/`` can
change one) and builds a plain slotted dataclass at run time, hashable by
its fields as a frozen one is. Use it for the values made once per report;
``dataclass(frozen=True)`` stays right everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value_class(cls: type[T]) -> type[T]:
    """A frozen dataclass to the type checker; slotted, compared and hashed by
    its fields at run time, without frozen's per-field cost to build."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
