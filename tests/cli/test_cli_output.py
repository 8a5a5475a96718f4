"""Rendering of API messages: tables, enum names, node details, progress, events."""

from __future__ import annotations

import io
import json

import pytest
from cli_builders import make_gpu_health, make_node, make_progress

from controller.cli.alloc import allocation_detail, allocations_table
from controller.cli.events import event_line
from controller.cli.nodes import node_detail, nodes_table
from controller.cli.output import (
    enum_prefix,
    fmt_time,
    message_dict,
    render_fields,
    render_table,
    short_enum,
)
from controller.cli.power import BulkResult, ProgressLine, bulk_summary, progress_text
from controller.cli.racks import racks_table
from kiln.v1 import fleet_pb2, types_pb2


def test_table_columns_align() -> None:
    text = render_table(("name", "state"), [("a", "ready"), ("longer-name", "")])
    assert text.splitlines() == [
        "NAME         STATE",
        "a            ready",
        "longer-name  -",
    ]


def test_table_flattens_newlines_and_has_no_trailing_blanks() -> None:
    lines = render_table(("x", "why"), [("1", "two\nlines"), ("2", "")]).splitlines()
    assert lines[1] == "1  two lines"
    assert all(line == line.rstrip() for line in lines)


def test_empty_table_is_the_header() -> None:
    assert render_table(("name", "rack"), []) == "NAME  RACK"


@pytest.mark.parametrize(
    ("enum_name", "prefix"),
    [
        ("NodeState", "NODE_STATE_"),
        ("PowerState", "POWER_STATE_"),
        ("AllocationState", "ALLOCATION_STATE_"),
        ("TopologyLevel", "TOPOLOGY_LEVEL_"),
    ],
)
def test_enum_prefix(enum_name: str, prefix: str) -> None:
    assert enum_prefix(enum_name) == prefix


@pytest.mark.parametrize(
    ("state", "shown"),
    [
        (types_pb2.NODE_STATE_READY, "ready"),
        (types_pb2.NODE_STATE_POWERED_OFF, "powered_off"),
        (types_pb2.NODE_STATE_UNSPECIFIED, "-"),
        (99, "?99"),
    ],
)
def test_short_enum(state: int, shown: str) -> None:
    assert short_enum(fleet_pb2.Node(state=state), "state") == shown


def test_fmt_time() -> None:
    assert fmt_time(0) == "-"
    assert fmt_time(1_700_000_000.5) == "2023-11-14T22:13:20Z"


def test_nodes_table_rows() -> None:
    nodes = [
        make_node("gb200-r01-t01"),
        make_node(
            "gb200-r01-t02",
            state=types_pb2.NODE_STATE_DRAINING,
            power=types_pb2.POWER_STATE_OFF,
            agent_connected=False,
            gpu_count=0,
            state_reason="hot GPU 3",
            allocation="a-1",
        ),
    ]
    lines = nodes_table(nodes).splitlines()
    assert lines[0].split() == [
        "NAME",
        "RACK",
        "STATE",
        "POWER",
        "BMC",
        "AGENT",
        "GPUS",
        "ALLOC",
        "REASON",
    ]
    assert lines[1].split() == [
        "gb200-r01-t01",
        "r01",
        "ready",
        "on",
        "ok",
        "up",
        "4x",
        "GB200",
        "-",
        "-",
    ]
    assert lines[2].split() == [
        "gb200-r01-t02",
        "r01",
        "draining",
        "off",
        "ok",
        "down",
        "-",
        "a-1",
        "hot",
        "GPU",
        "3",
    ]


def test_node_detail_shows_gpus_and_health() -> None:
    node = make_node(
        gpus=[types_pb2.Gpu(index=0, uuid="GPU-0000", model="NVIDIA GB200", memory_mib=189471)],
        health=types_pb2.NodeHealth(
            sampled_at=1_700_000_000,
            source="agent",
            gpus=[
                make_gpu_health(
                    0,
                    temp_c=71.4,
                    slowdown_c=87,
                    shutdown_c=92,
                    power_w=612.0,
                    power_limit_w=1200,
                    sm_clock_mhz=1980,
                    mem_clock_mhz=3996,
                    ecc_sbe_volatile=2,
                    ecc_dbe_aggregate=1,
                    remap_correctable=0,
                    remap_uncorrectable=1,
                    remap_pending=True,
                    remap_failure=False,
                    xids=[79, 48],
                    fabric_healthy=True,
                ),
                make_gpu_health(1, lost=True, errors=["temperature: GPU is lost"]),
            ],
        ),
    )
    text = node_detail(node)
    assert "state:" in text and "ready" in text
    assert "NVIDIA GB200" in text and "185 GiB" in text
    assert "Health (agent, 2023-11-14T22:13:20Z):" in text
    health = text.split("Health (")[1].splitlines()
    row0 = health[2].split()
    assert row0 == [
        "0",
        "71C",
        "87C",
        "92C",
        "612W",
        "1200W",
        "1980MHz",
        "3996MHz",
        "2/0",
        "0/1",
        "0/1",
        "yes/no",
        "79,48",
        "-",
        "healthy",
    ]
    # absent readings are shown as absent, never as zeros
    assert health[3].split()[:6] == ["1", "(lost)", "-", "-", "-", "-"]
    assert "gpu 1: temperature: GPU is lost" in text


def test_node_detail_without_health_has_no_health_section() -> None:
    text = node_detail(make_node())
    assert "Health" not in text
    assert "redfish://127.0.0.1:8000" in text


def test_racks_table() -> None:
    rack = fleet_pb2.Rack(
        name="r01",
        nvlink_domain="nvl-r01",
        gpu_model="GB200",
        nodes=18,
        gpus=72,
        ready=17,
        allocated=0,
        leaf="leaf-1",
        spine="spine-1",
    )
    assert racks_table([rack]).splitlines()[1].split() == [
        "r01",
        "nvl-r01",
        "GB200",
        "18",
        "72",
        "17",
        "0",
        "leaf-1",
        "spine-1",
    ]


def test_allocation_show_leads_with_state_and_reason() -> None:
    alloc = fleet_pb2.Allocation(
        id="a-7",
        state=fleet_pb2.ALLOCATION_STATE_PENDING,
        reason="queue research is at quota",
        spec=fleet_pb2.AllocationSpec(
            nodes=4, gpu_model="H200", topology=fleet_pb2.TOPOLOGY_LEVEL_NVLINK
        ),
    )
    lines = allocation_detail(alloc).splitlines()
    assert lines[1].split() == ["state:", "pending"]
    assert lines[2].split(None, 1) == ["reason:", "queue research is at quota"]
    assert "4 nodes H200 nvlink" in lines[4]
    row = allocations_table([alloc]).splitlines()[1]
    assert row.split()[:2] == ["a-7", "pending"] and row.endswith("queue research is at quota")


def test_render_fields_aligns_values() -> None:
    assert render_fields([("id", "a"), ("state", "ready")]).splitlines() == [
        "id:    a",
        "state: ready",
    ]


def test_json_has_every_field_and_the_tables_words_for_states() -> None:
    node = make_node(state_reason="")
    data = message_dict(node)
    assert data["state"] == "ready"  # the word the table shows
    assert data["gpu_count"] == 4
    assert data["state_reason"] == ""  # present though empty
    assert data["schedulable"] in (True, False)
    assert set(data) == {f.name for f in fleet_pb2.Node.DESCRIPTOR.fields}
    assert data["health"] is None or isinstance(data["health"], dict)
    unset = message_dict(fleet_pb2.Node(name="n"))
    assert unset["state"] == "" and unset["power"] == "" and unset["gpus"] == []
    assert unset["health"] is None  # a message not sent: null, not left out
    page = message_dict(fleet_pb2.ListNodesResponse(nodes=[node]))
    assert page["nodes"][0]["state"] == "ready" and page["next_page_token"] == ""


@pytest.mark.parametrize(
    ("event", "line"),
    [
        pytest.param(
            types_pb2.Event(
                seq=12,
                at=1_700_000_000,
                kind="node.transition",
                node="n1",
                reason="ready -> draining",
            ),
            "12 2023-11-14T22:13:20Z node.transition n1 ready -> draining",
            id="node",
        ),
        pytest.param(
            types_pb2.Event(seq=13, at=1_700_000_000, kind="alloc.ready", allocation="a-1"),
            "13 2023-11-14T22:13:20Z alloc.ready a-1 -",
            id="alloc",
        ),
        pytest.param(
            types_pb2.Event(
                seq=14,
                at=1_700_000_000,
                kind="policy.fired",
                node="n2",
                allocation="a-1",
                rule="hot",
                reason="92C for 60s",
            ),
            "14 2023-11-14T22:13:20Z policy.fired n2/a-1 [hot] 92C for 60s",
            id="rule",
        ),
    ],
)
def test_event_line(event: types_pb2.Event, line: str) -> None:
    assert event_line(event).split() == line.split()  # the same words, in columns:
    seq, at, kind, subject = line.split()[:4]
    shown = event_line(event)
    assert shown.startswith(seq.rjust(6) + "  " + at + "  " + kind.ljust(24) + "  ")
    assert shown.index(subject, len(seq) + 2) == 6 + 2 + 20 + 2 + 24 + 2


def test_progress_text() -> None:
    assert progress_text(make_progress("gb200-r01-t05", 12, 36)) == "[12/36] gb200-r01-t05 ok on"
    failed = make_progress("gb200-r01-t06", 13, 36, error="BMC 10.0.0.6 is unreachable")
    assert progress_text(failed) == "[13/36] gb200-r01-t06 FAILED: BMC 10.0.0.6 is unreachable"


def test_bulk_summary_lists_failures_with_reasons() -> None:
    result = BulkResult(ok=["a", "b"], failed=[("d", "timeout"), ("c", "refused")], total=4)
    lines = bulk_summary("off", result).splitlines()
    assert lines[0] == "power off: 4 nodes, 2 ok, 2 failed"
    assert [line.split() for line in lines[1:]] == [
        ["NODE", "ERROR"],
        ["c", "refused"],
        ["d", "timeout"],
    ]
    assert bulk_summary("on", BulkResult(ok=["a"], total=2)) == (
        "power on: 2 nodes, 1 ok, 0 failed, 1 without an answer"
    )


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_rewrites_in_place_on_a_tty() -> None:
    stream = _Tty()
    line = ProgressLine(stream)
    line.update("[1/3] node-long-name ok on")
    line.update("[2/3] n2 FAILED: refused", keep=True)
    line.update("[3/3] n3 ok on")
    line.finish()
    assert stream.getvalue() == (
        "\r[1/3] node-long-name ok on\r[2/3] n2 FAILED: refused  \n\r[3/3] n3 ok on\n"
    )


def test_progress_line_is_plain_lines_off_a_tty() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream)
    line.update("[1/2] a ok on")
    line.update("[2/2] b ok on")
    line.finish()
    assert stream.getvalue() == "[1/2] a ok on\n[2/2] b ok on\n"


def test_json_lines_parse() -> None:
    assert json.loads(json.dumps(message_dict(make_progress("n", 1, 1))))["node"] == "n"


def test_progress_line_fits_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "41")
    stream = _Tty()
    line = ProgressLine(stream)
    line.update("[1/2] " + "n" * 100 + " ok on")
    line.update("[2/2] b FAILED: " + "x" * 100, keep=True)
    first, second = stream.getvalue().split("\r")[1:]
    assert len(first) == 40
    assert second.rstrip().endswith("x" * 100)  # a failure is kept whole
