"""``kiln-agent`` as a real process: registers with a controller, serves
dcgm-exporter-named metrics, and stops cleanly on SIGTERM.

The node's BMC is a system on the sushy-tools emulator, so the controller can
inspect it (power it on) while the agent process supplies the GPUs.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controller.server import ControllerConfig, ControllerServer
from controller.sim.ports import free_port
from controller.sim.redfish_emulator import RedfishEmulator, SimSystem
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

NODE = "n1"
USERNAME = "kiln"
PASSWORD = "agent-process-test-secret"
SERIES = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
)
SAMPLE = re.compile(r"^(?P<name>\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def agent_command() -> list[str]:
    """The installed ``kiln-agent`` console script beside this interpreter, else the module."""
    script = Path(sys.executable).with_name("kiln-agent")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "agent.main"]


def scrape(url: str) -> str:
    """The metrics page, fetched with curl when installed (as an operator would)."""
    curl = shutil.which("curl")
    if curl:
        done = subprocess.run(
            [curl, "-s", "--max-time", "5", url], capture_output=True, text=True, check=False
        )
        return done.stdout
    with urllib.request.urlopen(url, timeout=5) as rsp:  # loopback only
        return str(rsp.read().decode())


def samples(page: str, name: str) -> list[dict[str, str]]:
    """Label sets of every sample of series ``name`` on a Prometheus text page."""
    out = []
    for line in page.splitlines():
        m = SAMPLE.match(line)
        if m and m["name"] == name:
            out.append(dict(LABEL.findall(m["labels"])) | {"value": m["value"]})
    return out


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[tuple[str, fleet_pb2_grpc.FleetServiceStub]]:
    """A controller with node n1 enrolled against an emulated BMC."""
    emulator = RedfishEmulator(
        [SimSystem(name=NODE, uuid="0b6c0f43-1d5e-4c8e-9f51-0a1d7e1c0001")],
        username=USERNAME,
        password=PASSWORD,
    )
    await emulator.start()
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0", state_dir=tmp_path, reconcile_interval=0.2, sample_interval=0.5
        )
    )
    try:
        address = await server.start()
        async with grpc.aio.insecure_channel(address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            await stub.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name=NODE,
                    bmc_url=emulator.system_url(NODE),
                    username=USERNAME,
                    password=PASSWORD,
                )
            )
            yield address, stub
    finally:
        await server.stop()
        await emulator.stop()


async def test_agent_process_registers_serves_metrics_and_stops_on_sigterm(
    controller: tuple[str, fleet_pb2_grpc.FleetServiceStub], tmp_path: Path
) -> None:
    address, stub = controller
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log_path = tmp_path / "agent.log"
    log_file = log_path.open("wb")  # a file, not a pipe: a full pipe would stall the agent
    proc = await asyncio.create_subprocess_exec(
        *agent_command(),
        "--controller",
        address,
        "--node-name",
        NODE,
        "--nvml",
        "fake:h200",
        "--metrics-port",
        str(port),
        stdout=log_file,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            node = await stub.GetNode(fleet_pb2.GetNodeRequest(name=NODE))
            if node.agent_connected and node.state == types_pb2.NODE_STATE_READY:
                break
            assert proc.returncode is None, "kiln-agent exited early"
            assert time.monotonic() < deadline, f"{node.state}: {node.state_reason}"
            await asyncio.sleep(0.2)
        assert node.gpu_count == 8 and node.gpu_model == "H200"
        assert [g.index for g in node.gpus] == list(range(8))
        uuids = {g.uuid for g in node.gpus}
        assert len(uuids) == 8 and all(u.startswith("GPU-") for u in uuids)

        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 15
        while True:  # health samples arrive every sample interval
            page = await asyncio.to_thread(scrape, url)
            if all(len(samples(page, s)) == 8 for s in SERIES):
                break
            assert time.monotonic() < deadline, page[-2000:]
            await asyncio.sleep(0.2)
        for series in SERIES:
            rows = samples(page, series)
            assert sorted(int(r["gpu"]) for r in rows) == list(range(8)), series
            assert {r["UUID"] for r in rows} == uuids, series
            assert {r["modelName"] for r in rows} == {"NVIDIA H200"}, series
            assert {r["Hostname"] for r in rows} == {NODE}, series
        temps = [float(r["value"]) for r in samples(page, "DCGM_FI_DEV_GPU_TEMP")]
        assert all(10 < t < 90 for t in temps), temps
        limits = {float(r["value"]) for r in samples(page, "DCGM_FI_DEV_POWER_MGMT_LIMIT")}
        assert limits == {700.0}, "prepared to driver defaults"

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        output = log_path.read_text(errors="replace")
        assert "registered with controller" in output
        assert "Traceback" not in output, output[-3000:]
        assert PASSWORD not in output
        deadline = time.monotonic() + 10
        while (await stub.GetNode(fleet_pb2.GetNodeRequest(name=NODE))).agent_connected:
            assert time.monotonic() < deadline, "the controller still sees the agent"
            await asyncio.sleep(0.2)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log_file.close()
