"""Power-state sync: notice nodes whose power changed behind Kiln's back.

Every ``interval`` seconds all enrolled BMCs are read with bounded
concurrency (a broken BMC's breaker makes it fail fast, so it never slows
the rest). A node whose power is not what Kiln last set, or not what its
state implies (a node in service should be on), gets one ``node.drift``
event per change; if a job holds it, the job is told. The BMC's health is
folded into the node's status either way.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlmodel import Session

from controller.core.eventlog import record
from controller.core.nodes import Nodes
from controller.core.ports import BmcGateway
from controller.core.states import NodeState
from controller.store.database import Database
from controller.store.models import NodeRow

log = logging.getLogger(__name__)

IN_SERVICE = (NodeState.READY, NodeState.ALLOCATED, NodeState.PREPARING)


def expected_power(row: NodeRow) -> str | None:
    """What Kiln believes the node's power should be (None: no opinion)."""
    if row.expected_power:
        return row.expected_power
    if row.state in IN_SERVICE:
        return "on"
    return None


def note_power(session: Session, row: NodeRow, power: str, health: str) -> bool:
    """Fold one reading into ``row``; True when the node is not as Kiln expects."""
    row.bmc_health = health
    session.add(row)
    want = expected_power(row)
    drifted = want is not None and power != want
    if drifted and power != row.power:  # tell once per change, not every pass
        reason = f"BMC reports power {power}; Kiln expected {want}"
        record(
            session,
            "node.drift",
            node=row.name,
            allocation=row.allocation_id,
            reason=reason,
            expected=want,
            actual=power,
        )
        if row.allocation_id:
            record(
                session,
                "allocation.notice",
                node=row.name,
                allocation=row.allocation_id,
                reason=f"{row.name}: {reason}",
            )
    row.power = power
    return drifted


class PowerSync:
    def __init__(
        self,
        db: Database,
        nodes: Nodes,
        bmc: BmcGateway,
        *,
        interval: float = 60.0,
        concurrency: int = 256,
    ) -> None:
        self._db = db
        self._nodes = nodes
        self._bmc = bmc
        self.interval = interval
        self.concurrency = concurrency
        self.last_pass_seconds = 0.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.run_once()
            except Exception:
                log.exception("power sync pass failed")

    async def run_once(self) -> list[str]:
        """Poll every BMC once; returns the nodes whose power is not as expected."""
        started = time.monotonic()
        rows = await self._nodes.rows()
        polled = await self._bmc.poll_power([self._nodes.target(r) for r in rows], self.concurrency)
        drifted = await self._db.tx(lambda s: self._apply(s, polled))
        self.last_pass_seconds = time.monotonic() - started
        log.info(
            "power sync: %d BMCs in %.1fs, %d not as expected",
            len(rows),
            self.last_pass_seconds,
            len(drifted),
        )
        return drifted

    @staticmethod
    def _apply(session: Session, polled: dict[str, tuple[str | None, str]]) -> list[str]:
        drifted = []
        for name, (power, health) in polled.items():
            row = session.get(NodeRow, name)
            if row is None:
                continue
            if power is None:  # unreadable: only the BMC's health changes
                row.bmc_health = health
                session.add(row)
            elif note_power(session, row, power, health):
                drifted.append(name)
        return sorted(drifted)
