"""The dashboard's HTML: free text is escaped, heat and states as documented,
and the health history the node page draws."""

from __future__ import annotations

import pytest

from controller.core.health import GpuHealth, HealthReport
from controller.core.live import HISTORY, LiveHealth
from controller.core.model import EventInfo, NodeInfo
from controller.core.states import NodeState, PowerState
from controller.dashboard import pages


def node(name: str, *, temps: tuple[float, ...] = (), drained: bool = False) -> NodeInfo:
    health = HealthReport(
        sampled_at=1.0, gpus=tuple(GpuHealth(index=i, temp_c=t) for i, t in enumerate(temps))
    )
    return NodeInfo(
        name=name,
        rack="r1",
        leaf="",
        spine="",
        bmc_url="redfish+http://127.0.0.1:1/redfish/v1/Systems/x",
        bmc_username="admin",
        state=NodeState.MAINTENANCE if drained else NodeState.READY,
        state_reason="<script>alert(1)</script>",
        power=PowerState.ON,
        bmc_health="ok",
        agent_connected=True,
        agent_last_seen=1.0,
        gpu_model="H200",
        gpu_count=len(temps),
        gpus=(),
        nvlink_domain="",
        allocation="",
        health=health if temps else None,
        profile="",
        updated_at=1.0,
        schedulable=not drained,
        drained=drained,
    )


@pytest.mark.parametrize(
    ("temps", "heat"),
    [((), "unknown"), ((40.0, 69.9), "cool"), ((70.0,), "warm"), ((50.0, 85.0), "hot")],
)
def test_a_tray_is_coloured_by_its_hottest_gpu(temps: tuple[float, ...], heat: str) -> None:
    assert pages.heat_of(node("n1", temps=temps))[0] == heat
    assert f'data-heat="{heat}"' in pages.racks_fragment([node("n1", temps=temps)])


def test_free_text_is_escaped_and_no_bmc_address_is_shown() -> None:
    n = node("n1", temps=(40.0,), drained=True)
    html = pages.node_page(
        n,
        [],
        [EventInfo(1, 1.0, "node.transition", "n1", "", "", "<img src=x onerror=alert(1)>", {})],
    )
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<img" not in html
    assert "127.0.0.1:1" not in html + pages.racks_fragment([n])
    assert "maintenance (drained)" in pages.racks_fragment([n])


def test_the_history_keeps_the_hottest_gpu_of_recent_reports() -> None:
    live = LiveHealth(store=None)  # type: ignore[arg-type]
    for i in range(HISTORY + 5):
        report = HealthReport(
            sampled_at=float(i),
            gpus=(GpuHealth(index=0, temp_c=30.0), GpuHealth(index=1, temp_c=40.0 + i)),
        )
        live.note("n1", report)
    live.note("n1", None)  # a sighting adds no point
    points = live.history("n1")
    assert len(points) == HISTORY
    assert points[-1] == (float(HISTORY + 4), 40.0 + HISTORY + 4)
    assert "<svg" in pages.sparkline(points)
    assert "Not enough samples" in pages.sparkline(points[:1])
