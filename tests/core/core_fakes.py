"""Small fakes of the core's own ports, for tests of the core's rules alone.

``FakeBmc`` is a BMC gateway whose machines power on and off at once and
can be told to be unreachable or to fail reading firmware; ``answering``
plays a node's agent on its ``AgentHub`` session. The real BMC drivers and agents are
tested against real peers elsewhere (tests/bmc, tests/e2e).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from controller.core.agents import AgentHub, AgentSession
from controller.core.errors import BmcUnreachable, InvalidArgument
from controller.core.model import (
    AgentCommand,
    BmcTarget,
    CommandOutcome,
    LeakReading,
    ReportInterval,
)

SCHEME = "fake://"


@dataclass
class FakeBmc:
    power: dict[str, str] = field(default_factory=dict)  # node → "on" / "off"
    unreachable: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)
    spreads: list[float] = field(default_factory=list)  # each poll_power's spread (s)
    firmware: dict[str, str] = field(default_factory=dict)  # every BMC's inventory
    firmware_errors: dict[str, Exception] = field(default_factory=dict)  # node → raised

    def canonical_url(self, url: str) -> str:
        """Like the real gateway's, one spelling per BMC: case and a trailing
        slash do not make another BMC."""
        if not url.startswith(SCHEME):
            raise InvalidArgument(f"BMC URL {url!r} must start with {SCHEME}")
        return url.lower().rstrip("/")

    def validate_target(self, url: str, username: str, password: str) -> str:
        return self.canonical_url(url)

    def _check(self, target: BmcTarget, op: str) -> None:
        self.calls.append((target.node, op))
        if target.node in self.unreachable:
            raise BmcUnreachable(host=target.url, reason="no route")

    async def power_state(self, target: BmcTarget) -> str:
        self._check(target, "status")
        return self.power.get(target.node, "off")

    async def set_power(self, target: BmcTarget, action: str) -> str:
        self._check(target, action)
        self.power[target.node] = "off" if action in ("off", "force_off") else "on"
        return self.power[target.node]

    def health(self, node: str) -> str:
        return "unreachable" if node in self.unreachable else "ok"

    async def leak_detectors(self, target: BmcTarget) -> list[LeakReading]:
        return []  # no leak detectors on this BMC

    async def thermal_c(self, target: BmcTarget) -> list[float]:
        self._check(target, "thermal")
        return [40.0]

    async def firmware_versions(self, target: BmcTarget) -> dict[str, str]:
        self._check(target, "firmware")
        error = self.firmware_errors.get(target.node)
        if error is not None:
            raise error
        return dict(self.firmware)

    async def firmware_update(self, target: BmcTarget, image_url: str, component: str) -> None:
        return None

    async def bios_attributes(self, target: BmcTarget) -> dict[str, object]:
        return {}

    async def bios_set(self, target: BmcTarget, attributes: dict[str, object]) -> None:
        return None

    async def poll_power(
        self, targets: list[BmcTarget], concurrency: int, *, spread: float = 0.0
    ) -> dict[str, tuple[str | None, str]]:
        self.spreads.append(spread)
        polled: dict[str, tuple[str | None, str]] = {}
        for t in targets:
            try:
                polled[t.node] = (await self.power_state(t), self.health(t.node))
            except BmcUnreachable:
                polled[t.node] = (None, self.health(t.node))
        return polled

    def forget(self, node: str) -> None:
        return None

    async def close(self) -> None:
        return None


Answer = Callable[[AgentCommand], CommandOutcome]


def ok(command: AgentCommand) -> CommandOutcome:
    return CommandOutcome(ok=True, changed=(command.kind,))


@contextlib.asynccontextmanager
async def answering(
    hub: AgentHub, session: AgentSession, answer: Answer = ok
) -> AsyncIterator[list[AgentCommand]]:
    """Answer every command sent to ``session`` with ``answer`` while inside;
    yields the list of commands received."""
    seen: list[AgentCommand] = []

    async def serve() -> None:
        while True:
            item = await session.queue.get()
            if item is None or isinstance(item, ReportInterval):
                continue  # the stream's end, or a pace: no answer is awaited
            command_id, command = item
            seen.append(command)
            hub.resolve(session, command_id, answer(command))

    task = asyncio.create_task(serve())
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
