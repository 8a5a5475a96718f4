"""Sliding-window caps on how many nodes one rule may take down.

A :class:`CapLedger` belongs to one engine; it remembers, per (rule, family),
which nodes were powered down (or cycled) and when. It is pure bookkeeping:
the caller passes the time in.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.policies.rules import Cap


@dataclass(frozen=True, slots=True)
class _Entry:
    at: float
    node: str
    rack: str


class CapLedger:
    """Admits or refuses node take-downs against :class:`Cap` limits."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], list[_Entry]] = {}

    def admit(
        self, rule: str, family: str, cap: Cap, node: str, rack: str, now: float
    ) -> str | None:
        """Record ``node`` as taken down by ``rule`` at ``now`` if the cap allows.

        Returns ``None`` when admitted, else the reason it was refused (and
        records nothing). A node already counted inside the window is admitted
        again without counting twice: caps count distinct nodes.
        """
        # Filter rather than pop from the front: samples of different nodes may
        # arrive slightly out of time order.
        entries = [e for e in self._entries.get((rule, family), ()) if e.at > now - cap.window_s]
        self._entries[(rule, family)] = entries
        nodes = {e.node for e in entries}
        if node in nodes:
            entries.append(_Entry(now, node, rack))
            return None
        in_rack = len({e.node for e in entries if e.rack == rack})
        window = f"{cap.window_s:g}s"
        if cap.per_rack is not None and in_rack >= cap.per_rack:
            return (
                f"cap: rule {rule} already took down {in_rack} node(s) in rack {rack} "
                f"within {window} ({family} per_rack={cap.per_rack})"
            )
        if cap.fleet is not None and len(nodes) >= cap.fleet:
            return (
                f"cap: rule {rule} already took down {len(nodes)} node(s) fleet-wide "
                f"within {window} ({family} fleet={cap.fleet})"
            )
        entries.append(_Entry(now, node, rack))
        return None
