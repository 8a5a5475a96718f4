"""Persisted node transitions: state, reason and event in one transaction."""

from __future__ import annotations

import time
from typing import Any

from controller.core.errors import NotFound
from controller.core.eventlog import record
from controller.core.kinds import EventKind
from controller.core.ports import Tx
from controller.core.records import NodeRecord
from controller.core.states import NodeState, check_transition


def load_node(tx: Tx, name: str) -> NodeRecord:
    """The node, to change in ``tx`` (without its health: the latest report
    lives in memory, and a save never writes it). Raises NotFound when no
    node has that name."""
    node = tx.nodes.get(name, with_health=False)
    if node is None:
        raise NotFound(kind="node", name=name)
    return node


def move(tx: Tx, node: NodeRecord, target: NodeState, reason: str, **data: Any) -> bool:
    """Move ``node`` to ``target`` with ``reason`` and save it, recording a
    node.transition. Idempotent: a node already in ``target`` is left alone
    (nothing is saved; returns False).

    Raises:
        FailedPrecondition: the state machine has no such transition.
    """
    current = node.state
    if not check_transition(node.name, current, target):
        return False
    node.state = target
    node.state_reason = reason
    node.updated_at = time.time()
    tx.nodes.save(node)
    record(
        tx,
        EventKind.NODE_TRANSITION,
        node=node.name,
        allocation=node.allocation_id,
        reason=reason,
        from_state=current.value,
        to_state=target.value,
        **data,
    )
    return True
