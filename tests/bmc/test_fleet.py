"""Bulk operations over real emulators (power sync's bulk read: test_gateway.py)."""

from __future__ import annotations

import pytest
from bmc_peers import PASSWORD, USER, make_pool

from controller.bmc import (
    Bmc,
    BmcCredentials,
    BulkProgress,
    PowerAction,
    PowerState,
    RetryPolicy,
    parse_bmc_url,
    run_bulk,
)
from controller.sim.fault_proxy import FaultProxy
from controller.sim.ipmi_sim import IpmiSim
from controller.sim.redfish_emulator import RedfishEmulator, make_systems


async def test_broken_bmcs_do_not_slow_healthy_ones(
    credentials: BmcCredentials, closed_port: int
) -> None:
    async with RedfishEmulator(make_systems(10), username=USER, password=PASSWORD) as emu:
        async with FaultProxy(("127.0.0.1", emu.port), delay_s=30.0) as hanging:
            async with make_pool(
                call_timeout=1.5, retry=RetryPolicy(attempts=2, base_delay=0.05)
            ) as pool:
                broken: list[tuple[str, Bmc]] = []
                for i in range(3):  # answer never comes
                    url = f"redfish+http://127.0.0.1:{hanging.port}/redfish/v1/Systems/node-0000{i}"
                    broken.append(
                        (f"hung-{i}", pool.get(f"hung-{i}", parse_bmc_url(url), credentials))
                    )
                ghost = f"redfish+http://127.0.0.1:{closed_port}/redfish/v1/Systems/x"
                broken.append(("refused", pool.get("refused", parse_bmc_url(ghost), credentials)))
                healthy = [
                    (s.name, pool.get(s.name, parse_bmc_url(emu.system_url(s.name)), credentials))
                    for s in emu.systems
                ]
                order: list[str] = []

                def progress(p: BulkProgress) -> None:
                    order.append(p.last.node)

                async def read(bmc: Bmc) -> PowerState:
                    return await bmc.power.state()

                # Broken ones first: the worst case for a naive sequential loop.
                result = await run_bulk(broken + healthy, read, concurrency=8, progress=progress)
    assert sorted(result.succeeded) == sorted(n for n, _ in healthy)
    assert set(result.failed) == {"hung-0", "hung-1", "hung-2", "refused"}
    assert all(o.value is PowerState.OFF for o in result.outcomes.values() if o.ok)
    first_hung = min(order.index(f"hung-{i}") for i in range(3))
    last_healthy = max(order.index(n) for n, _ in healthy)
    assert last_healthy < first_hung, order
    assert "14/14" not in result.summary and "10/14 ok" in result.summary


async def test_bulk_power_on_over_ipmi_sims(credentials: BmcCredentials) -> None:
    sims = [IpmiSim(f"bmc{i}", USER, PASSWORD) for i in range(3)]
    for sim in sims:
        await sim.start()
    try:
        # The production retry policy: on a loaded machine pyghmi may drop a
        # session ("Session no longer connected"), which Kiln retries, and the
        # test pool's 0.05-0.2 s retries can all fall inside one stall.
        async with make_pool(retry=RetryPolicy()) as pool:
            targets = [
                (s.name, pool.get(s.name, parse_bmc_url(s.address), credentials)) for s in sims
            ]

            async def power_on(bmc: Bmc) -> PowerState:
                return await bmc.power.set(PowerAction.ON, timeout=20)

            result = await run_bulk(targets, power_on, concurrency=3)
            assert result.failed == {}
            assert [s.power_state() for s in sims] == ["on", "on", "on"]
    finally:
        for sim in sims:
            await sim.stop()


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_run_bulk_reports_every_node(concurrency: int, credentials: BmcCredentials) -> None:
    async with RedfishEmulator(make_systems(5), username=USER, password=PASSWORD) as emu:
        async with make_pool() as pool:
            targets = [
                (s.name, pool.get(s.name, parse_bmc_url(emu.system_url(s.name)), credentials))
                for s in emu.systems
            ]
            seen: list[int] = []

            async def read(bmc: Bmc) -> str:
                return (await bmc.power.state()).value

            result = await run_bulk(
                targets, read, concurrency=concurrency, progress=lambda p: seen.append(p.done)
            )
    assert seen == [1, 2, 3, 4, 5]
    assert {n: o.value for n, o in result.outcomes.items()} == {s.name: "off" for s in emu.systems}
