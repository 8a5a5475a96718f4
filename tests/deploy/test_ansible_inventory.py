"""``ansible/inventory/kiln_inventory.py`` against a real controller.

Three nodes are enrolled through gRPC with BMC URLs on a loopback port where
nothing listens (so every BMC call fails fast), in three racks; two of them
get an in-process agent on Kiln's fake NVML (a GB200 tray in an NVLink
domain, an HGX H200) so GPU and NVLink groups have members. The script runs
as a subprocess, exactly as Ansible runs it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from agent.client import Agent
from agent.nvml import open_backend
from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

SCRIPT = Path(__file__).resolve().parents[2] / "ansible" / "inventory" / "kiln_inventory.py"
SECRET = "inventory-test-secret-Xq9!"
USERNAME = "bmc-operator-name"
CLUSTER = "5d3c2a10-7e4f-4b8a-9c61-2f0e8d7b6a11"


@dataclass(frozen=True)
class Spec:
    name: str
    rack: str
    leaf: str
    spine: str
    nvml: str  # "" : no agent


SPECS = (
    Spec("gb200-r01-t01", "r01", "leaf-a", "spine-1", "fake:gb200"),
    Spec("h200-r02-n01", "r02", "leaf-b", "spine-1", "fake:h200"),
    Spec("h100-r03-n01", "r03", "leaf-c", "spine-2", ""),
)


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def inventory(controller: str, *args: str, timeout: str = "10") -> Run:
    env = {"KILN_CONTROLLER": controller, "KILN_INVENTORY_TIMEOUT": timeout, "PATH": "/usr/bin"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kiln_inventory", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Agents:
    """Fake-NVML agents on their own event loop in a background thread."""

    def __init__(self, controller: str) -> None:
        self.controller = controller
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.agents: list[Agent] = []
        self.tasks: list[Any] = []

    def start(self, specs: list[Spec]) -> None:
        self.thread.start()
        for s in specs:
            nvml = open_backend(s.nvml, node_name=s.name, cluster_uuid=CLUSTER, clique_id=1)
            agent = Agent(self.controller, s.name, nvml, backend=s.nvml, backoff=(0.1, 1.0))
            self.agents.append(agent)
            self.tasks.append(asyncio.run_coroutine_threadsafe(agent.run(), self.loop))

    def stop(self) -> None:
        for agent in self.agents:
            asyncio.run_coroutine_threadsafe(agent.stop(), self.loop).result(10)
        for task in self.tasks:
            task.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def fleet(controller_addr: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(controller address, {name: Node})`` once every agent has registered."""
    with grpc.insecure_channel(controller_addr) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        dead = free_port()
        for s in SPECS:
            stub.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name=s.name,
                    bmc_url=f"redfish+http://127.0.0.1:{dead}/redfish/v1/Systems/{s.name}",
                    username=USERNAME,
                    password=SECRET,
                    rack=s.rack,
                    leaf=s.leaf,
                    spine=s.spine,
                ),
                timeout=10,
            )
        agents = Agents(controller_addr)
        agents.start([s for s in SPECS if s.nvml])
        try:
            deadline = time.monotonic() + 20
            while True:
                nodes = {n.name: n for n in stub.ListNodes(fleet_pb2.ListNodesRequest()).nodes}
                if all(nodes[s.name].gpu_count > 0 for s in SPECS if s.nvml):
                    break
                assert time.monotonic() < deadline, "agents did not register"
                time.sleep(0.1)
            yield controller_addr, nodes
        finally:
            agents.stop()


def test_list_groups_nodes_by_rack_state_gpu_and_nvlink(fleet: tuple[str, dict[str, Any]]) -> None:
    controller, nodes = fleet
    run = inventory(controller, "--list")
    assert run.code == 0, run.err
    assert run.err == ""
    inv = json.loads(run.out)
    hostvars = inv["_meta"]["hostvars"]
    assert set(hostvars) == {s.name for s in SPECS}
    assert sorted(inv["kiln_nodes"]["hosts"]) == sorted(hostvars)

    assert inv["rack_r01"]["hosts"] == ["gb200-r01-t01"]
    assert inv["rack_r02"]["hosts"] == ["h200-r02-n01"]
    assert inv["rack_r03"]["hosts"] == ["h100-r03-n01"]
    assert inv["leaf_leaf_a"]["hosts"] == ["gb200-r01-t01"]
    assert sorted(inv["spine_spine_1"]["hosts"]) == ["gb200-r01-t01", "h200-r02-n01"]
    assert inv["gpu_gb200"]["hosts"] == ["gb200-r01-t01"]
    assert inv["gpu_h200"]["hosts"] == ["h200-r02-n01"]

    gb200 = nodes["gb200-r01-t01"]
    assert gb200.nvlink_domain.startswith(CLUSTER)
    domain_group = "nvlink_" + gb200.nvlink_domain.lower().replace("-", "_").replace(".", "_")
    assert inv[domain_group]["hosts"] == ["gb200-r01-t01"]
    assert not any(g.startswith("nvlink_") and g != domain_group for g in inv)

    # Each node sits in exactly the state group the controller reports for it.
    for name, node in nodes.items():
        state = types_pb2.NodeState.Name(node.state).removeprefix("NODE_STATE_").lower()
        assert hostvars[name]["state"] == state
        assert name in inv[f"state_{state}"]["hosts"]
    state_groups = [g for g in inv if g.startswith("state_")]
    assert sum(len(inv[g]["hosts"]) for g in state_groups) == len(SPECS)

    for group in inv:
        if group not in ("_meta", "all"):
            assert group in inv["all"]["children"]


def test_hostvars_carry_topology_and_gpus_never_credentials(
    fleet: tuple[str, dict[str, Any]],
) -> None:
    controller, nodes = fleet
    run = inventory(controller, "--list")
    assert run.code == 0, run.err
    hostvars = json.loads(run.out)["_meta"]["hostvars"]
    gb200 = hostvars["gb200-r01-t01"]
    assert gb200["rack"] == "r01"
    assert gb200["leaf"] == "leaf-a"
    assert gb200["spine"] == "spine-1"
    assert gb200["gpu_model"] == "GB200"
    assert gb200["gpu_count"] == nodes["gb200-r01-t01"].gpu_count == 4
    assert gb200["nvlink_domain"] == nodes["gb200-r01-t01"].nvlink_domain
    assert gb200["bmc_url"].startswith("redfish+http://127.0.0.1:")
    h200 = hostvars["h200-r02-n01"]
    assert (h200["gpu_model"], h200["gpu_count"], h200["nvlink_domain"]) == ("H200", 8, "")
    no_agent = hostvars["h100-r03-n01"]
    assert (no_agent["gpu_model"], no_agent["gpu_count"]) == ("", 0)

    assert SECRET not in run.out
    assert USERNAME not in run.out
    assert "password" not in run.out.lower()
    for hv in hostvars.values():
        assert not any("user" in key or "pass" in key for key in hv)


def test_host_prints_one_nodes_variables(fleet: tuple[str, dict[str, Any]]) -> None:
    controller, _ = fleet
    listed = json.loads(inventory(controller, "--list").out)["_meta"]["hostvars"]
    run = inventory(controller, "--host", "h200-r02-n01")
    assert run.code == 0, run.err
    host = json.loads(run.out)
    assert host["rack"] == "r02"
    assert host["gpu_model"] == "H200"
    assert set(host) == set(listed["h200-r02-n01"])
    assert SECRET not in run.out


def test_unknown_host_is_one_error_line(controller_addr: str) -> None:
    run = inventory(controller_addr, "--host", "ghost")
    assert run.code == 1
    assert run.out == ""
    assert run.err.startswith("kiln_inventory: error: NOT_FOUND: ")
    assert "ghost" in run.err
    assert run.err.count("\n") == 1


def test_empty_fleet_lists_no_hosts(controller_addr: str) -> None:
    run = inventory(controller_addr, "--list")
    assert run.code == 0, run.err
    inv = json.loads(run.out)
    assert inv["_meta"]["hostvars"] == {}
    assert inv["kiln_nodes"]["hosts"] == []


@pytest.mark.parametrize("mode", [["--list"], ["--host", "n1"]], ids=["list", "host"])
def test_unreachable_controller_is_one_clear_line(mode: list[str]) -> None:
    target = f"127.0.0.1:{free_port()}"
    run = inventory(target, *mode, timeout="5")
    assert run.code == 1
    assert run.out == ""
    assert run.err == f"kiln_inventory: error: cannot reach controller at {target} (UNAVAILABLE)\n"


@pytest.mark.parametrize("target", ["no-port", "host:", ":50051", "h:99999", "h:http"])
def test_malformed_controller_address_is_a_usage_error(target: str) -> None:
    run = inventory(target, "--list")
    assert run.code == 2
    assert run.out == ""
    assert run.err.startswith("kiln_inventory: error: KILN_CONTROLLER=")
    assert run.err.count("\n") == 1


def test_script_is_executable_and_needs_no_ansible() -> None:
    assert SCRIPT.stat().st_mode & 0o111
    assert SCRIPT.read_text(encoding="utf-8").startswith("#!/usr/bin/env python3\n")
    assert "import ansible" not in SCRIPT.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("rack", "r01", "rack_r01"),
        ("gpu", "H200", "gpu_h200"),
        ("state", "powered_off", "state_powered_off"),
        ("nvlink", "5D3C-aa.1", "nvlink_5d3c_aa_1"),
        ("leaf", "leaf a/2", "leaf_leaf_a_2"),
    ],
)
def test_group_names_are_valid_ansible_names(kind: str, value: str, expected: str) -> None:
    assert load_script().group_name(kind, value) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redfish://10.0.0.1/redfish/v1/Systems/1", "redfish://10.0.0.1/redfish/v1/Systems/1"),
        ("redfish://admin:pw@10.0.0.1:8443/r/v1", "redfish://10.0.0.1:8443/r/v1"),
        ("ipmi://root@10.0.0.2:623", "ipmi://10.0.0.2:623"),
    ],
    ids=["plain", "user-and-password", "user-only"],
)
def test_bmc_urls_lose_user_information(url: str, expected: str) -> None:
    assert load_script().redact_url(url) == expected
