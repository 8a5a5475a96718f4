"""A controller with a fleet too large for one page, for the paging tests.

Nodes are enrolled through the API with BMC URLs on one loopback port where
nothing listens, each node its own path (so its own BMC): every BMC call
fails fast with a refused connection. Bulk rows that only fill the fleet go
straight into the controller's store, in maintenance. Shared by
tests/api/test_paging.py and tests/cli/test_cli_paging.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from peers import ControllerThread

from controller.core.lifecycle import Lifecycle
from controller.core.ports import Tx
from controller.core.records import NodeRecord
from controller.core.states import NodeState
from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

PASSWORD = "paging-test-pw"


async def _no_reconciling(self: Lifecycle) -> None:
    await asyncio.Event().wait()  # until cancelled at stop


@contextmanager
def paging_controller(state_dir: Path) -> Iterator[ControllerThread]:
    """A started controller on SQLite in ``state_dir`` that takes requests as
    fast as a test sends them (no per-client rate), its power sync and its
    lifecycle reconciler idle.

    The reconciler is woken by every enrolment and reads every node each
    pass, so with a thousand nodes (and BMCs that never answer) it would make
    each enrolment wait behind a pass; these tests are about listing, so it
    never runs. Nodes stay where the API puts them: enrolled, or draining.
    """
    from controller.server import ControllerConfig

    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=state_dir,
            power_sync_interval=3600.0,
            max_requests_per_second_per_client=1e9,
        )
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Lifecycle, "run", _no_reconciling)
        controller.start()
        try:
            yield controller
        finally:
            controller.stop()


class DeadBmcs:
    """A BMC URL per node on one loopback port where nothing listens."""

    def __init__(self) -> None:
        self.port = free_port()

    def url(self, node: str) -> str:
        return f"redfish+http://127.0.0.1:{self.port}/redfish/v1/Systems/{node}"


def enrol(
    stub: fleet_pb2_grpc.FleetServiceStub,
    bmcs: DeadBmcs,
    names: Sequence[str],
    rack_of: Callable[[str], str],
    *,
    in_flight: int = 32,
    done: Callable[[str], None] | None = None,
) -> None:
    """Enrol ``names`` through the API, ``in_flight`` calls at a time."""
    for start in range(0, len(names), in_flight):
        batch = names[start : start + in_flight]
        calls = [
            (
                name,
                stub.EnrollNode.future(
                    fleet_pb2.EnrollNodeRequest(
                        name=name,
                        bmc_url=bmcs.url(name),
                        username="admin",
                        password=PASSWORD,
                        rack=rack_of(name),
                    ),
                    timeout=120,
                ),
            )
            for name in batch
        ]
        for name, call in calls:
            call.result()
            if done is not None:
                done(name)


def in_store(controller: ControllerThread, fn: Callable[[Tx], None]) -> None:
    """Run ``fn`` in one transaction of the controller's own store."""
    store = controller.server.store
    assert store is not None
    controller.call(store.tx(fn))


def add_parked_nodes(
    controller: ControllerThread, names: Iterable[str], *, rack: str = "parked"
) -> None:
    """Store nodes in maintenance directly (no BMC is ever called for them)."""
    now = time.time()

    def write(tx: Tx) -> None:
        for name in names:
            node = NodeRecord(
                name=name,
                bmc_url=f"redfish+http://127.0.0.1:9/redfish/v1/Systems/{name}",
                rack=rack,
                leaf=rack,
                bmc_username="admin",
                state=NodeState.MAINTENANCE,
                state_reason="parked by the paging tests",
                drained=True,
                created_at=now,
                updated_at=now,
            )
            tx.nodes.add(node, PASSWORD)

    in_store(controller, write)


def every_name(
    stub: fleet_pb2_grpc.FleetServiceStub, request: fleet_pb2.ListNodesRequest
) -> list[str]:
    """The names on every page of ``request`` (its filters and page size kept), in order."""
    paged = fleet_pb2.ListNodesRequest()
    paged.CopyFrom(request)
    names: list[str] = []
    while True:
        response = stub.ListNodes(paged, timeout=60)
        names += [n.name for n in response.nodes]
        if not response.next_page_token:
            return names
        paged.page_token = response.next_page_token


def code_of(error: BaseException) -> grpc.StatusCode:
    assert isinstance(error, grpc.RpcError)
    return error.code()  # type: ignore[attr-defined, no-any-return]
