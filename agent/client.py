"""The node agent: samples its GPUs, dials the controller, reports, obeys.

One ``Agent`` per node and no module-level state, so a simulated fleet runs
many in one process. Monitoring does not depend on the control plane: from
start-up the agent samples every interval and keeps its metrics current
(as dcgm-exporter does), whether or not a controller is reachable or the
node enrolled. While no controller has it registered, the XIDs it sees are
kept (bounded, ``AWAY_XIDS``) and go up with the first report after it
registers again, so none is lost. The stream to the controller is re-dialled
with exponential backoff and jitter whenever it breaks. GPU work (NVML calls)
runs in threads so the event loop never blocks on the driver.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import socket
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

import grpc
import pynvml

from agent.checks import run_check
from agent.gpu_inventory import NodeInventory, read_inventory
from agent.health import HealthSampler, NodeHealth
from agent.metrics import AgentMetrics
from agent.nvml.backend import NvmlBackend
from agent.prepare import ApplyResult, apply_profile, check_drift, reset_to_defaults
from kiln.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from kiln_common.gpu_profile import GpuProfile, ProfileError
from kiln_common.tokens import bearer_metadata

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
DRIFT_CHECK_EVERY = 6  # sampling rounds
AWAY_XIDS = 1024  # (GPU, XID) pairs kept while no controller has the node registered
DEFAULT_SAMPLE_INTERVAL = 5.0  # seconds, until a controller says otherwise
# Commands after which the agent reports at once: a preparation's, which set
# the node's GPUs for its next job and whose health gate waits for a sample
# taken after them. Not ``reset_gpu``: a GPU recovery reads that reset's
# outcome in the order of its own steps, which a report sooner broke.
PREPARING_COMMANDS = frozenset({"apply_profile", "reset_gpus"})
# Answers that retrying soon cannot change (an unknown node, a certificate that
# names another node): wait the longest backoff before dialling again.
_REFUSED = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


def gpu_pb(inventory: NodeInventory) -> list[types_pb2.Gpu]:
    return [
        types_pb2.Gpu(
            index=g.index,
            uuid=g.uuid,
            model=g.name,
            serial=g.serial,
            pci_bus_id=g.pci_bus_id,
            memory_mib=g.memory_total_mib,
            architecture=g.architecture,
            clique=g.clique,
            pci_device_id=g.pci_device_id,
        )
        for g in inventory.gpus
    ]


def health_pb(health: NodeHealth, sampled_at: float) -> types_pb2.NodeHealth:
    msg = types_pb2.NodeHealth(sampled_at=sampled_at, source="agent")
    for gpu in health.gpus:
        fields: dict[str, Any] = {k: v for k, v in asdict(gpu).items() if v is not None}
        msg.gpus.append(types_pb2.GpuHealth(**fields))
    return msg


def reset_with_nvidia_smi(index: int, timeout: float = 120.0) -> None:
    """``nvidia-smi --gpu-reset -i N``; RuntimeError with its words when it fails."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        raise RuntimeError("nvidia-smi is not installed, and NVML has no reset call")
    done = subprocess.run(
        [tool, "--gpu-reset", "-i", str(index)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        words = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(words[-1] if words else f"nvidia-smi exited {done.returncode}")


def _figures_json(figures: dict[str, Any], limit: int = 16384) -> str:
    """A check's figures as JSON, within what the controller accepts."""
    text = json.dumps(figures)
    if len(text) > limit:
        return json.dumps({"truncated": f"{len(text)} characters of figures"})
    return text


def result_pb(command_id: str, result: ApplyResult) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        result=agent_pb2.CommandResult(
            id=command_id, ok=result.ok, changed=result.changed, failures=result.failures
        )
    )


class Agent:
    def __init__(
        self,
        controller: str,
        node_name: str,
        nvml: NvmlBackend,
        *,
        backend: str = "real",
        hostname: str | None = None,
        metrics: AgentMetrics | None = None,
        backoff: tuple[float, float] = (0.5, 30.0),
        channel_credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        sample_interval: float = DEFAULT_SAMPLE_INTERVAL,
    ) -> None:
        """``channel_credentials``: dial over TLS with these (``kiln_common.tls``);
        None dials plaintext. Each agent carries its own, so a simulated fleet
        can give every node its own certificate. ``token``: the node's agent
        token (``IssueAgentToken``), sent as bearer metadata on its stream."""
        # "HOST:PORT" or several, comma-separated (an active controller and its
        # standbys): a broken stream moves on to the next one.
        self.controllers = [c.strip() for c in controller.split(",") if c.strip()]
        if not self.controllers:
            raise ValueError("no controller address given")
        self._current = 0
        self.node_name = node_name
        self.nvml = nvml
        self.backend = backend
        self.hostname = hostname or socket.gethostname()
        self.metrics = metrics
        self._backoff = backoff
        self._credentials = channel_credentials
        self._metadata = bearer_metadata(token)
        self._sampler = HealthSampler(nvml)
        # A simulated GPU can be reset (to activate a pending MIG mode); NVML
        # itself has no reset call, so on real GPUs a pending mode is reported.
        self._reset_gpu = getattr(nvml, "gpu_reset", None)
        self._profile: GpuProfile | None = None
        self._gpu_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self.registered = asyncio.Event()
        self.connections = 0
        # Monitoring, from start-up (``_monitor``): the interval the controller
        # asked for while registered, else the agent's own.
        self.sample_interval = sample_interval
        self._asked_interval: float | None = None
        self._outbox: asyncio.Queue[agent_pb2.AgentMessage | None] | None = None
        self._away_xids: deque[tuple[int, int]] = deque(maxlen=AWAY_XIDS)
        self.xids_dropped = 0  # seen while away beyond AWAY_XIDS (oldest first)
        self.last_health: NodeHealth | None = None
        self.samples = 0
        self._wake = asyncio.Event()  # sample now (just registered)

    @property
    def report_interval(self) -> float:
        """Seconds between reports now: the controller's ask while registered
        (``Registered``, then ``Pace``), else the agent's own interval."""
        return self._asked_interval or self.sample_interval

    @property
    def applied_profile(self) -> str:
        return self._profile.name if self._profile else ""

    @property
    def controller(self) -> str:
        """The controller this agent dials now."""
        return self.controllers[self._current]

    async def run(self) -> None:
        """Monitor, and stay connected, until ``stop()``; re-dial with backoff."""
        await asyncio.to_thread(self.nvml.nvmlInit)
        monitor = asyncio.create_task(self._monitor(), name=f"kiln-monitor-{self.node_name}")
        delay = self._backoff[0]
        try:
            while not self._stopping.is_set():
                try:
                    await self._session()
                    delay = self._backoff[0]
                except grpc.aio.AioRpcError as e:
                    log.info(
                        "node %s: controller stream ended: %s %s",
                        self.node_name,
                        e.code().name,
                        e.details(),
                    )
                    if e.code() in _REFUSED:
                        delay = self._backoff[1]
                except (OSError, ConnectionError) as e:
                    log.info("node %s: cannot reach controller: %s", self.node_name, e)
                self.registered.clear()
                if self._stopping.is_set():
                    break
                self._current = (self._current + 1) % len(self.controllers)
                jittered = delay * random.uniform(0.5, 1.0)
                try:
                    async with asyncio.timeout(jittered):
                        await self._stopping.wait()
                except TimeoutError:
                    pass
                delay = min(delay * 2, self._backoff[1])
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            await asyncio.to_thread(self._shutdown_nvml)

    def _shutdown_nvml(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down; nothing useful to do
            log.debug("node %s: nvmlShutdown failed", self.node_name)

    async def stop(self) -> None:
        self._stopping.set()

    async def _session(self) -> None:
        inventory = await asyncio.to_thread(read_inventory, self.nvml)
        if self.metrics is not None:
            self.metrics.update_inventory(inventory)
        outbox: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
        await outbox.put(
            agent_pb2.AgentMessage(
                register=agent_pb2.Register(
                    node_name=self.node_name,
                    hostname=self.hostname,
                    agent_version=AGENT_VERSION,
                    driver_version=inventory.driver_version,
                    nvml_backend=self.backend,
                    gpus=gpu_pb(inventory),
                    applied_profile=self.applied_profile,
                )
            )
        )

        async def outgoing() -> AsyncIterator[agent_pb2.AgentMessage]:
            while True:
                msg = await outbox.get()
                if msg is None:
                    return
                yield msg

        async with self._channel() as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            call = stub.Connect(outgoing(), metadata=self._metadata or None)
            tasks: set[asyncio.Task[None]] = set()
            stopper = asyncio.create_task(self._stopping.wait())
            try:
                reader = aiter(call)
                while True:
                    nxt = asyncio.ensure_future(anext(reader))
                    done, _ = await asyncio.wait(
                        {nxt, stopper}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if nxt not in done:
                        nxt.cancel()
                        call.cancel()
                        return
                    try:
                        msg = nxt.result()
                    except StopAsyncIteration:
                        return
                    body = msg.WhichOneof("body")
                    if body == "registered":
                        self.connections += 1
                        self.registered.set()
                        log.info(
                            "node %s: registered with controller %s",
                            self.node_name,
                            self.controller,
                        )
                        self._asked_interval = msg.registered.sample_interval_s or None
                        self._outbox = outbox  # the monitor reports here now
                        self._wake.set()  # at once, with the XIDs seen while away
                    elif body == "pace":  # the controller is behind, or keeps up again
                        self._asked_interval = msg.pace.sample_interval_s or None
                        log.info(
                            "node %s: the controller asks for a report every %gs",
                            self.node_name,
                            self.report_interval,
                        )
                    elif body == "command":
                        task = asyncio.create_task(self._execute(msg.command, outbox))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
            finally:
                if self._outbox is outbox:
                    self._outbox = None  # away: the monitor keeps XIDs from here on
                    self._asked_interval = None
                stopper.cancel()
                for t in tasks:
                    t.cancel()
                await outbox.put(None)

    def _channel(self) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.controller)
        return grpc.aio.secure_channel(self.controller, self._credentials)

    async def _monitor(self) -> None:
        """Sample every interval from start-up: metrics always, reports while registered."""
        inventory = None
        rounds = 0
        drift: list[str] = []
        while True:
            try:
                if inventory is None:
                    inventory = await asyncio.to_thread(read_inventory, self.nvml)
                    if self.metrics is not None:
                        self.metrics.update_inventory(inventory)
                health = await self._sample()
            except Exception as e:  # a driver hiccup: try again next round
                log.warning("node %s: sampling failed: %s", self.node_name, e)
            else:
                self.last_health = health
                self.samples += 1
                if self.metrics is not None:
                    self.metrics.update_health(health)
                outbox = self._outbox
                if outbox is None:
                    self._keep_away(health)
                else:
                    report = health_pb(health, time.time())
                    self._attach_away(report)
                    report.drift.extend(drift)  # what the last check found and repaired
                    await outbox.put(agent_pb2.AgentMessage(health=report))
                    rounds += 1
                    drift = []
                    if self._profile is not None and rounds % DRIFT_CHECK_EVERY == 0:
                        drift = await self._repair_drift()
            interval = self.report_interval
            self._wake.clear()
            try:
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _keep_away(self, health: NodeHealth) -> None:
        for gpu in health.gpus:
            for xid in gpu.xids:
                if len(self._away_xids) == self._away_xids.maxlen:
                    self.xids_dropped += 1
                self._away_xids.append((gpu.index, xid))

    def _attach_away(self, report: types_pb2.NodeHealth) -> None:
        """Put the XIDs seen while away into this report's GPUs (oldest first)."""
        if not self._away_xids:
            return
        by_index = {g.index: g for g in report.gpus}
        earlier: dict[int, list[int]] = {}
        kept = []
        for index, xid in self._away_xids:
            if index in by_index:
                earlier.setdefault(index, []).append(xid)
            else:
                kept.append((index, xid))  # a GPU this sample lacks: next time
        for index, xids in earlier.items():
            gpu = by_index[index]
            now = list(gpu.xids)
            del gpu.xids[:]
            gpu.xids.extend(xids + now)  # the ones seen while away came first
        if self.xids_dropped:
            log.warning(
                "node %s: %d XIDs seen while away were dropped (more than %d)",
                self.node_name,
                self.xids_dropped,
                AWAY_XIDS,
            )
            self.xids_dropped = 0
        self._away_xids = deque(kept, maxlen=AWAY_XIDS)

    async def _sample(self) -> NodeHealth:
        """One health sample; after a driver reload NVML must be initialised
        again (the old session is gone), so do that and sample once more."""
        try:
            return await self._sampler.asample()
        except pynvml.NVMLError_Uninitialized:
            log.warning(
                "node %s: NVML session gone (driver reloaded?); initialising again", self.node_name
            )
            await asyncio.to_thread(self.nvml.nvmlInit)
            return await self._sampler.asample()

    async def _repair_drift(self) -> list[str]:
        """Re-apply the held profile when the GPUs no longer match it (a driver
        reload or a reboot forgets clocks, power limits and persistence).
        Returns what had drifted, for the next report to the controller."""
        async with self._gpu_lock:
            profile = self._profile
            if profile is None:
                return []
            drift = await asyncio.to_thread(check_drift, self.nvml, profile)
            if drift:
                log.warning(
                    "node %s: GPU settings drifted (%s); re-applying %s",
                    self.node_name,
                    "; ".join(drift),
                    profile.name,
                )
                await asyncio.to_thread(
                    apply_profile, self.nvml, profile, reset_gpu=self._reset_gpu
                )
            return list(drift)

    async def _execute(
        self, command: agent_pb2.Command, outbox: asyncio.Queue[agent_pb2.AgentMessage | None]
    ) -> None:
        kind = command.WhichOneof("kind")
        if kind == "run_check":
            await outbox.put(await self._check(command))
            return
        try:
            async with self._gpu_lock:  # one change to the GPUs at a time
                result = await self._run_command(command, kind)
        except Exception as e:  # report, never crash the stream
            log.exception("node %s: command %s failed", self.node_name, kind)
            result = ApplyResult(ok=False, changed=[], failures=[f"{type(e).__name__}: {e}"])
        await outbox.put(result_pb(command.id, result))
        if kind in PREPARING_COMMANDS:
            # The GPUs as they are now, at once: the controller's health gate
            # waits for a sample taken after its command, otherwise the next
            # one due (a whole interval away).
            self._wake.set()

    async def _run_command(self, command: agent_pb2.Command, kind: str | None) -> ApplyResult:
        if kind == "apply_profile":
            return await self._apply(command.apply_profile.profile_yaml)
        if kind == "reset_gpus":
            # The controller gave the profile up, whether or not the reset
            # succeeds: drift repair must not bring it back.
            self._profile = None
            return await asyncio.to_thread(reset_to_defaults, self.nvml, reset_gpu=self._reset_gpu)
        if kind == "inject_fault":
            return await self._inject(command.inject_fault.fault_json)
        if kind == "reset_gpu":
            return await asyncio.to_thread(self._reset_gpus, list(command.reset_gpu.indices))
        return ApplyResult(ok=False, changed=[], failures=[f"unknown command {kind}"])

    async def _apply(self, profile_yaml: str) -> ApplyResult:
        try:
            profile = GpuProfile.from_yaml(profile_yaml)
        except ProfileError as e:
            return ApplyResult(ok=False, changed=[], failures=[f"bad profile: {e}"])
        result = await asyncio.to_thread(
            apply_profile, self.nvml, profile, reset_gpu=self._reset_gpu
        )
        # A profile that was not reached is not held (nor is the one before it),
        # so drift repair never re-applies settings the controller did not accept.
        self._profile = profile if result.ok else None
        return result

    async def _check(self, command: agent_pb2.Command) -> agent_pb2.AgentMessage:
        """Run one check of the suite (the GPUs held for it: no profile change meanwhile)."""
        try:
            spec = json.loads(command.run_check.check_json)
            if not isinstance(spec, dict):
                raise ValueError("a check is a JSON object")
        except ValueError as e:
            bad = ApplyResult(ok=False, changed=[], failures=[f"bad check: {e}"])
            return result_pb(command.id, bad)
        async with self._gpu_lock:
            gpus = len(self.last_health.gpus) if self.last_health is not None else 0
            result = await run_check(spec, self.nvml, gpus=gpus)
        log.info(
            "node %s: check %s %s in %.1fs",
            self.node_name,
            spec.get("name", "?"),
            "passed" if result.ok else "failed",
            result.duration_s,
        )
        return agent_pb2.AgentMessage(
            result=agent_pb2.CommandResult(
                id=command.id,
                ok=result.ok,
                failures=result.failures[:64],
                figures_json=_figures_json(result.figures),
                duration_s=result.duration_s,
            )
        )

    def _reset_gpus(self, indices: list[int]) -> ApplyResult:
        """Reset each GPU (what its recovery action asks for): the simulated
        GPU's own reset, else ``nvidia-smi --gpu-reset`` (NVML has no reset
        call). A GPU still in use is not reset and is named."""
        if not indices:
            return ApplyResult(ok=False, changed=[], failures=["no GPU named to reset"])
        changed: list[str] = []
        failures: list[str] = []
        for index in indices:
            try:
                if self._reset_gpu is not None:
                    self._reset_gpu(index)
                else:
                    reset_with_nvidia_smi(index)
            except pynvml.NVMLError as e:
                name = type(e).__name__.removeprefix("NVMLError_")
                failures.append(f"GPU {index}: reset failed: {name}: {e}")
            except (OSError, RuntimeError) as e:
                failures.append(f"GPU {index}: reset failed: {e}")
            else:
                changed.append(f"GPU {index}: reset")
        return ApplyResult(ok=not failures, changed=changed, failures=failures)

    async def _inject(self, fault_json: str) -> ApplyResult:
        faults = getattr(self.nvml, "faults", None)
        if faults is None:
            return ApplyResult(
                ok=False, changed=[], failures=["faults can only be injected into a simulated GPU"]
            )
        try:
            spec = json.loads(fault_json)
            message = await asyncio.to_thread(faults.apply_fault, spec)
        except (ValueError, KeyError, TypeError) as e:
            return ApplyResult(ok=False, changed=[], failures=[f"bad fault: {e}"])
        return ApplyResult(ok=True, changed=[str(message or spec.get("kind"))], failures=[])
