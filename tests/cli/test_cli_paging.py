"""``kiln nodes list`` and ``kiln alloc list`` read every page and print one
table (or one JSON response, the shape it always was).

The controller asks for pages of at most 5000 and the CLI asks for 1000, so a
fleet of more than 1000 nodes proves it follows the page tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from paging_fleet import DeadBmcs, add_parked_nodes, enrol, in_store, paging_controller

from controller.cli.client import CliError
from controller.cli.main import build_parser, main
from controller.cli.pages import PAGE_SIZE, every_page, every_page_async
from controller.core.model import AllocationSpec
from controller.core.ports import Tx
from controller.core.records import AllocationRecord
from controller.core.states import AllocationState
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

pytestmark = pytest.mark.timeout(180)

ENROLLED = [f"api-{i:02d}" for i in range(20)]
PARKED = [f"parked-{i:05d}" for i in range(1030)]
H200 = PARKED[100:103]
HELD = PARKED[500:502]
FAILED_ALLOCS = 1003


@pytest.fixture(scope="module")
def controller_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with (
        paging_controller(tmp_path_factory.mktemp("cli-paging")) as controller,
        grpc.insecure_channel(controller.address) as channel,
    ):
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        enrol(stub, DeadBmcs(), ENROLLED, lambda n: "r1" if n < "api-10" else "r2")
        add_parked_nodes(controller, PARKED)
        now = time.time()

        def kit(tx: Tx) -> None:
            for name in H200 + HELD:
                node = tx.nodes.get(name)
                assert node is not None
                node.gpu_model, node.gpu_count = ("H200", 8) if name in H200 else ("GB200", 4)
                node.allocation_id = "alloc-held" if name in HELD else ""
                tx.nodes.save(node)
            for i in range(FAILED_ALLOCS):
                tx.allocations.add(
                    AllocationRecord(
                        id=f"alloc-{i:05d}",
                        key=f"cli-paging-{i}",
                        spec=AllocationSpec(nodes=1),
                        state=AllocationState.FAILED,
                        reason="no fit (paging test)",
                        submitted=i + 1,
                        created_at=now,
                        updated_at=now,
                    )
                )

        in_store(controller, kit)
        yield controller.address


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def kiln(controller_address: str, capsys: pytest.CaptureFixture[str]) -> Any:
    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main(["--controller", controller_address, *argv])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def rows(result: Result) -> list[str]:
    """The first column of each table row, the header left out."""
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith(("NAME", "ID"))
    return [line.split()[0] for line in lines[1:]]


def test_nodes_list_shows_every_node_of_a_fleet_over_one_page(kiln: Any) -> None:
    listed = rows(kiln("nodes", "list"))
    assert len(ENROLLED) + len(PARKED) > PAGE_SIZE
    assert listed == sorted(ENROLLED + PARKED)


def test_nodes_list_json_is_one_response_with_every_node(kiln: Any) -> None:
    result = kiln("-o", "json", "nodes", "list")
    assert result.code == 0, result.err
    answer = json.loads(result.out)
    assert list(answer) == ["nodes", "next_page_token"] and answer["next_page_token"] == ""
    assert [n["name"] for n in answer["nodes"]] == sorted(ENROLLED + PARKED)


def test_nodes_list_filters_on_the_controller(kiln: Any) -> None:
    assert rows(kiln("nodes", "list", "--gpu-model", "h200")) == H200
    assert rows(kiln("nodes", "list", "--allocation", "alloc-held")) == HELD
    assert rows(kiln("nodes", "list", "--rack", "r1", "--state", "enrolled")) == ENROLLED[:10]
    assert rows(kiln("nodes", "list", "--rack", "parked", "--state", "maintenance")) == PARKED
    assert rows(kiln("nodes", "list", "--allocation", "alloc-held", "--gpu-model", "H200")) == []


def test_alloc_list_shows_every_allocation_over_one_page(kiln: Any) -> None:
    listed = rows(kiln("alloc", "list", "--all"))
    assert listed == [f"alloc-{i:05d}" for i in range(FAILED_ALLOCS)]
    assert rows(kiln("alloc", "list")) == []  # failed ones are not open
    result = kiln("-o", "json", "alloc", "list", "--all")
    answer = json.loads(result.out)
    assert list(answer) == ["allocations", "next_page_token"] and not answer["next_page_token"]
    assert len(answer["allocations"]) == FAILED_ALLOCS


async def test_every_page_async_reads_every_node_through_an_aio_stub(
    controller_address: str,
) -> None:
    async with grpc.aio.insecure_channel(controller_address) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        nodes = await every_page_async(
            stub.ListNodes, fleet_pb2.ListNodesRequest(rack="parked"), "nodes", timeout=60
        )
        allocs = await every_page_async(
            stub.ListAllocations,
            fleet_pb2.ListAllocationsRequest(include_released=True),
            "allocations",
            page_size=400,
        )
    assert [n.name for n in nodes] == PARKED
    assert len(allocs) == FAILED_ALLOCS


# -- the helper, offline -------------------------------------------------------------------


class FakeList:
    """A ListNodes that answers ``pages`` in turn, with the tokens given."""

    def __init__(self, pages: list[tuple[list[str], str]]) -> None:
        self.pages = pages
        self.requests: list[fleet_pb2.ListNodesRequest] = []
        self.kwargs: list[dict[str, Any]] = []

    def __call__(self, request: fleet_pb2.ListNodesRequest, **kwargs: Any) -> Any:
        copy = fleet_pb2.ListNodesRequest()
        copy.CopyFrom(request)
        self.requests.append(copy)
        self.kwargs.append(kwargs)
        names, token = self.pages[len(self.requests) - 1]
        return fleet_pb2.ListNodesResponse(
            nodes=[fleet_pb2.Node(name=n) for n in names], next_page_token=token
        )


@pytest.mark.timeout(10)
def test_every_page_follows_the_tokens_with_the_same_filters() -> None:
    call = FakeList([(["a", "b"], "t1"), (["c"], "t2"), ([], "")])
    request = fleet_pb2.ListNodesRequest(rack="r1", gpu_model="H200")
    nodes = every_page(call, request, "nodes", timeout=7)
    assert [n.name for n in nodes] == ["a", "b", "c"]
    assert [r.page_token for r in call.requests] == ["", "t1", "t2"]
    assert {(r.rack, r.gpu_model, r.page_size) for r in call.requests} == {
        ("r1", "H200", PAGE_SIZE)
    }
    assert call.kwargs == [{"timeout": 7}] * 3
    assert request.page_token == "" and request.page_size == 0  # the caller's, untouched


@pytest.mark.timeout(10)
def test_every_page_refuses_a_list_that_never_ends() -> None:
    call = FakeList([(["a"], "t1"), (["b"], "t2"), (["a"], "t1")])
    with pytest.raises(CliError, match="never ends"):
        every_page(call, fleet_pb2.ListNodesRequest(), "nodes")


@pytest.mark.timeout(10)
def test_nodes_list_takes_gpu_model_and_allocation() -> None:
    args = build_parser().parse_args(
        ["nodes", "list", "--gpu-model", "H200", "--allocation", "alloc-1"]
    )
    assert (args.gpu_model, args.allocation) == ("H200", "alloc-1")
    args = build_parser().parse_args(["nodes", "list"])
    assert (args.gpu_model, args.allocation) == ("", "")
