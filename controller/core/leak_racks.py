"""Rack isolation after coolant leaks: the transaction ``LeakWatcher`` runs
when two or more trays of one rack have their power blocked."""

from __future__ import annotations

from controller.core.eventlog import record, tell_job
from controller.core.kinds import EventKind
from controller.core.model import EventInfo
from controller.core.ports import Tx
from controller.core.states import OUT_OF_SERVICE, NodeState
from controller.core.transitions import move

RACK_ISOLATION_TRAYS = 2  # blocked trays in one rack that isolate the rack


def isolate(tx: Tx, rack: str) -> tuple[list[str], list[str], bool] | None:
    """Drain every node of ``rack`` that is not blocked, tell their jobs, and
    record ``rack.isolation_requested`` unless it was requested since the
    rack's last cleared leak. None when fewer than the threshold are blocked.
    Returns (the blocked trays, the nodes drained now, whether it was recorded)."""
    members = tx.nodes.find(rack=rack, with_health=False)
    leaking = [n.name for n in members if n.power_block]
    if len(leaking) < RACK_ISOLATION_TRAYS:
        return None
    why = f"rack {rack} isolated: coolant leaks on {len(leaking)} trays ({', '.join(leaking)})"
    drained = []
    for node in members:
        if node.power_block or node.state == NodeState.DRAINING:
            continue
        if node.state in OUT_OF_SERVICE:
            if not node.drained:
                node.drained = True
                tx.nodes.save(node)
            continue
        node.drained = True
        if node.drain_target is None:
            node.drain_target = NodeState.MAINTENANCE
        tx.nodes.save(node)
        move(tx, node, NodeState.DRAINING, why)
        drained.append(node.name)
        tell_job(tx, node, f"{node.name}: {why}; drained", action="drain")
    requested = not isolation_requested(tx, rack)
    if requested:
        record(
            tx,
            EventKind.RACK_ISOLATION_REQUESTED,
            reason=why,
            rack=rack,
            leaking=leaking,
            drained=drained,
            nodes=[n.name for n in members],
        )
    return leaking, drained, requested


def isolation_requested(tx: Tx, rack: str) -> bool:
    """Whether the rack's isolation was requested after its last cleared leak."""

    def of_rack(event: EventInfo) -> bool:
        return bool(event.data.get("rack") == rack)

    asked = tx.events.latest(EventKind.RACK_ISOLATION_REQUESTED, limit=1, where=of_rack)
    if not asked:
        return False
    since = asked[-1].at
    return not tx.events.latest(EventKind.NODE_LEAK_CLEARED, since_at=since, limit=1, where=of_rack)
