"""The frozen topology snapshot placement runs over.

A :class:`Topology` is built once per inventory generation and shared
read-only by every placement decision until the next generation. It knows the
tree spine → leaf → NVLink domain → node and precomputes the static indexes
the engine needs (domain ids, per-scope domain lists, empty-fleet capacity
histograms); per-decision state lives in :class:`controller.placement.Usage`.

Constraints checked on build (``InvalidArgument``): node names are unique, and
every node of an NVLink domain shares GPU model, GPU count, leaf and spine;
every leaf sits under one spine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from controller.core.errors import InvalidArgument, NotFound
from controller.placement.model import NodeSpec
from controller.placement.spec_layers import SpecLayers

ANY_SCOPE = "any"


def leaf_scope(leaf: str) -> str:
    """Scope key of a leaf in the per-scope indexes."""
    return "leaf:" + leaf


def spine_scope(spine: str) -> str:
    """Scope key of a spine in the per-scope indexes."""
    return "spine:" + spine


def _same_place(a: NodeSpec, b: NodeSpec) -> bool:
    """Whether ``a`` and ``b`` differ in nothing but ``schedulable``."""
    return (a.name, a.gpu_model, a.gpus, a.domain, a.rack, a.leaf, a.spine) == (
        b.name,
        b.gpu_model,
        b.gpus,
        b.domain,
        b.rack,
        b.leaf,
        b.spine,
    )


class Topology:
    """Immutable snapshot of the fleet's nodes and their place in the tree.

    Domains are numbered 0..n-1 in (spine, leaf, domain) order so that
    neighbouring ids are topologically close; ``dom_*`` tuples are indexed by
    that id. Node-local indices refer to ``dom_nodes[d]`` (sorted by name).
    """

    __slots__ = (
        "_nodes",
        "_parent_sched",
        "_spec",
        "_touched",
        "dom_cap",
        "dom_gpus",
        "dom_id",
        "dom_is_rack",
        "dom_leaf",
        "dom_model",
        "dom_name",
        "dom_nodes",
        "dom_sched",
        "dom_scopes",
        "dom_spine",
        "generation",
        "loc",
        "max_size",
        "models",
        "scope_doms",
        "scopes_by_tier",
        "static_hist",
        "static_whole",
    )

    generation: int
    dom_name: tuple[str, ...]
    dom_nodes: tuple[tuple[str, ...], ...]
    dom_sched: tuple[tuple[int, ...], ...]
    dom_model: tuple[str, ...]
    dom_gpus: tuple[int, ...]
    dom_leaf: tuple[str, ...]
    dom_spine: tuple[str, ...]
    dom_is_rack: tuple[bool, ...]
    dom_cap: tuple[int, ...]
    dom_scopes: tuple[tuple[str, str, str], ...]
    dom_id: Mapping[str, int]
    loc: Mapping[str, tuple[int, int]]
    models: tuple[str, ...]
    max_size: int
    scope_doms: Mapping[tuple[str, str], tuple[int, ...]]
    scopes_by_tier: Mapping[tuple[str, int], tuple[str, ...]]
    static_hist: Mapping[tuple[str, str], tuple[int, ...]]
    static_whole: Mapping[tuple[str, str], int]

    def __init__(self) -> None:  # use Topology.build
        self._nodes: tuple[str, ...] = ()
        self._spec: SpecLayers = SpecLayers({})
        # Set by ``with_specs``: the parent's ``dom_sched`` and the domains
        # re-indexed since it, so ``changed_domains`` against the parent
        # costs what changed.
        self._parent_sched: tuple[tuple[int, ...], ...] | None = None
        self._touched: tuple[int, ...] = ()

    @classmethod
    def build(cls, nodes: Iterable[NodeSpec], generation: int = 0) -> Topology:
        """Build a snapshot; raises ``InvalidArgument`` on inconsistent input."""
        spec: dict[str, NodeSpec] = {}
        by_dom: dict[str, list[NodeSpec]] = {}
        leaf_spine: dict[str, str] = {}
        for n in nodes:
            if n.name in spec:
                raise InvalidArgument(f"node {n.name!r} appears twice in the topology")
            if n.gpus < 0:
                raise InvalidArgument(f"node {n.name!r}: gpus must not be negative")
            if leaf_spine.setdefault(n.leaf, n.spine) != n.spine:
                raise InvalidArgument(
                    f"leaf {n.leaf!r} sits under spines {leaf_spine[n.leaf]!r} and {n.spine!r}"
                )
            spec[n.name] = n
            by_dom.setdefault(n.domain, []).append(n)
        for dom, members in by_dom.items():
            first = members[0]
            for m in members[1:]:
                if (m.gpu_model, m.gpus, m.leaf, m.spine) != (
                    first.gpu_model,
                    first.gpus,
                    first.leaf,
                    first.spine,
                ):
                    raise InvalidArgument(
                        f"NVLink domain {dom!r} mixes nodes {first.name!r} and {m.name!r} "
                        "of different GPU model, GPU count, leaf or spine"
                    )
        order = sorted(by_dom, key=lambda d: (by_dom[d][0].spine, by_dom[d][0].leaf, d))
        self = cls()
        self.generation = generation
        self._spec = SpecLayers(spec)
        self.dom_name = tuple(order)
        dom_nodes = []
        dom_sched = []
        loc: dict[str, tuple[int, int]] = {}
        for d, dom in enumerate(order):
            members = sorted(by_dom[dom], key=lambda s: s.name)
            dom_nodes.append(tuple(s.name for s in members))
            dom_sched.append(tuple(i for i, s in enumerate(members) if s.schedulable))
            for i, s in enumerate(members):
                loc[s.name] = (d, i)
        self.dom_nodes = tuple(dom_nodes)
        self.dom_sched = tuple(dom_sched)
        self._nodes = tuple(n for names in self.dom_nodes for n in names)
        firsts = [by_dom[dom][0] for dom in order]
        self.dom_model = tuple(f.gpu_model for f in firsts)
        self.dom_gpus = tuple(f.gpus for f in firsts)
        self.dom_leaf = tuple(f.leaf for f in firsts)
        self.dom_spine = tuple(f.spine for f in firsts)
        self.dom_cap = tuple(len(n) for n in self.dom_nodes)
        self.dom_is_rack = tuple(c > 1 for c in self.dom_cap)
        self.dom_scopes = tuple(
            (leaf_scope(f.leaf), spine_scope(f.spine), ANY_SCOPE) for f in firsts
        )
        self.dom_id = MappingProxyType({dom: d for d, dom in enumerate(order)})
        self.loc = MappingProxyType(loc)
        self.models = tuple(sorted(set(self.dom_model)))
        self.max_size = max(self.dom_cap, default=0)
        self._index_scopes()
        return self

    def rescheduled(self, nodes: Iterable[NodeSpec], generation: int) -> Topology | None:
        """This topology with only which nodes are schedulable changed, as a
        new generation: the same nodes in the same places, so everything but
        ``dom_sched`` is shared. None when anything else differs (a node
        added, removed or moved, its GPUs changed): ``build`` a new one."""
        spec: dict[str, NodeSpec] = {}
        old = self._spec
        for n in nodes:
            was = old.get(n.name)
            if was is None or not _same_place(was, n):
                return None
            spec[n.name] = n
        if len(spec) != len(old):
            return None
        new = self._next(generation)
        new._spec = SpecLayers(spec)
        new.dom_sched = tuple(
            tuple(i for i, name in enumerate(names) if spec[name].schedulable)
            for names in self.dom_nodes
        )
        return new

    def with_specs(self, changed: Iterable[NodeSpec], generation: int) -> Topology | None:
        """``rescheduled`` for a few nodes: this topology with ``changed``
        (nodes already in it, in the same places) taking their new
        schedulability, as a new generation; only their domains are
        re-indexed. None when one of them is new or moved: ``build``."""
        old = self._spec
        spec: dict[str, NodeSpec] = {}
        touched: set[int] = set()
        for n in changed:
            was = old.get(n.name)
            if was is None or not _same_place(was, n):
                return None
            spec[n.name] = n
            touched.add(self.loc[n.name][0])
        new = self._next(generation)
        new._spec = old.replaced(spec)
        sched = list(self.dom_sched)
        for d in touched:
            sched[d] = tuple(
                i for i, name in enumerate(self.dom_nodes[d]) if new._spec[name].schedulable
            )
        new.dom_sched = tuple(sched)
        new._parent_sched = self.dom_sched
        new._touched = tuple(sorted(touched))
        return new

    def _next(self, generation: int) -> Topology:
        """A copy sharing everything, as ``generation``, with no parent."""
        new = Topology.__new__(Topology)
        for name in Topology.__slots__:
            setattr(new, name, getattr(self, name))
        new.generation = generation
        new._parent_sched = None
        new._touched = ()
        return new

    def _index_scopes(self) -> None:
        scope_doms: dict[tuple[str, str], list[int]] = {}
        tiers: dict[tuple[str, int], list[str]] = {}
        hist: dict[tuple[str, str], list[int]] = {}
        whole: dict[tuple[str, str], int] = {}
        for d, scopes in enumerate(self.dom_scopes):
            m = self.dom_model[d]
            for tier, scope in enumerate(scopes, start=1):
                key = (m, scope)
                if key not in scope_doms:
                    scope_doms[key] = []
                    tiers.setdefault((m, tier), []).append(scope)
                    hist[key] = [0] * (self.max_size + 1)
                    whole[key] = 0
                scope_doms[key].append(d)
                hist[key][self.dom_cap[d]] += 1
                whole[key] += int(self.dom_is_rack[d])
        self.scope_doms = MappingProxyType({k: tuple(v) for k, v in scope_doms.items()})
        self.scopes_by_tier = MappingProxyType({k: tuple(v) for k, v in tiers.items()})
        self.static_hist = MappingProxyType({k: tuple(v) for k, v in hist.items()})
        self.static_whole = MappingProxyType(whole)

    # -- read-only accessors -------------------------------------------------

    def changed_domains(self, other: Topology) -> list[int]:
        """The domains whose schedulable nodes differ from ``other``'s, one of
        the same shape (``rescheduled``)."""
        if other.dom_sched is self._parent_sched:  # one ``with_specs`` apart
            return [d for d in self._touched if self.dom_sched[d] != other.dom_sched[d]]
        pairs = zip(self.dom_sched, other.dom_sched, strict=True)
        return [d for d, (a, b) in enumerate(pairs) if a is not b and a != b]

    @property
    def nodes(self) -> tuple[str, ...]:
        """All node names, grouped by domain in (spine, leaf, domain) order."""
        return self._nodes

    @property
    def domains(self) -> tuple[str, ...]:
        """All NVLink domain ids in (spine, leaf, domain) order."""
        return self.dom_name

    @property
    def leaves(self) -> tuple[str, ...]:
        """All leaf names, sorted."""
        return tuple(sorted(set(self.dom_leaf)))

    @property
    def spines(self) -> tuple[str, ...]:
        """All spine names, sorted."""
        return tuple(sorted(set(self.dom_spine)))

    def node(self, name: str) -> NodeSpec:
        """The spec of ``name``; raises ``NotFound``."""
        try:
            return self._spec[name]
        except KeyError:
            raise NotFound(kind="node", name=name) from None

    def has_node(self, name: str) -> bool:
        return name in self._spec

    def domain_nodes(self, domain: str) -> tuple[str, ...]:
        """Nodes of an NVLink domain, sorted; raises ``NotFound``."""
        try:
            return self.dom_nodes[self.dom_id[domain]]
        except KeyError:
            raise NotFound(kind="NVLink domain", name=domain) from None

    def is_rack_domain(self, domain: str) -> bool:
        """True for a multi-node NVLink domain (an NVL72 rack), False for one box."""
        try:
            return self.dom_is_rack[self.dom_id[domain]]
        except KeyError:
            raise NotFound(kind="NVLink domain", name=domain) from None

    def domain_of(self, node: str) -> str:
        return self.node(node).domain

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return (
            f"Topology(generation={self.generation}, nodes={len(self._nodes)}, "
            f"domains={len(self.dom_name)})"
        )
