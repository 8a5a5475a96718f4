"""An agent's check figures nested thousands deep are no figures, not a crash.

A check's figures come from the node (``CommandOutcome.figures_json``), so
they are data from outside. Nested 100,000 deep, ``json.loads`` would raise
RecursionError (not a ValueError) out of the check run. The runner counts
the nesting first and judges such an answer as one with no figures.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.checks.suite import load_default_suite
from controller.core.checks import CheckRunner
from controller.core.model import AgentCommand, CommandOutcome
from controller.core.records import NodeRecord
from controller.core.states import NodeState

pytestmark = pytest.mark.timeout(30)


class AnsweringAgents:
    """The agent hub's ``call``, answering every command with ``outcome``."""

    def __init__(self, outcome: CommandOutcome) -> None:
        self.outcome = outcome
        self.commands: list[AgentCommand] = []

    async def call(self, node: str, command: AgentCommand, timeout: float) -> CommandOutcome:
        self.commands.append(command)
        return self.outcome


def runner(outcome: CommandOutcome) -> tuple[CheckRunner, AnsweringAgents]:
    agents = AnsweringAgents(outcome)
    none: Any = None  # the store and nodes: one check's run touches neither
    return CheckRunner(none, none, agents, load_default_suite()), agents  # type: ignore[arg-type]


ROW = NodeRecord(
    name="n1", bmc_url="redfish://127.0.0.1:1", gpu_model="H200", state=NodeState.TESTING
)


@pytest.mark.parametrize("depth", [100_000, 17])
async def test_figures_nested_too_deep_are_judged_as_none(depth: int) -> None:
    (bandwidth,) = load_default_suite().level("medium")[1:]
    deep = '{"gpu_gbps":' * depth + "1" + "}" * depth
    check, agents = runner(CommandOutcome(ok=True, figures_json=deep))
    outcome = await check._one(ROW, bandwidth)
    assert agents.commands and agents.commands[0].kind == "run_check"
    assert not outcome.passed  # no figures: the bandwidth floor is not shown
    assert outcome.figures == {}


async def test_ordinary_figures_are_read() -> None:
    (bandwidth,) = load_default_suite().level("medium")[1:]
    rates = {str(i): 450.0 for i in range(8)}
    check, _ = runner(CommandOutcome(ok=True, figures_json=json.dumps({"gpu_gbps": rates})))
    outcome = await check._one(ROW, bandwidth)
    assert outcome.passed, outcome.reason
    assert outcome.figures == {"gpu_gbps": rates}
