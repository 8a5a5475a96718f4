"""What the scheduler sees of each compute node (``NodeSpec``), kept by change.

A scheduling pass needs every compute node's place and whether it may take
new work. Building that for the whole fleet on every pass cost O(fleet) per
admission: at 2,500 nodes it was most of a create/release cycle. This keeps
the specs and recomputes only the nodes something may have changed since the
last pass, told by whoever changes what ``Nodes.placeable`` reads:

* a commit that saved, re-inventoried or removed a node (``touch_changes``,
  from ``Store.on_nodes_committed``);
* an agent attaching or going away (``touch``, from ``AgentHub.watch``);
* a health report, which the baseline gate judges (``touch``, from
  ``LiveHealth.listen``).

``touch_all`` (also the state it starts in) recomputes everything at the
next ``refresh``. ``Allocations`` turns what changed into a topology
generation: only schedulability moved, the same topology ``rescheduled``;
anything else, a new build.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from controller.core.node_view import NodeChanges, NodeView
from controller.core.records import NodeRecord
from controller.core.states import NodeKind
from controller.placement import NodeSpec


def node_spec(node: NodeRecord, schedulable: bool) -> NodeSpec:
    rack = node.rack or node.name
    return NodeSpec(
        name=node.name,
        gpu_model=node.gpu_model or "unknown",
        gpus=node.gpu_count,
        domain=node.nvlink_domain or node.name,
        rack=rack,
        leaf=node.leaf or rack,
        spine=node.spine or "spine-0",
        schedulable=schedulable,
    )


class NodeSpecs:
    """Every compute node's spec as of the last ``refresh``.

    Args:
        view: the nodes as committed (``Nodes.view``).
        placeable: whether a node may be given new work (``Nodes.placeable``).
    """

    def __init__(self, view: NodeView, placeable: Callable[[NodeRecord], bool]) -> None:
        self._view = view
        self._placeable = placeable
        self._specs: dict[str, NodeSpec] = {}
        self._dirty: set[str] = set()
        self._all = True

    def touch(self, name: str) -> None:
        """``name``'s spec may have changed."""
        self._dirty.add(name)

    def touch_changes(self, changes: NodeChanges) -> None:
        self._dirty.update(changes.saved)
        self._dirty.update(changes.gpus)
        self._dirty.update(changes.removed)

    def touch_all(self) -> None:
        self._all = True

    @property
    def specs(self) -> Mapping[str, NodeSpec]:
        """By name, as of the last ``refresh`` (do not change)."""
        return self._specs

    def refresh(self) -> set[str] | None:
        """Bring the specs up to date with the node view (which must be
        loaded); returns the names whose spec changed (added and removed
        ones included), or None when every spec was recomputed."""
        view, placeable = self._view, self._placeable
        if self._all:
            self._all, self._dirty = False, set()
            self._specs = {
                n.name: node_spec(n, placeable(n)) for n in view.all() if n.kind == NodeKind.COMPUTE
            }
            return None
        changed: set[str] = set()
        dirty, self._dirty = self._dirty, set()
        for name in dirty:
            node = view.get(name)
            before = self._specs.get(name)
            if node is None or node.kind != NodeKind.COMPUTE:
                if before is not None:
                    del self._specs[name]
                    changed.add(name)
                continue
            spec = node_spec(node, placeable(node))
            if spec != before:
                self._specs[name] = spec
                changed.add(name)
        return changed
