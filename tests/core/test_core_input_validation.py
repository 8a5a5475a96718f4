"""What enrolment and agent registration refuse before anything is stored — on
both stores: labels that are not names, and GPU inventories no real node has."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Callable

import pytest
from core_builders import gpus, spec

from controller.core.errors import InvalidArgument
from controller.core.fleet import Fleet
from controller.core.model import AllocationSpec, GpuInfo
from controller.core.nodes import validate_gpus, validate_name

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def fleet(make_fleet: Callable[..., Fleet]) -> AsyncIterator[Fleet]:
    fleet = make_fleet()
    yield fleet
    await fleet.stop()


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("leaf", "leaf-\x1b[2J"),
        ("leaf", "-leaf"),
        ("spine", "spine\u202e1"),
        ("spine", "s" * 64),
        ("rack", "rack 1"),
    ],
    ids=["csi-leaf", "dash-leaf", "bidi-spine", "long-spine", "space-rack"],
)
async def test_enrolment_refuses_labels_that_are_not_names(
    fleet: Fleet, label: str, value: str
) -> None:
    with pytest.raises(InvalidArgument, match=f"^{label} name "):
        await fleet.enroll(dataclasses.replace(spec("n1"), **{label: value}))
    assert await fleet.list_nodes() == []


async def test_enrolment_takes_labels_that_are_names(fleet: Fleet) -> None:
    node = await fleet.enroll(dataclasses.replace(spec("n1", "r1"), leaf="leaf_1.a", spine="S-1"))
    assert (node.rack, node.leaf, node.spine) == ("r1", "leaf_1.a", "S-1")


def test_a_refused_name_is_quoted_to_its_first_64_characters() -> None:
    with pytest.raises(InvalidArgument) as e:
        validate_name("node", "x" * 10_000 + "!")
    assert str(e.value) == (
        f"node name {'x' * 64!r}… (10001 characters) is invalid: "
        "use 1-63 letters, digits, '-', '_' or '.'"
    )


def gpu(index: int = 0, **fields: object) -> GpuInfo:
    return dataclasses.replace(
        GpuInfo(index=index, uuid=f"GPU-{index}", model="NVIDIA H200"),
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        ([gpu(0), gpu(1), gpu(0)], "GPU index 0 is registered twice"),
        ([gpu(i) for i in range(65)], "a node has at most 64 GPUs, not 65"),
        ([gpu(64)], "GPU index 64 is out of range 0-63"),
        ([gpu(memory_mib=2**63)], "memory_mib 9223372036854775808 is out of range"),
        ([gpu(memory_mib=-1)], "memory_mib -1 is out of range"),
        ([gpu(pci_device_id=2**32 - 1)], "pci_device_id 4294967295 is out of range"),
        ([gpu(model="")], "GPU 0 model name '' is invalid"),
        ([gpu(model="NVIDIA H\x1b]0;x\x07")], "has control characters"),
        ([gpu(model="NVIDIA H200\u202e")], "GPU 0: model 'NVIDIA H200\\u202e' has control"),
        ([gpu(model="NVIDIA H/200")], "GPU 0 model name 'H/200' is invalid"),
        ([gpu(clique="a\nb")], "GPU 0 NVLink clique name 'a\\nb' is invalid"),
    ],
    ids=[
        "same-index",
        "65-gpus",
        "index-64",
        "memory-2^63",
        "memory-negative",
        "pci-id",
        "no-model",
        "osc-model",
        "bidi-model",
        "slash-in-model",
        "newline-clique",
    ],
)
def test_gpu_inventories_no_real_node_has_are_refused(
    inventory: list[GpuInfo], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        validate_gpus(inventory)


def test_real_inventories_pass() -> None:
    validate_gpus([])
    validate_gpus(gpus(4, "NVIDIA GB200", "8c1f2e4a-0d5b-4a57-9a43-5b1c0e7d9f11.1"))
    validate_gpus([gpu(i, model="NVIDIA H100 80GB HBM3", memory_mib=81559) for i in range(8)])


async def test_a_malformed_registration_stores_nothing_and_keeps_the_agent_connected(
    fleet: Fleet,
) -> None:
    await fleet.enroll(spec("n1"))
    session = await fleet.agent_connected("n1", [gpu(0), gpu(1)], "")
    with pytest.raises(InvalidArgument, match="registered twice"):
        await fleet.agent_connected("n1", [gpu(0), gpu(0)], "")
    node = await fleet.get_node("n1")
    assert [g.index for g in node.gpus] == [0, 1]
    assert node.agent_connected and not session.closed
    with pytest.raises(InvalidArgument, match="registered twice"):
        await fleet.nodes.agent_registered("n1", [gpu(3), gpu(3)], "")
    assert [g.index for g in (await fleet.get_node("n1")).gpus] == [0, 1]


@pytest.mark.parametrize(
    ("fault_json", "message"),
    [
        ('{"kind": "heat", "gpu": 0, "target_c": NaN}', "holds NaN, which is not a number"),
        ('{"kind": "heat", "gpu": 0, "target_c": -Infinity}', "holds -Infinity"),
        ('{"kind": "heat", "gpu": 0, "target_c": 1e999}', "1e999, which is not a finite"),
        ("[" * 100_000, "nested deeper than 16 levels"),
    ],
    ids=["nan", "minus-infinity", "overflowing-float", "deep-nesting"],
)
async def test_a_fault_that_is_not_plain_json_is_refused_before_it_is_sent(
    fleet: Fleet, fault_json: str, message: str
) -> None:
    await fleet.enroll(spec("n1"))
    with pytest.raises(InvalidArgument, match=message):
        await fleet.inject_fault("n1", fault_json)


@pytest.mark.parametrize("model", ["H200\x1b[2J", "A" * 64, "H 200"], ids=["csi", "long", "space"])
async def test_an_allocation_for_a_gpu_model_that_is_not_a_name_is_refused(
    fleet: Fleet, model: str
) -> None:
    with pytest.raises(InvalidArgument, match=r"^GPU model name "):
        await fleet.create_allocation("k1", AllocationSpec(nodes=1, gpu_model=model))
    assert await fleet.list_allocations(include_released=True) == []
