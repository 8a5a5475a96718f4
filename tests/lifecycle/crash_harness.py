"""Kill a real controller at chosen moments and check what survives.

:class:`CrashHarness` runs ``kiln-controller`` as a child process
(:mod:`crash_process`) over a SQLite state directory, and a SimFleet in the
test's own event loop (the sushy-tools emulator as every node's BMC, agents on
the NVML fake that re-dial the same address with backoff). ``crash_once``
lets a :class:`~crash_driver.Driver` issue random operations, SIGKILLs the
controller at a moment picked by the kill mode, restarts it, re-sends what
the crash left unanswered, waits for the fleet to settle and checks every
invariant. Violations raise AssertionError with the controller's log tail.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from crash_driver import MAX_DRAINED, PROFILE_YAML, SPECS, Driver, Ledger
from crash_process import ControllerProcess
from crash_store import StoredEvent, StoreSnapshot, read_store, store_violations

from controller.cli.pages import every_page_async
from controller.sim.fleet import SIM_PASSWORD, SIM_USERNAME, SimFleet, SimNodeSpec
from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

KILL_MODES = ("create_ack", "preparing", "releasing", "release_ack", "random")
UNSETTLED = frozenset({"enrolled", "inspecting", "preparing", "releasing", "testing"})
OUT = frozenset({"maintenance", "draining", "quarantined", "powered_off"})
ADMITTED = frozenset({"preparing", "ready", "released"})  # never back to pending


def node_state(node: fleet_pb2.Node) -> str:
    return types_pb2.NodeState.Name(node.state).removeprefix("NODE_STATE_").lower()


def _at_rest(node: fleet_pb2.Node) -> tuple[str, int, str, bool]:
    return (node.name, node.state, node.allocation, node.schedulable)


def alloc_state(alloc: fleet_pb2.Allocation) -> str:
    return fleet_pb2.AllocationState.Name(alloc.state).removeprefix("ALLOCATION_STATE_").lower()


def head_fits(
    pending: fleet_pb2.Allocation, nodes: list[fleet_pb2.Node], racks: dict[str, int]
) -> bool:
    """Whether the head of the queue would fit the free nodes (specs used here only)."""
    free = [n for n in nodes if n.schedulable]
    spec = pending.spec
    if spec.racks:
        whole = [r for r, size in racks.items() if sum(n.rack == r for n in free) == size]
        return len(whole) >= spec.racks
    fitting = [n for n in free if not spec.gpu_model or n.gpu_model == spec.gpu_model]
    return len(fitting) >= spec.nodes


def unsettled(
    nodes: list[fleet_pb2.Node],
    allocs: list[fleet_pb2.Allocation],
    drain: dict[str, bool],
    racks: dict[str, int],
) -> list[str]:
    """(a) Why the fleet has not settled yet; empty once it has."""
    why: list[str] = []
    by_name = {n.name: n for n in nodes}
    for n in nodes:
        state = node_state(n)
        if state in UNSETTLED or (state == "draining" and not n.allocation):
            why.append(f"{n.name} {state} ({n.state_reason})")
        elif state in ("ready", "allocated") and not n.agent_connected:
            why.append(f"{n.name} {state} without its agent")
        wanted = drain.get(n.name, False)
        if wanted and state not in OUT:
            why.append(f"{n.name} was drained but is {state}")
        if not wanted and state in OUT:
            why.append(f"{n.name} was undrained but is {state} ({n.state_reason})")
    for a in allocs:
        if alloc_state(a) == "preparing" and not any(
            node_state(by_name[m]) == "draining" for m in [*a.nodes, *a.spares] if m in by_name
        ):
            why.append(f"allocation {a.id} still preparing ({a.reason})")
    pending = [a for a in allocs if alloc_state(a) == "pending"]
    if pending and head_fits(pending[0], nodes, racks):
        why.append(f"allocation {pending[0].id} pending although it fits ({pending[0].reason})")
    # A free ready node held back from new work (its BMC not yet read again
    # after a restart, docs/placement.md) may still take a pending request:
    # every BMC here is healthy, so wait for that before calling it settled.
    held = [
        n.name
        for n in nodes
        if node_state(n) == "ready" and n.agent_connected and not n.allocation
        if not n.schedulable
    ]
    if pending and held:
        why.append(f"allocation {pending[0].id} pending while {held} are held back")
    return why


@dataclass
class KillRecord:
    mode: str
    hit: bool  # the moment the mode aimed at was reached before the kill
    seen: str = ""


@dataclass
class CrashHarness:
    tmp: Path
    specs: list[SimNodeSpec]
    rng: random.Random
    settle_timeout: float = 45.0
    ledger: Ledger = field(default_factory=Ledger)
    kills: list[KillRecord] = field(default_factory=list)
    events: list[StoredEvent] = field(default_factory=list)
    ever_released: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        profiles = self.tmp / "profiles"
        profiles.mkdir(parents=True, exist_ok=True)
        (profiles / "crash-h200.yaml").write_text(PROFILE_YAML)
        self.controller = ControllerProcess(self.tmp / "state", free_port(), profiles=profiles)
        self.fleet = SimFleet(self.specs, watch_interval=0.3)
        # Whole NVLink racks (what a ``racks=1`` request takes): rack -> trays.
        nvl = [s for s in self.specs if s.cluster_uuid]
        self.racks = {s.rack: sum(t.rack == s.rack for t in nvl) for s in nvl}
        self._alive = False
        self._channel: grpc.aio.Channel | None = None
        self.stub: fleet_pb2_grpc.FleetServiceStub | None = None

    # -- processes ---------------------------------------------------------------

    async def start(self) -> None:
        await self._start_controller()
        await self.fleet.start(self.controller.address)
        stub = self._stub()
        for spec in self.specs:
            await stub.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name=spec.name,
                    bmc_url=self.fleet.bmc_url(spec.name),
                    username=SIM_USERNAME,
                    password=SIM_PASSWORD,
                    rack=spec.rack,
                    leaf=spec.leaf,
                    spine=spec.spine,
                ),
                timeout=10.0,
            )

    async def _start_controller(self) -> None:
        await self.controller.start()
        self._channel = grpc.aio.insecure_channel(self.controller.address)
        self.stub = fleet_pb2_grpc.FleetServiceStub(self._channel)
        self._alive = True

    async def _kill_controller(self) -> None:
        self._alive = False
        await self.controller.kill()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def stop(self) -> None:
        self._alive = False
        if self._channel is not None:
            await self._channel.close()
        await self.fleet.stop()
        await self.controller.stop()

    def _stub(self) -> fleet_pb2_grpc.FleetServiceStub:
        assert self.stub is not None, "controller not running"
        return self.stub

    def driver(self) -> Driver:
        names = [s.name for s in self.specs]
        return Driver(self._stub(), self.ledger, self.rng, names, lambda: self._alive)

    # -- one crash ---------------------------------------------------------------

    async def crash_once(self, mode: str) -> KillRecord:
        """Drive operations, SIGKILL at the ``mode`` moment, restart, settle, check."""
        driver = self.driver()
        task = asyncio.create_task(driver.run())
        try:
            record = await self._await_moment(mode, driver)
        finally:
            await self._kill_controller()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.kills.append(record)
        await self._start_controller()
        await self.driver().retry_unsure()
        await self.check()
        return record

    async def restart(self) -> None:
        """SIGKILL the controller now, start it again, re-send what was unanswered."""
        await self._kill_controller()
        await self._start_controller()
        await self.driver().retry_unsure()

    async def _await_moment(self, mode: str, driver: Driver, within: float = 4.0) -> KillRecord:
        if mode in ("create_ack", "release_ack"):
            flag = driver.created if mode == "create_ack" else driver.released
            try:
                await asyncio.wait_for(flag.wait(), within)
            except TimeoutError:
                return KillRecord(mode, hit=False)
            return KillRecord(mode, hit=True)  # no await between the answer and the kill
        if mode in ("preparing", "releasing"):
            return await self._await_state(mode, driver, within)
        await asyncio.sleep(self.rng.uniform(0.05, 2.0))
        return KillRecord(mode, hit=True)

    async def _await_state(self, state: str, driver: Driver, within: float) -> KillRecord:
        deadline = time.monotonic() + within
        stub = self._stub()
        if state == "preparing" and self.ledger.acked:  # past bring-up: ask for a preparation
            await driver.create(*self.rng.choice([s for s in SPECS if s[1].profile]))
        if state == "releasing" and self.ledger.active():  # give nodes back to reset
            # A ready one: the nodes of one still preparing go back to their
            # baseline without passing through releasing (on a loaded machine
            # every pick could be one, and the moment never came).
            try:
                listed = await every_page_async(
                    stub.ListAllocations, fleet_pb2.ListAllocationsRequest(), "allocations"
                )
            except grpc.aio.AioRpcError:
                listed = []
            ready = {a.id for a in listed if a.state == fleet_pb2.ALLOCATION_STATE_READY}
            active = self.ledger.active()  # may have emptied while the list was read
            if active:
                await driver.release(self.rng.choice([a for a in active if a in ready] or active))
        while time.monotonic() < deadline:
            try:
                nodes = await every_page_async(
                    stub.ListNodes, fleet_pb2.ListNodesRequest(), "nodes", timeout=5.0
                )
            except grpc.aio.AioRpcError:
                nodes = []
            seen = [n for n in nodes if node_state(n) == state]
            if seen:
                held = [n.name for n in seen if n.allocation]
                if state == "preparing" and held and self.rng.random() < 0.5:
                    # Drain a node mid-preparation for its allocation: the crash
                    # then hits a drain that must later resume that preparation.
                    if len(self.ledger.drained()) < MAX_DRAINED:
                        await driver.drain(self.rng.choice(held), True)
                await asyncio.sleep(self.rng.uniform(0.0, 0.15))
                return KillRecord(state, hit=True, seen=",".join(n.name for n in seen))
            await asyncio.sleep(0.03)
        return KillRecord(state, hit=False)

    # -- settling and invariants -------------------------------------------------

    async def settle(self) -> tuple[list[fleet_pb2.Node], list[fleet_pb2.Allocation]]:
        """(a) Wait until no node is mid-operation; AssertionError on timeout."""
        stub = self._stub()
        deadline = time.monotonic() + self.settle_timeout
        while True:
            nodes = await every_page_async(stub.ListNodes, fleet_pb2.ListNodesRequest(), "nodes")
            allocs = await every_page_async(
                stub.ListAllocations,
                fleet_pb2.ListAllocationsRequest(include_released=True),
                "allocations",
            )
            why = unsettled(nodes, allocs, self.ledger.drain, self.racks)
            if not why:
                # The two lists are two reads: a pass that admitted a pending
                # allocation between them shows it held by nodes listed free.
                # Settled means the nodes read the same again after both.
                again = await every_page_async(
                    stub.ListNodes, fleet_pb2.ListNodesRequest(), "nodes"
                )
                if [_at_rest(n) for n in again] == [_at_rest(n) for n in nodes]:
                    return nodes, allocs
                why = ["the fleet moved while it was read"]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"fleet did not settle after restart {self.controller.starts}: {why}\n"
                    f"kills so far: {self.kills}\n{self.controller.log_tail()}"
                )
            await asyncio.sleep(0.2)

    async def check(self) -> StoreSnapshot:
        """Settle, then assert invariants (a)-(e) on the API and on the SQLite file."""
        nodes, allocs = await self.settle()
        snap = await asyncio.to_thread(read_store, self.controller.db_path)
        problems = store_violations(snap, self.events)
        problems += self._api_agrees(nodes, allocs, snap)
        problems += await self._acknowledged_survive(snap)
        problems += self._released_stay_released(nodes, snap)
        problems += await self._event_stream_matches(snap)
        problems += self.ledger.rpc_errors
        if problems:
            raise AssertionError(
                f"after restart {self.controller.starts} (kills {self.kills}):\n  "
                + "\n  ".join(problems)
                + f"\n{self.controller.log_tail()}"
            )
        self.events = snap.events
        return snap

    @staticmethod
    def _api_agrees(
        nodes: list[fleet_pb2.Node], allocs: list[fleet_pb2.Allocation], snap: StoreSnapshot
    ) -> list[str]:
        problems = []
        for n in nodes:
            stored = snap.nodes.get(n.name)
            if stored is None or stored.allocation != n.allocation:
                problems.append(f"API says {n.name} allocation={n.allocation!r}; store disagrees")
        held: dict[str, str] = {}
        for a in allocs:
            if alloc_state(a) in ("preparing", "ready"):
                for m in [*a.nodes, *a.spares]:
                    if m in held:
                        problems.append(f"API: {m} in {held[m]} and {a.id}")
                    held[m] = a.id
        return problems

    async def _acknowledged_survive(self, snap: StoreSnapshot) -> list[str]:
        """(c) Every acknowledged allocation exists under its key with the same id."""
        problems = []
        by_key = {a.key: a for a in snap.allocations.values()}
        kinds = {(e.kind, e.allocation) for e in snap.events}
        stub = self._stub()
        for key, ident in sorted(self.ledger.acked.items()):
            stored = by_key.get(key)
            if stored is None or stored.id != ident:
                problems.append(f"acknowledged {key} -> {ident} is now {stored}")
                continue
            if ident in self.ledger.admitted and stored.state not in ADMITTED:
                problems.append(f"{ident} was answered as admitted but is now {stored.state}")
            if ("allocation.created", ident) not in kinds:
                problems.append(f"acknowledged {ident} has no allocation.created event")
            again = await stub.CreateAllocation(
                fleet_pb2.CreateAllocationRequest(key=key, spec=self.ledger.specs[key])
            )
            if again.id != ident:
                problems.append(f"re-sending {key} gave {again.id}, not {ident}")
        return problems

    def _released_stay_released(
        self, nodes: list[fleet_pb2.Node], snap: StoreSnapshot
    ) -> list[str]:
        """(d) Released allocations stay released; their nodes are back (or taken again)."""
        problems = []
        kinds = {(e.kind, e.allocation) for e in snap.events}
        self.ever_released |= {a.id for a in snap.allocations.values() if a.state == "released"}
        by_name = {n.name: n for n in nodes}
        for ident in sorted(self.ledger.released | self.ever_released):
            stored = snap.allocations.get(ident)
            if stored is None or stored.state != "released":
                problems.append(f"released {ident} is now {stored.state if stored else 'gone'}")
                continue
            if ident in self.ledger.released and ("allocation.released", ident) not in kinds:
                problems.append(f"released {ident} has no allocation.released event")
            for name in stored.members:
                n = by_name[name]
                if n.allocation == ident:
                    problems.append(f"{name} still held by released {ident}")
                elif not n.allocation and node_state(n) not in ("ready", *OUT):
                    problems.append(f"{name} of released {ident} is {node_state(n)}")
        return problems

    async def _event_stream_matches(self, snap: StoreSnapshot) -> list[str]:
        """(e) The API's event stream is the store's log, in strictly increasing order."""
        stream = self._stub().WatchEvents(fleet_pb2.WatchEventsRequest(after_seq=0, follow=False))
        seqs = [e.seq async for e in stream]
        problems = []
        if any(b <= a for a, b in itertools.pairwise(seqs)):
            problems.append("WatchEvents seqs are not strictly increasing")
        stored = [e.seq for e in snap.events]
        if seqs[: len(stored)] != stored:
            problems.append("WatchEvents does not replay the stored log")
        return problems

    # -- wind-down ---------------------------------------------------------------

    async def wind_down(self) -> StoreSnapshot:
        """Release everything, undrain everything; every node must come back ready."""
        driver = self.driver()
        allocs = await every_page_async(
            self._stub().ListAllocations, fleet_pb2.ListAllocationsRequest(), "allocations"
        )
        for a in allocs:
            self.ledger.acked.setdefault(a.key, a.id)
            self.ledger.specs.setdefault(a.key, a.spec)
            await driver.release(a.id)
        for name in self.ledger.drained():
            await driver.drain(name, False)
        snap = await self.check()
        nodes, _ = await self.settle()
        not_ready = [f"{n.name}={node_state(n)}" for n in nodes if not n.schedulable]
        assert not not_ready, f"not back to ready: {not_ready}"
        drift = [n for n in snap.nodes.values() if n.applied_profile != n.profile or n.operation]
        assert not drift, f"nodes not back at their baseline profile: {drift}"
        return snap


def summary(kills: list[KillRecord], ledger: Ledger, elapsed: float) -> str:
    by_mode: dict[str, list[int]] = {}
    for k in kills:
        hits = by_mode.setdefault(k.mode, [0, 0])
        hits[0] += 1
        hits[1] += k.hit
    modes = ", ".join(f"{m} {h}/{n}" for m, (n, h) in sorted(by_mode.items()))
    return (
        f"{len(kills)} kills in {elapsed:.0f}s (mode hits/kills: {modes}); "
        f"acknowledged ops {dict(sorted(ledger.ops.items()))}"
    )
