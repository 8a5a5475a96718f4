"""Prometheus endpoint: dcgm-exporter series per GPU over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from agent.gpu_inventory import read_inventory
from agent.health import HealthSampler
from agent.metrics import DCGM_SERIES, AgentMetrics
from agent.nvml import FakeNvml


def _fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _samples(text: str) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.labels.get("xid", "") if s.name == "kiln_gpu_xid_total" else ""
            out[(s.name, s.labels.get("gpu", "") + ":" + key)] = (s.labels, s.value)
    return out


async def test_every_dcgm_series_per_gpu_over_http(h200: FakeNvml) -> None:
    sampler = HealthSampler(h200)
    metrics = AgentMetrics("node-a")
    inventory = await asyncio.to_thread(read_inventory, h200)
    metrics.update(inventory, await sampler.asample())
    port = await metrics.start("127.0.0.1", 0)
    try:
        assert port > 0
        h200.faults.xid(2, 62)
        h200.faults.xid(2, 62)
        h200.faults.xid(2, 13)
        h200.faults.heat(0, 88, rate_c_per_s=1e6)
        metrics.update_health(await sampler.asample())
        samples = _samples(await asyncio.to_thread(_fetch, port))
    finally:
        await metrics.stop()
    for gpu in inventory.gpus:
        for name in DCGM_SERIES:
            labels, _ = samples[(name, f"{gpu.index}:")]
            assert labels == {
                "gpu": str(gpu.index),
                "UUID": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                "device": f"nvidia{gpu.index}",
                "modelName": "NVIDIA H200",
                "Hostname": "node-a",
            }
    assert samples[("DCGM_FI_DEV_GPU_TEMP", "0:")][1] == 88
    assert samples[("DCGM_FI_DEV_POWER_MGMT_LIMIT", "1:")][1] == 700
    assert samples[("DCGM_FI_DEV_XID_ERRORS", "2:")][1] == 13  # the last XID
    assert samples[("DCGM_FI_DEV_XID_ERRORS", "3:")][1] == 0
    assert samples[("kiln_gpu_xid_total", "2:62")][1] == 2
    assert samples[("kiln_gpu_xid_total", "2:13")][1] == 1
    assert samples[("DCGM_FI_DEV_SHUTDOWN_TEMP", "4:")][1] == 92


async def test_missing_readings_drop_series_and_stop_is_idempotent(h200: FakeNvml) -> None:
    sampler = HealthSampler(h200)
    metrics = AgentMetrics("node-b")
    metrics.update(read_inventory(h200), sampler.sample())
    profile_rows = b"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{"
    assert profile_rows in metrics.render()
    h = h200.nvmlDeviceGetHandleByIndex(0)
    h200.nvmlDeviceSetMigMode(h, 1)
    h200.nvmlDeviceCreateGpuInstance(h, 0)  # remapped rows: Not Supported under MIG
    h200.faults.fall_off_bus(1)
    metrics.update_health(sampler.sample())
    text = metrics.render().decode()
    rows = [
        line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_CORRECTABLE_REMAPPED")
    ]
    assert not any('gpu="0"' in line or 'gpu="1"' in line for line in rows)
    assert len(rows) == 6
    assert "DCGM_FI_DEV_XID_ERRORS{" in text and "kiln_gpu_xid_total{" in text
    await metrics.stop()
    port = await metrics.start("127.0.0.1", 0)
    await metrics.stop()
    await metrics.stop()
    assert port > 0
