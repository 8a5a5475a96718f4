"""Connected node agents and the commands in flight to them.

One session per node: a newer connection replaces an older one, whose pending
commands then fail with Unavailable. The transport (a gRPC stream) lives in
the API layer; it pulls commands from the session's queue and resolves their
outcomes here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controller.core.errors import Unavailable
from controller.core.model import AgentCommand, CommandOutcome, ReportInterval

log = logging.getLogger(__name__)

# What a session's transport sends: a command (with its id) or a new pace.
Outgoing = tuple[str, AgentCommand] | ReportInterval


@dataclass(eq=False)
class AgentSession:
    node: str
    cert_expires_at: float | None = None  # its client certificate's expiry (Unix s)
    # What its transport sends next; None: the stream's reading side ended.
    queue: asyncio.Queue[Outgoing | None] = field(default_factory=asyncio.Queue)
    pending: dict[str, asyncio.Future[CommandOutcome]] = field(default_factory=dict)
    closed: bool = False
    attached_at: float = field(default_factory=time.time)  # when it registered (Unix s)
    # Set by a transport that can tell the agent a new pace at once, beside
    # the queue (a relayed call: straight onto its worker's link); False
    # when it cannot now, and the queue takes it.
    tell_pace: Callable[[float], bool] | None = None

    def reading_ended(self) -> None:
        """The agent's messages ended (or were refused): wake the transport's
        sender, which then finishes the stream."""
        self.queue.put_nowait(None)

    def fail_pending(self, reason: str) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(Unavailable(reason))
        self.pending.clear()


class AgentHub:
    def __init__(self) -> None:
        self._sessions: dict[str, AgentSession] = {}
        self._ids = itertools.count(1)
        self._watchers: list[Callable[[str], None]] = []
        self._arrivals: dict[str, list[asyncio.Event]] = {}

    def watch(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(node)`` whenever the node's agent attaches or goes."""
        self._watchers.append(listener)

    def _changed(self, node: str) -> None:
        for listener in self._watchers:
            listener(node)

    async def attached_since(self, node: str, since: float, timeout: float) -> bool:
        """Wait until the node's agent is one that registered at or after
        ``since`` (Unix s): the agent of a boot that began then, not a session
        of the boot before that has not yet been seen to end. False when none
        has after ``timeout`` seconds."""
        arrived = asyncio.Event()
        waiting = self._arrivals.setdefault(node, [])
        waiting.append(arrived)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    session = self._sessions.get(node)
                    if session is not None and session.attached_at >= since:
                        return True
                    await arrived.wait()
                    arrived.clear()
        except TimeoutError:
            return False
        finally:
            waiting.remove(arrived)
            if not waiting:
                del self._arrivals[node]

    def attach(self, node: str, *, cert_expires_at: float | None = None) -> AgentSession:
        old = self._sessions.get(node)
        if old is not None:
            old.closed = True
            old.fail_pending(f"agent of node {node!r} reconnected")
        session = AgentSession(node, cert_expires_at=cert_expires_at)
        self._sessions[node] = session
        for arrived in self._arrivals.get(node, ()):
            arrived.set()
        self._changed(node)
        return session

    def attached_at(self, node: str) -> float | None:
        """When the node's current agent registered (Unix s); None when none is."""
        session = self._sessions.get(node)
        return session.attached_at if session is not None else None

    def detach(self, session: AgentSession) -> bool:
        """Forget ``session``; True when it was the node's current one."""
        session.closed = True
        session.fail_pending(f"agent of node {session.node!r} disconnected")
        if self._sessions.get(session.node) is session:
            del self._sessions[session.node]
            self._changed(session.node)
            return True
        return False

    def drop(self, node: str) -> None:
        """End the node's agent session (its stream closes at its next message)."""
        session = self._sessions.get(node)
        if session is not None:
            self.detach(session)

    def session(self, node: str) -> AgentSession | None:
        """The node's connected agent's session (None: none is connected)."""
        return self._sessions.get(node)

    def is_connected(self, node: str) -> bool:
        return node in self._sessions

    def cert_expires_at(self, node: str) -> float | None:
        """When the client certificate of the node's connected agent expires."""
        session = self._sessions.get(node)
        return session.cert_expires_at if session is not None else None

    def connected(self) -> frozenset[str]:
        return frozenset(self._sessions)

    def without_agent(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` whose agent is not connected, in their order
        (no copy of the connected set: cheap at fleet size)."""
        sessions = self._sessions
        return [name for name in names if name not in sessions]

    def count(self) -> int:
        """How many agents are connected (O(1), unlike ``connected``)."""
        return len(self._sessions)

    def pace(self, seconds: float) -> int:
        """Ask every connected agent to report every ``seconds``; returns how many.

        A session whose transport can tell it at once (``tell_pace``), with
        nothing in its queue that would then come after (an older pace), is
        told so: a change of pace asks every agent of the fleet, and through
        the queue each one wakes its stream (25,000 at fleet size: seconds of
        the event loop for one change)."""
        asked = ReportInterval(seconds)
        for session in self._sessions.values():
            tell = session.tell_pace
            if tell is None or not session.queue.empty() or not tell(seconds):
                session.queue.put_nowait(asked)
        return len(self._sessions)

    async def call(self, node: str, command: AgentCommand, timeout: float) -> CommandOutcome:
        """Send ``command`` to the node's agent and wait for its outcome.

        Raises:
            Unavailable: no agent is connected, it went away, or it did not
                answer within ``timeout`` seconds.
        """
        session = self._sessions.get(node)
        if session is None:
            raise Unavailable(f"no agent connected for node {node!r}")
        command_id = f"c{next(self._ids)}"
        future: asyncio.Future[CommandOutcome] = asyncio.get_running_loop().create_future()
        session.pending[command_id] = future
        await session.queue.put((command_id, command))
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError as e:
            raise Unavailable(
                f"agent of node {node!r} did not answer {command.kind} within {timeout:.0f}s"
            ) from e
        finally:
            session.pending.pop(command_id, None)

    def resolve(self, session: AgentSession, command_id: str, outcome: CommandOutcome) -> None:
        future = session.pending.pop(command_id, None)
        if future is None or future.done():
            log.debug("node %s: late result for command %s", session.node, command_id)
            return
        future.set_result(outcome)
