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
import math
from pathlib import Path
from typing import Any

from kiln.v1 import fleet_pb2, types_pb2
from thermal_harness import (
    ThermalHarness,
    allocation_topic,
    policy_action,
    subscribe,
    thermal_fleet,
)

from controller.events import Event

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
            drained = await h.wait_node(hot, lambda n: n.state == S.NODE_STATE_DRAINING)
            assert "gpu-hot" in drained.state_reason and "gpu2" in drained.state_reason
            notices = await job.wait_for(lambda e: e.kind == "allocation.notice", topic=topic)
            assert notices[0].node == hot and notices[0].rule == "gpu-hot"
            assert "gpu_temp_margin_to_slowdown_c=1" in notices[0].reason
            drain = (await job.wait_for(policy_action("drain", node=hot), topic=topic))[0]
            assert drain.allocation == alloc.id and drain.data["outcome"] == "node to maintenance"
            assert await h.emulator_power(hot) == "On", "graceful power-off waits its grace"

            # After the 3s grace the BMC powers it off and the job gets a replacement.
            off = await job.wait_for(policy_action("power_off_graceful", node=hot), topic=topic)
            assert off[0].data["suppressed"] is None and off[0].data["dry_run"] is False
            assert "still active after 3s grace" in off[0].reason
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
