"""The controller's /metrics on a running simulated fleet (real peers: the
sushy-tools emulator as the BMCs, agents on the NVML fake).

Each metric family the monitoring docs name is present, and the values say
what happened: nodes ready by rack, agents connected, an admitted allocation,
a scheduling pass and the wait before admission, Redfish calls, closed
breakers, power-sync passes, health reports. Nothing in it is a secret.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from fleet_waits import enroll_sim_fleet, wait_all_ready, wait_allocation
from prometheus_client.parser import text_string_to_metric_families

from controller.server import ControllerConfig, ControllerServer, ListenError
from controller.sim.fleet import SIM_PASSWORD, SimFleet, default_fleet
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

FAMILIES = (
    "kiln_nodes",
    "kiln_agents_connected",
    "kiln_allocations",
    "kiln_allocation_oldest_pending_seconds",
    "kiln_allocation_wait_seconds",
    "kiln_placement_seconds",
    "kiln_bmc_call_seconds",
    "kiln_bmc_call_failures",
    "kiln_bmc_breakers",
    "kiln_bmc_threads_allowed",
    "kiln_power_sync_pass_seconds",
    "kiln_power_sync_rows_written",
    "kiln_policy_actions",
    "kiln_events_outbox_pending",
    "kiln_events_outbox_lag_seconds",
    "kiln_health_reports",
    "kiln_agent_report_interval_seconds",
    "kiln_controller_loop_lag_seconds",
    "kiln_health_report_delay_seconds",
    "kiln_health_write_behind_pending",
    "kiln_agent_relay_workers",
    "kiln_agent_relay_calls",
    "kiln_agent_relay_restarts",
    "kiln_agent_relay_backlog",
    "kiln_bmc_readers",
    "kiln_bmc_reader_calls_in_flight",
    "kiln_bmc_reader_restarts",
    "kiln_gc_pause_seconds",
    "kiln_store_write_busy_seconds",
    "kiln_store_write_groups",
    "kiln_store_write_units",
    "kiln_store_writes_queued",
)

Samples = dict[str, list[tuple[dict[str, str], float]]]


async def scrape(address: str) -> tuple[set[str], Samples, str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{address}/metrics") as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("text/plain")
            text = await reply.text()
    families: set[str] = set()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return families, samples, text


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for got, value in samples.get(name, [])
        if all(got.get(k) == v for k, v in labels.items())
    )


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[ControllerServer, SimFleet]]:
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            reconcile_interval=0.2,
            sample_interval=0.5,
            power_sync_interval=0.5,
            http_listen="127.0.0.1:0",
        )
    )
    address = await server.start()
    fleet = SimFleet(default_fleet(nvl72_racks=0, hgx_nodes=3), watch_interval=0.3)
    await fleet.start(address)
    try:
        yield server, fleet
    finally:
        await fleet.stop()
        await server.stop()


@pytest.mark.timeout(120)
async def test_metrics_show_the_fleet_and_what_it_did(
    running: tuple[ControllerServer, SimFleet],
) -> None:
    server, fleet = running
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        await enroll_sim_fleet(stub, fleet)
        nodes = await wait_all_ready(stub, 60.0)
        created = await stub.CreateAllocation(
            fleet_pb2.CreateAllocationRequest(key="m1", spec=fleet_pb2.AllocationSpec(nodes=1))
        )
        await wait_allocation(stub, created.id, fleet_pb2.ALLOCATION_STATE_READY, 20.0)
        await asyncio.sleep(1.5)  # a power-sync pass and a few health reports
        families, samples, text = await scrape(server.http_address)

    missing = [f for f in FAMILIES if f not in families]
    assert not missing, f"families missing from /metrics: {missing}"
    racks = {n.rack for n in nodes}
    assert total(samples, "kiln_nodes") == len(nodes)
    assert total(samples, "kiln_nodes", state="allocated") == 1
    for rack in racks:
        assert total(samples, "kiln_nodes", rack=rack) == sum(1 for n in nodes if n.rack == rack)
    assert total(samples, "kiln_agents_connected") == len(nodes)
    assert total(samples, "kiln_allocations", state="ready") == 1
    assert total(samples, "kiln_allocations", state="pending") == 0
    assert total(samples, "kiln_placement_seconds_count") >= 1
    assert total(samples, "kiln_allocation_wait_seconds_count") == 1
    assert total(samples, "kiln_bmc_call_seconds_count", protocol="redfish") > 0
    assert total(samples, "kiln_bmc_breakers", state="closed") >= len(nodes)
    assert total(samples, "kiln_bmc_breakers", state="open") == 0
    # An idle test fleet keeps the loop on time: every Redfish thread may run.
    assert total(samples, "kiln_bmc_threads_allowed", protocol="redfish") == 256
    assert total(samples, "kiln_power_sync_pass_seconds_count") >= 1
    assert total(samples, "kiln_health_reports_total") > 0
    assert total(samples, "kiln_agent_report_interval_seconds") == 0.5
    assert 0 <= total(samples, "kiln_controller_loop_lag_seconds") < 1.0
    assert 0 <= total(samples, "kiln_health_report_delay_seconds") < 1.0
    # Enrolment, the lifecycle and the allocation all wrote through the store.
    groups = total(samples, "kiln_store_write_groups")
    assert groups > 0
    assert total(samples, "kiln_store_write_units") >= groups
    assert total(samples, "kiln_store_write_busy_seconds") > 0
    assert total(samples, "kiln_store_writes_queued") >= 0
    assert SIM_PASSWORD not in text


@pytest.mark.timeout(60)
async def test_an_http_address_in_use_is_refused_before_serving(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ControllerServer(
            ControllerConfig(
                listen="127.0.0.1:0", state_dir=tmp_path, http_listen=f"127.0.0.1:{port}"
            )
        )
        try:
            with pytest.raises(ListenError, match=f"127.0.0.1:{port}"):
                await server.start()
        finally:
            await server.stop()
