"""A client that drives random operations and remembers what was acknowledged.

The :class:`Ledger` is the client's side of the contract: every intent is
written down *before* its request is sent, and an answer moves it from
"unsure" to "acknowledged". After a crash the client re-sends whatever is
still unsure (every operation is idempotent), just as a real pipeline would,
and the invariants are checked against what was acknowledged.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

T = TypeVar("T")

PROFILE_NAME = "crash-h200"
PROFILE_YAML = f"""
version: v1
name: {PROFILE_NAME}
gpu:
  persistence_mode: true
  power_limit_w: 600
  mig:
    - devices: all
      mig-enabled: false
"""

# (label, spec): small gangs that keep an 8-node fleet busy but not full.
SPECS: tuple[tuple[str, fleet_pb2.AllocationSpec], ...] = (
    ("h200x1", fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200")),
    ("h200x2", fleet_pb2.AllocationSpec(nodes=2, gpu_model="H200")),
    ("h200x1-profile", fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200", profile=PROFILE_NAME)),
    ("h200x2-profile", fleet_pb2.AllocationSpec(nodes=2, gpu_model="H200", profile=PROFILE_NAME)),
    ("gb200x1", fleet_pb2.AllocationSpec(nodes=1, gpu_model="GB200")),
    ("gb200x2", fleet_pb2.AllocationSpec(nodes=2, gpu_model="GB200")),
    ("rack", fleet_pb2.AllocationSpec(racks=1)),
)

# Codes an operation may legitimately get back from a live controller.
TOLERATED = frozenset(
    {
        grpc.StatusCode.FAILED_PRECONDITION,  # e.g. a request that cannot fit yet
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNAVAILABLE,  # a BMC that did not answer
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    }
)
# Answers that settle a request: it was refused and nothing was stored.
REFUSED = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND})
RPC_TIMEOUT = 10.0
MAX_ACTIVE = 4
MAX_DRAINED = 2


@dataclass
class Ledger:
    specs: dict[str, fleet_pb2.AllocationSpec] = field(default_factory=dict)  # every key sent
    acked: dict[str, str] = field(default_factory=dict)  # key -> id, CreateAllocation answered
    create_unsure: set[str] = field(default_factory=set)
    admitted: set[str] = field(default_factory=set)  # ids answered as preparing or ready
    released: set[str] = field(default_factory=set)  # ids, ReleaseAllocation answered
    release_unsure: set[str] = field(default_factory=set)
    drain: dict[str, bool] = field(default_factory=dict)  # node -> last drain intent
    drain_unsure: set[str] = field(default_factory=set)
    rpc_errors: list[str] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    next_key: int = 0

    def active(self) -> list[str]:
        """Acknowledged allocations not (knowingly) released."""
        return sorted(set(self.acked.values()) - self.released - self.release_unsure)

    def drained(self) -> list[str]:
        return sorted(n for n, wanted in self.drain.items() if wanted)

    def count(self, op: str) -> None:
        self.ops[op] = self.ops.get(op, 0) + 1


class Driver:
    """Random operations against one controller incarnation (one stub)."""

    def __init__(
        self,
        stub: fleet_pb2_grpc.FleetServiceStub,
        ledger: Ledger,
        rng: random.Random,
        nodes: list[str],
        alive: Callable[[], bool],
    ) -> None:
        self.stub = stub
        self.ledger = ledger
        self.rng = rng
        self.nodes = nodes
        self._alive = alive
        self.created = asyncio.Event()  # set on each acknowledged CreateAllocation
        self.released = asyncio.Event()  # set on each acknowledged ReleaseAllocation
        self.last_code = grpc.StatusCode.OK

    async def _call(self, what: str, rpc: Awaitable[T]) -> T | None:
        try:
            reply = await rpc
            self.last_code = grpc.StatusCode.OK
            return reply
        except grpc.aio.AioRpcError as e:
            self.last_code = e.code()
            if self._alive() and e.code() not in TOLERATED:
                self.ledger.rpc_errors.append(f"{what}: {e.code().name}: {e.details()}")
            return None

    async def run(self, pause: float = 0.25) -> None:
        """Issue random operations until cancelled."""
        while True:
            await self.step()
            await asyncio.sleep(self.rng.uniform(0.0, pause))

    async def step(self) -> None:
        ledger = self.ledger
        roll = self.rng.random()
        if roll < 0.45:
            if len(ledger.active()) >= MAX_ACTIVE:
                await self.release(self.rng.choice(ledger.active()))
            else:
                await self.create(*self.rng.choice(SPECS))
        elif roll < 0.75:
            if ledger.active():
                await self.release(self.rng.choice(ledger.active()))
        elif roll < 0.85:
            free = [n for n in self.nodes if not ledger.drain.get(n)]
            if len(ledger.drained()) < MAX_DRAINED and free:
                await self.drain(self.rng.choice(free), True)
        elif roll < 0.95:
            if ledger.drained():
                await self.drain(self.rng.choice(ledger.drained()), False)
        else:
            await self.cycle(self.rng.choice(self.nodes))

    async def create(
        self, label: str, spec: fleet_pb2.AllocationSpec
    ) -> fleet_pb2.Allocation | None:
        """A new key for ``spec``; the answer, or None when there was none."""
        ledger = self.ledger
        key = f"k{ledger.next_key:04d}-{label}"
        ledger.next_key += 1
        ledger.specs[key] = spec
        ledger.create_unsure.add(key)
        return await self._send_create(key)

    async def _send_create(self, key: str) -> fleet_pb2.Allocation | None:
        ledger = self.ledger
        reply = await self._call(
            f"create {key}",
            self.stub.CreateAllocation(
                fleet_pb2.CreateAllocationRequest(key=key, spec=ledger.specs[key]),
                timeout=RPC_TIMEOUT,
            ),
        )
        if reply is None:
            if self.last_code in REFUSED:  # e.g. cannot fit before inspection
                ledger.count("create_refused")
                ledger.create_unsure.discard(key)
            return None
        ledger.count("create")
        ledger.create_unsure.discard(key)
        if key in ledger.acked and ledger.acked[key] != reply.id:
            ledger.rpc_errors.append(f"key {key} answered {reply.id}, before {ledger.acked[key]}")
        ledger.acked[key] = reply.id
        if reply.state in (
            fleet_pb2.ALLOCATION_STATE_PREPARING,
            fleet_pb2.ALLOCATION_STATE_READY,
        ):
            ledger.admitted.add(reply.id)
        self.created.set()
        return reply

    async def release(self, ident: str) -> None:
        self.ledger.release_unsure.add(ident)
        reply = await self._call(
            f"release {ident}",
            self.stub.ReleaseAllocation(
                fleet_pb2.ReleaseAllocationRequest(id=ident), timeout=RPC_TIMEOUT
            ),
        )
        if reply is None:
            return
        self.ledger.count("release")
        self.ledger.release_unsure.discard(ident)
        self.ledger.released.add(ident)
        self.released.set()

    async def drain(self, node: str, wanted: bool) -> None:
        self.ledger.drain[node] = wanted
        self.ledger.drain_unsure.add(node)
        if wanted:
            rpc = self.stub.DrainNode(
                fleet_pb2.DrainNodeRequest(name=node, reason="crash test"), timeout=RPC_TIMEOUT
            )
        else:
            rpc = self.stub.UndrainNode(
                fleet_pb2.UndrainNodeRequest(name=node), timeout=RPC_TIMEOUT
            )
        if await self._call(f"{'drain' if wanted else 'undrain'} {node}", rpc) is not None:
            self.ledger.count("drain" if wanted else "undrain")
            self.ledger.drain_unsure.discard(node)

    async def cycle(self, node: str) -> None:
        reply = await self._call(
            f"power cycle {node}",
            self.stub.PowerNode(
                fleet_pb2.PowerNodeRequest(name=node, action=types_pb2.POWER_ACTION_CYCLE),
                timeout=RPC_TIMEOUT,
            ),
        )
        if reply is not None:
            self.ledger.count("power_cycle")

    async def retry_unsure(self) -> None:
        """Re-send every request whose answer the crash swallowed (all idempotent)."""
        ledger = self.ledger
        for key in sorted(ledger.create_unsure):
            await self._send_create(key)
        for ident in sorted(ledger.release_unsure):
            await self.release(ident)
        for node in sorted(ledger.drain_unsure):
            await self.drain(node, ledger.drain[node])
        unsure = ledger.create_unsure | ledger.release_unsure | ledger.drain_unsure
        assert not unsure, f"retries after restart failed: {sorted(unsure)}"
