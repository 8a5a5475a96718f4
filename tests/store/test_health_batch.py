"""The health write-behind's batch (``SqlNodes.save_health_batch``) on both
engines: reports and bare sightings of known nodes are written in one go,
a sighting keeps the stored report, and a node no longer stored is skipped."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from controller.core.health import GpuHealth, HealthReport, HealthSample
from controller.core.records import NodeRecord
from controller.store.sql_store import SqlStore, SqlTx

pytestmark = pytest.mark.timeout(60)


def report(temp: float) -> HealthReport:
    gpu = GpuHealth(index=0, uuid="GPU-0", temp_c=temp, xids=(79,), errors=("it's 100% ok",))
    return HealthReport(sampled_at=temp, gpus=(gpu,))


async def test_a_batch_writes_reports_and_sightings_of_known_nodes(engine: Engine) -> None:
    store = SqlStore(engine)
    names = [f"hb-{i:03d}" for i in range(350)]  # more than one statement carries
    try:

        def enrol(tx: SqlTx) -> None:
            for name in names:
                tx.nodes.add(
                    NodeRecord(name=name, bmc_url=f"redfish+http://127.0.0.1:9/{name}"), ""
                )

        await store.tx(enrol)
        first = [HealthSample.of(n, report(float(i)), 100.0 + i) for i, n in enumerate(names)]
        assert await store.tx(lambda tx: tx.nodes.save_health_batch(first)) == 350

        later = [
            HealthSample.of("hb-000", None, 900.0),  # a sighting: the report stays
            HealthSample.of("hb-001", report(55.5), 901.0),
            HealthSample.of("hb-gone", report(60.0), 902.0),  # not stored: skipped
            HealthSample.of("hb-gone-too", None, 903.0),
        ]
        assert await store.tx(lambda tx: tx.nodes.save_health_batch(later)) == 2

        def read(tx: SqlTx) -> dict[str, NodeRecord]:
            return {n.name: n for n in tx.nodes.find() if n.name.startswith("hb-")}

        stored = await store.read(read)
        assert set(stored) == set(names)
        assert stored["hb-000"].agent_last_seen == 900.0 and stored["hb-000"].health == report(0.0)
        assert stored["hb-001"].agent_last_seen == 901.0 and stored["hb-001"].health == report(55.5)
        assert stored["hb-349"].agent_last_seen == 449.0 and stored["hb-349"].health == report(
            349.0
        )
    finally:
        store.close()
