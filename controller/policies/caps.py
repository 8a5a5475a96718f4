"""Sliding-window caps on how many nodes the rules may take down.

Two budgets are kept, both in distinct nodes per rack and fleet-wide:

- **per rule** (a rule's ``caps``): the power-offs and the power cycles of
  one rule, each family on its own;
- **shared** (the rule set's ``blast_radius``): every rule's actions of the
  counted kinds together (drain, quarantine, power off, power cycle, GPU
  reset, unless ``counts`` says otherwise), so no mix of rules can take more
  of a rack down than the budget allows.

An action is admitted only when every budget that applies to it admits it,
and only then is it counted. A :class:`CapLedger` belongs to one engine and is
pure bookkeeping: the caller passes the time in. What an earlier engine
admitted (as the controller recorded it) is counted again with
:meth:`CapLedger.restore`, so a restart or a standby taking over does not
reset the budgets.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from controller.policies.rules import POWER_OFF_KINDS, ActionKind, Cap, Rule, RuleSet

# Keys of the shared budget. Live take-downs and dry-run ones are kept apart
# so that a rule on trial (dry run) never uses up what the live rules may do.
_LIVE = ("*", "live")
_DRY = ("*", "dry_run")


@dataclass(frozen=True, slots=True)
class PastAction:
    """An action an earlier engine admitted (not suppressed), as recorded."""

    rule: str
    node: str
    rack: str
    kind: ActionKind
    at: float
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class _Entry:
    at: float
    node: str
    rack: str


def _family(kind: ActionKind) -> str | None:
    if kind in POWER_OFF_KINDS:
        return "power_off"
    if kind is ActionKind.POWER_CYCLE:
        return "power_cycle"
    return None


class CapLedger:
    """Admits or refuses node take-downs against a rule set's caps."""

    def __init__(self, rules: RuleSet) -> None:
        self._rules = rules
        self._entries: dict[Hashable, list[_Entry]] = {}

    def admit(
        self, rule: Rule, kind: ActionKind, node: str, rack: str, now: float, *, dry_run: bool
    ) -> str | None:
        """Count ``node`` as taken down by ``rule`` with ``kind`` at ``now`` if
        every cap that applies allows it.

        Returns ``None`` when admitted (or when no cap applies), else the
        reason of the first cap that refused it (and counts nothing). A node
        already counted inside a window is admitted again by that cap without
        counting twice: caps count distinct nodes. A live action is counted
        against the live take-downs only; a dry-run one against live and
        dry-run ones, so a dry run shows what it would do were it live.
        """
        # (keys counted against, the cap, who and what a refusal names); the
        # first key is where the action itself is counted.
        checks: list[tuple[Sequence[Hashable], Cap, str, str]] = []
        family = _family(kind)
        own = rule.caps.for_kind(kind)
        if family is not None and own is not None:
            checks.append((((rule.name, family),), own, f"rule {rule.name}", family))
        shared = self._rules.blast_radius
        if shared is not None and kind in shared.kinds:
            pools = (_DRY, _LIVE) if dry_run else (_LIVE,)
            checks.append((pools, shared.cap, "all rules together", "blast_radius"))
        for keys, cap, who, label in checks:
            refused = self._refusal(keys, cap, node, rack, now, who, label)
            if refused is not None:
                return refused
        for keys, _, _, _ in checks:
            self._entries.setdefault(keys[0], []).append(_Entry(now, node, rack))
        return None

    def restore(self, history: Iterable[PastAction]) -> int:
        """Count actions admitted before (by an engine now gone) as if this
        ledger had admitted them; returns how many counted toward some cap.
        Entries older than a cap's window expire as usual."""
        counted = 0
        shared = self._rules.blast_radius
        for past in history:
            keys: list[Hashable] = []
            family = _family(past.kind)
            if family is not None:
                keys.append((past.rule, family))
            if shared is not None and past.kind in shared.kinds:
                keys.append(_DRY if past.dry_run else _LIVE)
            for key in keys:
                self._entries.setdefault(key, []).append(_Entry(past.at, past.node, past.rack))
            if keys:
                counted += 1
        return counted

    def _refusal(
        self,
        keys: Sequence[Hashable],
        cap: Cap,
        node: str,
        rack: str,
        now: float,
        who: str,
        label: str,
    ) -> str | None:
        entries: list[_Entry] = []
        for key in keys:
            # Filter rather than pop from the front: samples of different nodes
            # may arrive slightly out of time order.
            kept = [e for e in self._entries.get(key, ()) if e.at > now - cap.window_s]
            self._entries[key] = kept
            entries.extend(kept)
        nodes = {e.node for e in entries}
        if node in nodes:
            return None
        in_rack = len({e.node for e in entries if e.rack == rack})
        window = f"{cap.window_s:g}s"
        if cap.per_rack is not None and in_rack >= cap.per_rack:
            return (
                f"cap: {who} already took down {in_rack} node(s) in rack {rack} "
                f"within {window} ({label} per_rack={cap.per_rack})"
            )
        if cap.fleet is not None and len(nodes) >= cap.fleet:
            return (
                f"cap: {who} already took down {len(nodes)} node(s) fleet-wide "
                f"within {window} ({label} fleet={cap.fleet})"
            )
        return None
