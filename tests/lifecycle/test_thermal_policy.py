"""Automated thermal power-down, end to end on real peers.

Each test runs a real Mosquitto broker, a ControllerServer with a short-timed
rule set publishing its events there, and a simulated fleet whose BMCs are the
sushy-tools Redfish emulator and whose GPUs are the NVML fake (one GB200 rack
of four trays, two HGX H200 nodes). Faults are injected through the API into
the fake; outcomes are read where they land: the emulator's PowerState over
HTTP, node states over gRPC, events on MQTT.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from thermal_harness import (
    ThermalHarness,
    allocation_topic,
    policy_action,
    subscribe,
    thermal_fleet,
)

from controller.api import convert
from controller.sim.fleet import SIM_PASSWORD
from controller.store.models import NodeRow
from controller.store.sql_store import SqlTx
from kiln.v1 import fleet_pb2, types_pb2

S = types_pb2
GB200_SLOWDOWN_C = 89.0  # the NVML fake's GB200 slowdown threshold
HOT_C = 88.0  # 1 °C below slowdown: inside the rule, below shutdown

HOT_RULES = """
version: v1
max_sample_gap: 5s
caps:
  power_off: {per_rack: 2, fleet: 10, window: 120s}
rules:
  - name: gpu-hot
    when: {metric: gpu_temp_margin_to_slowdown_c, op: "<=", value: 3}
    for: 2s
    actions: [drain, notify_job, {power_off: graceful, after: 3s}]
"""


def _state(node: fleet_pb2.Node) -> str:
    return str(S.NodeState.Name(node.state))


async def test_hot_gpu_drains_tells_the_job_powers_off_and_replaces_the_node(
    tmp_path: Path,
) -> None:
    async with thermal_fleet(tmp_path, HOT_RULES) as h:
        alloc = await h.allocate(
            "train", fleet_pb2.AllocationSpec(nodes=2, gpu_model="GB200", topology=1)
        )
        hot, other = sorted(alloc.nodes)
        free = {n.name for n in await h.nodes() if n.name.startswith("gb200")} - {hot, other}
        topic = allocation_topic(alloc.id)
        async with subscribe(h.broker, topic) as job:
            await h.heat(hot, gpu=2, target_c=HOT_C)

            # The rule holds for 2s: the node drains and the job hears of it.
            (drained,) = await job.wait_for(
                lambda e: e.kind == "node.transition" and e.data["to_state"] == "draining",
                topic=topic,
            )
            assert drained.node == hot and drained.data["from_state"] == "allocated"
            assert "gpu-hot" in drained.reason and "gpu2" in drained.reason
            notices = await job.wait_for(lambda e: e.kind == "allocation.notice", topic=topic)
            assert notices[0].node == hot and notices[0].rule == "gpu-hot"
            assert "gpu_temp_margin_to_slowdown_c=1" in notices[0].reason
            drain = (await job.wait_for(policy_action("drain", node=hot), topic=topic))[0]
            assert drain.allocation == alloc.id and drain.data["outcome"] == "node to maintenance"

            # After the 3s grace the BMC powers it off and the job gets a replacement.
            off = await job.wait_for(policy_action("power_off_graceful", node=hot), topic=topic)
            assert off[0].data["suppressed"] is None and off[0].data["dry_run"] is False
            assert "still active after 3s grace" in off[0].reason
            assert off[0].at - drain.at >= 2.5, "the graceful power-off waited its grace"
            await h.wait_emulator_power(hot, "Off")
            replaced = await job.wait_for(
                lambda e: e.kind in ("allocation.node_replaced", "allocation.degraded"),
                topic=topic,
            )
        assert replaced[0].kind == "allocation.node_replaced"
        assert replaced[0].data["failed"] == hot
        (replacement,) = replaced[0].data["replacement"]
        assert replacement in free

        gone = await h.wait_node(
            hot, lambda n: n.state == S.NODE_STATE_POWERED_OFF and not n.agent_connected
        )
        assert gone.power == S.POWER_STATE_OFF and not gone.allocation and not gone.schedulable
        now = await h.allocation(alloc.id)
        assert sorted(now.nodes) == sorted([other, replacement])
        assert now.state == fleet_pb2.ALLOCATION_STATE_READY
        assert (await h.node(replacement)).state == S.NODE_STATE_ALLOCATED
        assert (await h.node(other)).state == S.NODE_STATE_ALLOCATED
        for name in (other, replacement):
            assert await h.emulator_power(name) == "On"
        # The sim follows the BMC: the powered-off tray's agent went with its power.
        assert h.fleet.nodes[hot].history == ["on", "off"]
        # Exactly one take-down: the rule fired once for its episode.
        actions = h.mqtt.events(policy_action(node=hot))
        assert [e.data["action"] for e in actions] == [
            "drain",
            "notify_job",
            "power_off_graceful",
        ]
        assert not h.mqtt.events(policy_action(node=other))


GARBAGE_RULES = """
version: v1
max_sample_gap: 5s
thresholds: {slowdown_c: 89, shutdown_c: 92}
rules:
  - name: hot-abs
    when: {metric: gpu_temp_c, op: ">=", value: 80}
    for: 1500ms
    actions: [drain, {power_off: now}]
  - name: hot-margin
    when: {metric: gpu_temp_margin_to_slowdown_c, op: "<=", value: 3}
    for_samples: 3
    actions: [drain, {power_off: now}]
"""
NAN, INF = float("nan"), float("inf")


def _gpus(*temps: Any, slowdown: Any = GB200_SLOWDOWN_C) -> dict[str, Any]:
    return {
        "gpus": [
            {"index": i, "temp_c": t, "slowdown_c": slowdown, "shutdown_c": 92.0}
            for i, t in enumerate(temps)
        ]
    }


# Reports no rule may act on, however long they last: broken sensors
# (NaN, ±inf, impossible or non-numeric temperatures), broken thresholds
# (which would make a cool GPU look 45 °C past slowdown), malformed entries.
GARBAGE: list[dict[str, Any]] = [
    _gpus(NAN, NAN, NAN, NAN),
    _gpus(INF, INF, INF, INF),
    _gpus(1e6, 1e6, 1e6, 1e6),
    _gpus(-300.0, -300.0, -300.0, -300.0),
    _gpus(None, None, None, None),
    _gpus("95", "hot", [95], {"c": 95}),
    _gpus(True, True, True, True),
    _gpus(40.0, 40.0, 40.0, 40.0, slowdown=-5.0),
    _gpus(40.0, 40.0, 40.0, 40.0, slowdown=NAN),
    _gpus(40.0, 40.0, 40.0, 40.0, slowdown=0.0),
    {"gpus": ["junk", 7, None, [95.0]]},
    {"gpus": [{"index": "gpu0", "temp_c": 95.0}, {"index": -1, "temp_c": 95.0}]},
    {"gpus": "95"},
    {"gpus": None},
    {},
]


def _on_the_wire(report: dict[str, Any]) -> types_pb2.NodeHealth | None:
    """``report`` as the NodeHealth message an agent would send; None when the
    message types cannot even carry it (a string temperature, an index that
    is not a number): such a report never reaches the controller."""
    gpus = report.get("gpus")
    if not isinstance(gpus, list):
        return types_pb2.NodeHealth() if gpus is None else None
    try:
        return types_pb2.NodeHealth(
            gpus=[
                types_pb2.GpuHealth(**{k: v for k, v in g.items() if v is not None}) for g in gpus
            ]
        )
    except (TypeError, ValueError, AttributeError):
        return None


async def _observe(h: ThermalHarness, node: str, report: dict[str, Any]) -> None:
    """Feed ``report`` to the policies through the API's edge conversion."""
    message = _on_the_wire(report)
    if message is not None:
        await h.policies.observe(node, "r01", convert.health_from_pb(message))


async def _feed(h: ThermalHarness, node: str, reports: list[dict[str, Any]], every: float) -> None:
    for report in reports:
        await _observe(h, node, report)
        await asyncio.sleep(every)


async def test_garbage_readings_and_one_sample_spikes_power_nothing_down(
    tmp_path: Path,
) -> None:
    async with thermal_fleet(tmp_path, GARBAGE_RULES) as h:
        live, silent, spiked = "gb200-r01-t01", "gb200-r01-t02", "gb200-r01-t03"
        h.policies.silent_after = 3600.0  # only the reports fed below speak for `silent`
        # Impossible readings from the NVML fake itself, through the real agent.
        await h.heat(live, gpu=0, target_c=1000.0, rate=10_000.0)
        await h.heat(live, gpu=1, target_c=-100.0, rate=10_000.0)
        await h.silence(silent)

        # Garbage only, for twice the rules' duration (well over three samples).
        await _feed(h, silent, GARBAGE * 3, every=0.07)
        # Spikes: one GPU hot on every other sample; a hot GPU that moves every sample.
        await _feed(h, silent, [_gpus(95.0 if i % 2 else 35.0, 35, 35, 35) for i in range(16)], 0.1)
        moving = [35.0, 35.0, 35.0, 35.0]
        for i in range(16):
            temps = list(moving)
            temps[i % 4] = 95.0
            await _observe(h, silent, _gpus(*temps))
            await asyncio.sleep(0.1)
        # One hot sample on a node whose agent keeps reporting normal readings.
        await _observe(h, spiked, _gpus(95.0, 95.0, 95.0, 95.0))
        await asyncio.sleep(2.0)

        shown = await h.node(live)
        assert [g.temp_c for g in shown.health.gpus[:2]] == [1000.0, -100.0], (
            "the impossible readings did reach the controller"
        )
        events = await h.stored_events()
        assert not [e for e in events if e.kind == "policy.action"]
        assert not [e for e in events if e.kind == "node.power" and "off" in e.reason]
        for node in await h.nodes():
            assert await h.emulator_power(node.name) == "On", node.name
            assert node.state == S.NODE_STATE_READY, node.name
            assert node.schedulable == (node.name != silent), node.name

        # Control: the same path does power a node down on sustained, sane heat.
        await _feed(h, silent, [_gpus(95.0, 35, 35, 35)] * 20, every=0.1)
        await h.wait_emulator_power(silent, "Off")
        offs = await h.mqtt.wait_for(policy_action("power_off_now", node=silent))
        assert offs[0].data["suppressed"] is None and not offs[0].data["dry_run"]
        assert "gpu0" in offs[0].reason
        await h.wait_node(silent, lambda n: n.state == S.NODE_STATE_POWERED_OFF)
        assert not h.mqtt.events(policy_action(node=live))
        assert not h.mqtt.events(policy_action(node=spiked))


CAP_RULES = """
version: v1
max_sample_gap: 5s
caps:
  power_off: {per_rack: 2, fleet: 10, window: 120s}
rules:
  - name: gpu-hot
    when: {metric: gpu_temp_margin_to_slowdown_c, op: "<=", value: 3}
    for: 1500ms
    actions: [drain, {power_off: graceful, after: 2s}]
"""


async def test_a_whole_rack_heating_at_once_loses_at_most_the_per_rack_cap(
    tmp_path: Path,
) -> None:
    async with thermal_fleet(tmp_path, CAP_RULES) as h:
        rack = sorted(n.name for n in await h.nodes() if n.rack == "r01")
        assert len(rack) == 4
        await asyncio.gather(*(h.heat(n, gpu=0, target_c=HOT_C) for n in rack))

        offs = await h.mqtt.wait_for(policy_action("power_off_graceful"), count=4)
        executed = sorted(e.node for e in offs if e.data["suppressed"] is None)
        held = sorted(e.node for e in offs if e.data["suppressed"] is not None)
        assert len(executed) == 2 and len(held) == 2, [e.data for e in offs]
        assert sorted(executed + held) == rack
        for e in offs:
            if e.data["suppressed"]:
                assert e.data["suppressed"].startswith("cap: rule gpu-hot already took down 2")
                assert "per_rack=2" in e.data["suppressed"]
                assert e.data["outcome"].startswith("held back")
        for name in executed:
            await h.wait_node(name, lambda n: n.state == S.NODE_STATE_POWERED_OFF)
            assert await h.emulator_power(name) == "Off"
        for name in held:
            node = await h.wait_node(name, lambda n: n.state == S.NODE_STATE_MAINTENANCE)
            assert not node.schedulable and node.power == S.POWER_STATE_ON
        await asyncio.sleep(1.0)  # nothing retries the held-back ones in this episode
        powers = {name: await h.emulator_power(name) for name in rack}
        assert sorted(n for n, p in powers.items() if p == "Off") == executed
        assert len(h.mqtt.events(policy_action("power_off_graceful"))) == 4
        for other in (n for n in await h.nodes() if n.rack != "r01"):
            assert other.state == S.NODE_STATE_READY
            assert await h.emulator_power(other.name) == "On"


async def test_dry_run_reports_what_the_rule_would_do_and_touches_nothing(
    tmp_path: Path,
) -> None:
    rules = HOT_RULES.replace("version: v1\n", "version: v1\ndry_run: true\n")
    async with thermal_fleet(tmp_path, rules) as h:
        alloc = await h.allocate(
            "dry", fleet_pb2.AllocationSpec(nodes=2, gpu_model="GB200", topology=1)
        )
        hot = sorted(alloc.nodes)[0]
        topic = allocation_topic(alloc.id)
        async with subscribe(h.broker, topic) as job:
            await h.heat(hot, gpu=1, target_c=HOT_C)
            await job.wait_for(policy_action("power_off_graceful", node=hot), topic=topic)
        reported = h.mqtt.events(policy_action(node=hot))
        assert [e.data["action"] for e in reported] == [
            "drain",
            "notify_job",
            "power_off_graceful",
        ]
        for e in reported:
            assert e.data["dry_run"] is True and e.data["outcome"] == "dry run"
            assert e.allocation == alloc.id and "gpu1" in e.reason
        await asyncio.sleep(0.5)
        node = await h.node(hot)
        assert node.state == S.NODE_STATE_ALLOCATED, "a dry run drains nothing"
        assert node.power == S.POWER_STATE_ON and await h.emulator_power(hot) == "On"
        assert sorted((await h.allocation(alloc.id)).nodes) == sorted(alloc.nodes)
        kinds = {e.kind for e in await h.stored_events(node=hot)}
        assert "allocation.notice" not in kinds and "allocation.node_replaced" not in kinds
        transitions = [e for e in await h.stored_events(node=hot) if e.kind == "node.transition"]
        assert "allocated" in transitions[-1].data_json


BMC_RULES = """
version: v1
max_sample_gap: 10s
rules:
  - name: bmc-warm
    when: {metric: gpu_temp_c, op: ">=", value: 40}
    for_samples: 2
    actions: [drain, notify_job, {power_off: graceful, after: 1s}]
"""


async def test_a_silent_node_is_watched_through_its_bmc_thermal_sensors(
    tmp_path: Path,
) -> None:
    # The emulator's thermal sensors read a static 41 °C (and a 25 °C intake);
    # agents report idle GPUs near 30 °C, so only BMC samples can fire this rule.
    async with thermal_fleet(tmp_path, BMC_RULES) as h:
        alloc = await h.allocate("bmc", fleet_pb2.AllocationSpec(nodes=1, gpu_model="H200"))
        (quiet,) = alloc.nodes
        topic = allocation_topic(alloc.id)
        h.policies.silent_after = 1.0
        h.policies.bmc_sample_interval = 0.2
        h.policies.tick_interval = 0.2
        async with subscribe(h.broker, topic) as job:
            await h.silence(quiet)
            assert await h.emulator_power(quiet) == "On"
            drain = await job.wait_for(policy_action("drain", node=quiet), topic=topic)
            assert "from bmc" in drain[0].reason and "bmc0 gpu_temp_c=41" in drain[0].reason
            await job.wait_for(lambda e: e.kind == "allocation.notice", topic=topic)
            await h.wait_emulator_power(quiet, "Off")
            # One H200 box is its own NVLink domain: nothing can replace it.
            degraded = await job.wait_for(
                lambda e: e.kind in ("allocation.degraded", "allocation.node_replaced"),
                topic=topic,
            )
        assert degraded[0].kind == "allocation.degraded" and degraded[0].data["failed"] == quiet
        await h.wait_node(quiet, lambda n: n.state == S.NODE_STATE_POWERED_OFF)
        actions = h.mqtt.events(policy_action())
        assert {e.node for e in actions} == {quiet}, "nodes with live agents stay agent-sampled"
        assert all("from bmc" in e.reason for e in actions)


async def test_a_power_off_the_bmc_refuses_leaves_the_node_drained_not_off(
    tmp_path: Path,
) -> None:
    async with thermal_fleet(tmp_path, CAP_RULES) as h:
        name = "h200-n02"
        wrong = "rotated-password-kiln-does-not-know"

        def rotate(tx: SqlTx) -> None:  # the BMC's password changed under Kiln
            row = tx.session.get(NodeRow, name)
            assert row is not None
            row.bmc_password = wrong
            tx.session.add(row)

        assert h.server.store is not None
        await h.server.store.tx(rotate)
        started = time.time()
        await h.heat(name, gpu=5, target_c=88.0)
        failed = await h.mqtt.wait_for(
            lambda e: e.kind == "policy.action" and e.data["outcome"].startswith("failed")
        )
        assert failed[0].node == name and failed[0].data["action"] == "power_off_graceful"
        assert "refused the credentials" in failed[0].data["outcome"]
        node = await h.wait_node(name, lambda n: n.state == S.NODE_STATE_MAINTENANCE)
        assert not node.schedulable and await h.emulator_power(name) == "On"
        await asyncio.sleep(0.5)
        assert (await h.node(name)).state == S.NODE_STATE_MAINTENANCE
        for e in await h.stored_events(node=name):
            assert wrong not in str(e) and SIM_PASSWORD not in str(e)
        assert time.time() - started < 30
