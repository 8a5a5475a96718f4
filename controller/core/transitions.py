"""Persisted node transitions: state, reason and event in one transaction."""

from __future__ import annotations

import time
from typing import Any

from sqlmodel import Session

from controller.core.errors import NotFound
from controller.core.eventlog import record
from controller.core.states import NodeState, check_transition
from controller.store.models import NodeRow


def load_node(session: Session, name: str) -> NodeRow:
    """Raises NotFound when no node has that name."""
    row = session.get(NodeRow, name)
    if row is None:
        raise NotFound(kind="node", name=name)
    return row


def move(session: Session, row: NodeRow, target: NodeState, reason: str, **data: Any) -> bool:
    """Move ``row`` to ``target`` with ``reason``, recording a node.transition.

    Idempotent: a node already in ``target`` is left alone (returns False).

    Raises:
        FailedPrecondition: the state machine has no such transition.
    """
    current = NodeState(row.state)
    if not check_transition(row.name, current, target):
        return False
    row.state = target.value
    row.state_reason = reason
    row.updated_at = time.time()
    session.add(row)
    record(
        session,
        "node.transition",
        node=row.name,
        allocation=row.allocation_id,
        reason=reason,
        from_state=current.value,
        to_state=target.value,
        **data,
    )
    return True
