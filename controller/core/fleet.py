"""The domain core's front door: what the API layer calls.

Fleet wires inventory, allocations, the lifecycle reconciler, the agent hub
and the event log together. It knows nothing of gRPC or of BMC libraries.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from cryptography.fernet import Fernet

from controller.core.agents import AgentHub, AgentSession
from controller.core.allocations import Allocations
from controller.core.errors import InvalidArgument
from controller.core.eventlog import EventLog
from controller.core.health_policy import PolicyRunner
from controller.core.lifecycle import Lifecycle
from controller.core.model import AgentCommand, CommandOutcome, GpuInfo, NodeInfo
from controller.core.nodes import Nodes
from controller.core.ports import BmcGateway
from controller.core.power_sync import PowerSync
from controller.core.preparation import Preparer, PrepLimits
from controller.core.profiles import ProfileCatalog
from controller.core.tasks import BackgroundTasks
from controller.placement import QueueConfig
from controller.policies import PolicyEngine, RuleSet, load_default_rules
from controller.store.database import Database
from controller.store.secrets import SecretBox

log = logging.getLogger(__name__)


class Fleet:
    def __init__(
        self,
        db: Database,
        bmc: BmcGateway,
        *,
        profiles: ProfileCatalog | None = None,
        queues: Sequence[QueueConfig] = (),
        reconcile_interval: float = 1.0,
        sample_interval: float = 5.0,
        rules: RuleSet | None = None,
        power_sync_interval: float = 60.0,
        secrets: SecretBox | None = None,
        prep_limits: PrepLimits | None = None,
        agent_silent_after: float = 15.0,
        bmc_thermal_interval: float = 10.0,
    ) -> None:
        self.db = db
        self.bmc = bmc
        self.profiles = profiles or ProfileCatalog()
        self.agents = AgentHub()
        self.events = EventLog(db)
        self.nodes = Nodes(db, bmc, self.agents, secrets or SecretBox(Fernet.generate_key()))
        self.allocations = Allocations(db, self.nodes, queues=queues)
        self.lifecycle = Lifecycle(
            db,
            self.nodes,
            self.agents,
            bmc,
            self.profiles,
            self.allocations.schedule_pass,
            self.allocations.node_failed,
            interval=reconcile_interval,
            preparer=Preparer(bmc, prep_limits),
        )
        self.policies = PolicyRunner(
            db,
            self.nodes,
            self.agents,
            bmc,
            PolicyEngine(rules or load_default_rules()),
            self.allocations.node_failed,
            silent_after=agent_silent_after,
            bmc_sample_interval=bmc_thermal_interval,
        )
        self.power_sync = PowerSync(db, self.nodes, bmc, interval=power_sync_interval)
        self.sample_interval = sample_interval
        self._loops = BackgroundTasks()
        self._background = BackgroundTasks()

    async def start(self) -> None:
        self._loops.spawn(self.lifecycle.run(), name="kiln-lifecycle")
        self._loops.spawn(self.policies.run(), name="kiln-policies")
        self._loops.spawn(self.power_sync.run(), name="kiln-power-sync")

    async def stop(self) -> None:
        await self._loops.stop()
        await self._background.stop()
        await self.lifecycle.stop()
        await self.policies.stop()

    # -- agents ----------------------------------------------------------------

    async def agent_connected(
        self, node: str, gpus: Sequence[GpuInfo], applied_profile: str
    ) -> AgentSession:
        """Register a node's agent. Raises NotFound for a node never enrolled."""
        await self.nodes.get(node)
        session = self.agents.attach(node)
        try:
            await self.nodes.agent_registered(node, gpus, applied_profile)
        except BaseException:
            self.agents.detach(session)
            raise
        log.info("node %s: agent registered with %d GPUs", node, len(gpus))
        self.lifecycle.wake()
        self._spawn(self.allocations.schedule_pass())  # the node may be schedulable again
        return session

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    async def agent_disconnected(self, session: AgentSession) -> None:
        if self.agents.detach(session):
            log.info("node %s: agent disconnected", session.node)
            await self.nodes.agent_gone(session.node)

    async def agent_health(self, node: str, health: dict[str, Any]) -> None:
        rack = await self.nodes.agent_health(node, health)
        if rack is not None:
            await self.policies.observe(node, rack, health)

    async def undrain(self, node: str) -> NodeInfo:
        """Return a node to service; its health episodes start afresh."""
        info = await self.nodes.undrain(node)
        self.policies.forget(node)
        self.lifecycle.wake()
        return info

    async def inject_fault(self, node: str, fault_json: str) -> CommandOutcome:
        """Forward a fault to a simulated node's fake NVML (simulated fleets only)."""
        try:
            fault = json.loads(fault_json)
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"fault is not valid JSON: {e.msg}") from e
        if not isinstance(fault, dict) or "kind" not in fault:
            raise InvalidArgument('a fault is a JSON object with a "kind"')
        await self.nodes.get(node)
        return await self.agents.call(node, AgentCommand("inject_fault", fault_json), 30.0)
