"""A simulated GPU fleet: BMCs on the sushy-tools emulator, agents on fake NVML.

Each simulated node has a Redfish system in one emulator process and a
``kiln-agent`` (in this process) whose GPUs are an NVML fake of the node's
part. The node "runs" only while its BMC says it is powered on: a watcher
starts the agent when power comes on (after a simulated reboot of the fake,
which forgets clocks and MIG settings as a real reboot does) and stops it when
power goes off, so the controller sees exactly what it would see on metal.
A reboot that keeps the power on (a power cycle, a restart: the emulator's
``Oem.KilnSim.BootCount`` grows, ``controller.sim.boot_override``) restarts
the agent as well, as a node booting a new image would.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controller.sim.redfish_emulator import RedfishEmulator, SimSystem

if TYPE_CHECKING:  # annotations only; agents are imported where they start
    from agent.client import Agent

log = logging.getLogger(__name__)

SIM_USERNAME = "kiln"
SIM_PASSWORD = "sim-secret-not-for-production"
FLEET_NS = uuid.UUID("6f1d2f5e-8c47-4a52-9b1e-2d8f0c7a9e11")


# Rack members with a BMC and no agent (Kiln powers them, never allocates them).
MEMBER_KINDS = ("switch_tray", "power_shelf")


@dataclass(frozen=True)
class SimNodeSpec:
    name: str
    kind: str  # h100 | h200 | gb200, or a member kind (MEMBER_KINDS)
    rack: str
    leaf: str
    spine: str = "spine-1"
    cluster_uuid: str | None = None
    clique_id: int = 0
    bios_version: str = ""  # the BMC's BiosVersion ("": the emulator's default)

    @property
    def member(self) -> bool:
        """A switch tray or power shelf: a BMC, no GPUs, no agent."""
        return self.kind in MEMBER_KINDS

    @property
    def system_uuid(self) -> str:
        return str(uuid.uuid5(FLEET_NS, self.name))


def default_fleet(nvl72_racks: int = 2, hgx_nodes: int = 4, trays: int = 18) -> list[SimNodeSpec]:
    """GB200 NVL72 racks (18 compute trays × 4 GPUs, one NVLink domain each)
    plus a rack of HGX H200 boxes (8 GPUs, each its own NVLink domain)."""
    specs: list[SimNodeSpec] = []
    for r in range(1, nvl72_racks + 1):
        cluster = str(uuid.uuid5(FLEET_NS, f"nvl72-{r}"))
        for t in range(1, trays + 1):
            specs.append(
                SimNodeSpec(
                    name=f"gb200-r{r:02d}-t{t:02d}",
                    kind="gb200",
                    rack=f"r{r:02d}",
                    leaf=f"leaf-{r}",
                    cluster_uuid=cluster,
                    clique_id=1,
                )
            )
    hgx_rack = nvl72_racks + 1
    for n in range(1, hgx_nodes + 1):
        specs.append(
            SimNodeSpec(
                name=f"h200-n{n:02d}", kind="h200", rack=f"r{hgx_rack:02d}", leaf=f"leaf-{hgx_rack}"
            )
        )
    return specs


def nvl72_rack(
    rack: int = 1,
    *,
    trays: int = 18,
    switch_trays: int = 9,
    power_shelves: int = 8,
    odd_clique: Sequence[int] = (),
    bios: dict[int, str] | None = None,
) -> list[SimNodeSpec]:
    """One GB200 NVL72 rack with its members: ``trays`` compute trays (4 GPUs
    each, one NVLink domain), ``switch_trays`` NVLink switch trays and
    ``power_shelves`` power shelves. Trays numbered in ``odd_clique`` join
    fabric clique 2 instead of the rack's 1 (a miscabled tray); ``bios`` gives
    a tray's BiosVersion by number (needs ``bmc_backend="libvirt-test"``)."""
    cluster = str(uuid.uuid5(FLEET_NS, f"nvl72-{rack}"))
    leaf = f"leaf-{rack}"
    name = f"r{rack:02d}"
    specs = [
        SimNodeSpec(
            name=f"gb200-r{rack:02d}-t{t:02d}",
            kind="gb200",
            rack=name,
            leaf=leaf,
            cluster_uuid=cluster,
            clique_id=2 if t in odd_clique else 1,
            bios_version=(bios or {}).get(t, ""),
        )
        for t in range(1, trays + 1)
    ]
    specs += [
        SimNodeSpec(name=f"nvsw-r{rack:02d}-s{s:02d}", kind="switch_tray", rack=name, leaf=leaf)
        for s in range(1, switch_trays + 1)
    ]
    specs += [
        SimNodeSpec(name=f"psu-r{rack:02d}-p{p:02d}", kind="power_shelf", rack=name, leaf=leaf)
        for p in range(1, power_shelves + 1)
    ]
    return specs


@dataclass
class SimNode:
    spec: SimNodeSpec
    nvml: Any
    agent: Agent | None = None
    task: asyncio.Task[None] | None = None
    powered: bool = False
    boots: int = 0
    bmc_boots: int = 0  # the emulator's BootCount when the agent last started
    history: list[str] = field(default_factory=list)


class SimFleet:
    def __init__(
        self,
        specs: Sequence[SimNodeSpec],
        *,
        power_delay: bool = False,
        watch_interval: float = 1.0,
        bmc_backend: str = "fake",
    ) -> None:
        """``bmc_backend="libvirt-test"`` serves BIOS and firmware update too (it
        needs libvirt-python); the default fake driver serves power, boot,
        virtual media and sensors."""
        # Simulated GPUs are the agent's NVML fake; a local import keeps controller free of agent.
        from agent.nvml import open_backend

        self.specs = list(specs)
        self.emulator = RedfishEmulator(
            [
                SimSystem(
                    name=s.name, uuid=s.system_uuid, power_state="Off", bios_version=s.bios_version
                )
                for s in specs
            ],
            power_delay=power_delay,
            username=SIM_USERNAME,
            password=SIM_PASSWORD,
            backend=bmc_backend,
        )
        self.nodes = {
            s.name: SimNode(
                spec=s,
                nvml=None
                if s.member
                else open_backend(
                    f"fake:{s.kind}",
                    node_name=s.name,
                    cluster_uuid=s.cluster_uuid,
                    clique_id=s.clique_id,
                ),
            )
            for s in specs
        }
        self._watch_interval = watch_interval
        self._watcher: asyncio.Task[None] | None = None
        self._controller = ""

    async def start(self, controller: str) -> None:
        """Start the BMC emulator and the power watcher that runs agents."""
        self._controller = controller
        await self.emulator.start()
        self._watcher = asyncio.create_task(self._watch(), name="sim-power-watch")

    async def pause_power_following(self) -> None:
        """Stop following the emulator's power: a power change made now reaches
        no simulated OS until :meth:`resume_power_following` (a boot that hangs)."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None

    def resume_power_following(self) -> None:
        """Follow the emulator's power again; changes made meanwhile land now."""
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="sim-power-watch")

    def bmc_url(self, name: str) -> str:
        return self.emulator.system_url(name)

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await asyncio.gather(*(self._power_off(n) for n in self.nodes.values()))
        await self.emulator.stop()

    # -- power following -------------------------------------------------------

    def read_power(self) -> dict[str, str]:
        """Each node's PowerState as its (emulated) BMC reports it. Blocking."""
        return {name: power for name, (power, _) in self.read_systems().items()}

    def read_systems(self) -> dict[str, tuple[str, int]]:
        """Each node's (PowerState, BootCount) as its emulated BMC reports
        them. Blocking."""
        token = base64.b64encode(f"{SIM_USERNAME}:{SIM_PASSWORD}".encode()).decode()
        states = {}
        for node in self.nodes.values():
            url = f"{self.emulator.base_url}/redfish/v1/Systems/{node.spec.system_uuid}"
            req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:  # loopback only
                    doc = json.load(resp)
            except OSError:
                continue
            boots = (doc.get("Oem") or {}).get("KilnSim", {}).get("BootCount", 0)
            states[node.spec.name] = (doc.get("PowerState", "Unknown"), int(boots))
        return states

    async def _watch(self) -> None:
        while True:
            states = await asyncio.to_thread(self.read_systems)
            for name, (power, boots) in states.items():
                node = self.nodes[name]
                if power == "On" and not node.powered:
                    await self._power_on(node, boots)
                elif power == "On" and boots > node.bmc_boots:
                    # Rebooted without the power staying off long enough to be
                    # seen (a power cycle): the old agent dies, the new OS's starts.
                    node.history.append("reboot")
                    await self._power_off(node)
                    await self._power_on(node, boots)
                elif power == "Off" and node.powered:
                    await self._power_off(node)
            await asyncio.sleep(self._watch_interval)

    async def _power_on(self, node: SimNode, bmc_boots: int = 0) -> None:
        node.powered = True
        # A power cycle's boot can be seen twice: counted while the power still
        # read On (the reboot branch of ``_watch``), then the delayed dip and
        # return. The emulator's BootCount says whether this is a new boot.
        same_boot = 0 < bmc_boots <= node.bmc_boots
        node.bmc_boots = max(node.bmc_boots, bmc_boots)
        if not same_boot:
            node.boots += 1
        node.history.append("on")
        if node.spec.member:  # a switch tray or power shelf runs no agent
            log.info("sim member %s: powered on", node.spec.name)
            return
        if node.boots > 1:
            await asyncio.to_thread(node.nvml.reboot)
        # The simulated fleet runs agents in-process; a local import keeps controller free of agent.
        from agent.client import Agent

        node.agent = Agent(
            self._controller,
            node.spec.name,
            node.nvml,
            backend=f"fake:{node.spec.kind}",
            hostname=node.spec.name,
            backoff=(0.2, 5.0),
        )
        node.task = asyncio.create_task(node.agent.run(), name=f"agent-{node.spec.name}")
        log.info("sim node %s: powered on; agent started", node.spec.name)

    async def _power_off(self, node: SimNode) -> None:
        if not node.powered:
            return
        node.powered = False
        node.history.append("off")
        if node.agent is not None:
            await node.agent.stop()
        if node.task is not None:
            await asyncio.gather(node.task, return_exceptions=True)
        node.agent = None
        node.task = None
        log.info("sim node %s: powered off; agent stopped", node.spec.name)
