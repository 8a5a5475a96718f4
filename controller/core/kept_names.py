"""The names of the nodes a test holds for, kept by change rather than by scan.

A periodic task that wants a few nodes out of the whole fleet (the health
policies' nodes without an agent, the nodes power sync reads every pass)
looked at every record to find them: at 25,000 nodes, tens of milliseconds
of the idle controller's CPU each time. ``KeptNames`` holds the names for
which ``test(record, agent connected)`` is true, and looks again only at the
nodes a commit saved or removed since (the view's ``NodeFeed``, as the
lifecycle and the leak watcher use it) and those whose agent attached or
went (``AgentHub.watch``). It looks at the whole view on its first look and
after the view is loaded anew, a slice at a time (``scan``).

The test may depend on nothing but the record and the agent's connection:
anything else that changes would not be seen.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.core import scan
from controller.core.agents import AgentHub
from controller.core.node_view import NodeFeed, NodeView
from controller.core.records import NodeRecord

Test = Callable[[NodeRecord, bool], bool]


class KeptNames:
    """See the module docstring."""

    def __init__(self, agents: AgentHub, test: Test) -> None:
        self._agents = agents
        self._test = test
        self._names: set[str] = set()
        self._feed: NodeFeed | None = None
        self._view: NodeView | None = None
        self._agents_moved: set[str] = set()
        agents.watch(self._agents_moved_for)

    def _agents_moved_for(self, node: str) -> None:
        self._agents_moved.add(node)

    async def names(self, view: NodeView) -> set[str]:
        """The names the test holds for now (the caller must not change the
        set: it is the one kept)."""
        if self._feed is None or view is not self._view:
            self._feed, self._view = view.watch(), view
        everything, saved = self._feed.take()
        moved, self._agents_moved = self._agents_moved, set()
        connected = self._agents.is_connected
        test = self._test
        if everything:
            kept = await scan.select(view.all(), lambda r: test(r, connected(r.name)))
            self._names = {r.name for r in kept}
            return self._names
        for name in saved | moved:
            record = view.get(name)
            if record is not None and test(record, connected(name)):
                self._names.add(name)
            else:
                self._names.discard(name)
        return self._names
