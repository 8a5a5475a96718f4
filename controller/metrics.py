"""The controller's Prometheus metrics (``/metrics`` on ``--http-listen``).

Two kinds of series, on one private registry per controller (no global
state: several controllers may run in one process):

- what the core and the BMC layer count as they work, through the core's
  ``Meter`` port (``PrometheusMeter``): scheduling passes, admissions,
  policy actions, health reports, power-sync passes, BMC calls;
- what is true now, read when Prometheus scrapes (``FleetGauges.refresh``):
  nodes by state and rack, agents connected, open allocations by state and
  queue and how long the oldest has waited, BMC breakers by state, the BMC
  worker threads allowed to run per protocol, the events outbox, the
  interval agents are told to report at, the store's writing thread.

The names and what each means are in ``docs/monitoring/README.md``.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.core.fleet import Fleet
from controller.core.states import OPEN, AllocationState, NodeState

# Seconds: from a BMC answering a read (~50 ms) to a power change (minutes).
BMC_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
PLACEMENT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
WAIT_BUCKETS = (0.01, 0.1, 1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
PASS_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
GC_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class PrometheusMeter:
    """The core's ``Meter`` port as Prometheus counters and histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.placement_seconds = Histogram(
            "kiln_placement_seconds",
            "One scheduling pass: read, place, book.",
            buckets=PLACEMENT_BUCKETS,
            registry=registry,
        )
        self.wait_seconds = Histogram(
            "kiln_allocation_wait_seconds",
            "Time from an allocation's request to its admission.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.policy_actions = Counter(
            "kiln_policy_actions",
            "Health policy actions by rule, action and outcome "
            "(executed, dry_run, capped, failed).",
            ("rule", "action", "outcome"),
            registry=registry,
        )
        self.gc_pause_seconds = Histogram(
            "kiln_gc_pause_seconds",
            "The garbage collector's pauses of the controller, by generation (2: the whole heap).",
            ("generation",),
            buckets=GC_BUCKETS,
            registry=registry,
        )
        self.health_reports = Counter(
            "kiln_health_reports", "Agent health reports taken in.", registry=registry
        )
        self.power_sync_seconds = Histogram(
            "kiln_power_sync_pass_seconds",
            "One power-sync pass over every BMC.",
            buckets=PASS_BUCKETS,
            registry=registry,
        )
        self.power_sync_rows = Gauge(
            "kiln_power_sync_rows_written",
            "Nodes whose power or BMC health the last power-sync pass changed.",
            registry=registry,
        )
        self.bmc_seconds = Histogram(
            "kiln_bmc_call_seconds",
            "BMC calls (with their retries) by protocol and operation.",
            ("protocol", "operation"),
            buckets=BMC_BUCKETS,
            registry=registry,
        )
        self.bmc_failures = Counter(
            "kiln_bmc_call_failures",
            "BMC calls that failed after their retries, by protocol and operation.",
            ("protocol", "operation"),
            registry=registry,
        )

    def placement(self, seconds: float) -> None:
        self.placement_seconds.observe(seconds)

    def admitted(self, waited_seconds: float) -> None:
        self.wait_seconds.observe(waited_seconds)

    def policy_action(self, rule: str, action: str, outcome: str) -> None:
        self.policy_actions.labels(rule, action, outcome).inc()

    def gc_pause(self, generation: int, seconds: float) -> None:
        self.gc_pause_seconds.labels(str(generation)).observe(seconds)

    def health_report(self) -> None:
        self.health_reports.inc()

    def power_sync_pass(self, seconds: float, rows_written: int) -> None:
        self.power_sync_seconds.observe(seconds)
        self.power_sync_rows.set(rows_written)

    def bmc_call(self, protocol: str, operation: str, seconds: float, ok: bool) -> None:
        self.bmc_seconds.labels(protocol or "unknown", operation).observe(seconds)
        if not ok:
            self.bmc_failures.labels(protocol or "unknown", operation).inc()


class NodeCounts(Collector):
    """``kiln_nodes``: nodes by lifecycle state and rack, as last counted.

    A family built at each scrape from a tally, not a labelled ``Gauge``:
    a fleet of 1,400 racks made a child series per (state, rack) at every
    scrape, cleared and labelled again (tens of milliseconds of the event
    loop, every call and report waiting). Every state is shown, with rack
    "" and 0 where no node is in it."""

    NAME = "kiln_nodes"
    HELP = "Nodes by lifecycle state and rack."

    def __init__(self) -> None:
        self._counts: Mapping[tuple[NodeState, str], int] = {}

    def count(self, counts: Mapping[tuple[NodeState, str], int]) -> None:
        self._counts = counts

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=("state", "rack"))
        counts = self._counts
        for node_state in NodeState:
            if (node_state, "") not in counts:
                family.add_metric((node_state.value, ""), 0)
        for (node_state, rack), count in counts.items():
            family.add_metric((node_state.value, rack), count)
        return [family]


class FleetGauges:
    """The series that say what is true now, refreshed at each scrape."""

    def __init__(
        self,
        registry: CollectorRegistry,
        fleet: Fleet,
        *,
        breakers: Callable[[], Mapping[str, int]] | None = None,
        bmc_threads: Callable[[], Mapping[str, int]] | None = None,
        outbox: Callable[[], Awaitable[tuple[int, float | None]]] | None = None,
        relays: Callable[[], Mapping[str, int]] | None = None,
        bmc_readers: Callable[[], Mapping[str, int]] | None = None,
        store_writer: Callable[[], Mapping[str, float]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fleet = fleet
        self._store_writer = store_writer
        self._relays = relays
        self._bmc_readers = bmc_readers
        self._breakers = breakers
        self._bmc_threads = bmc_threads
        self._outbox = outbox
        self._clock = clock
        self.nodes = NodeCounts()
        registry.register(self.nodes)
        self.agents = Gauge(
            "kiln_agents_connected", "Agents with an open stream.", registry=registry
        )
        self.allocations = Gauge(
            "kiln_allocations",
            "Open allocations by state and queue.",
            ("state", "queue"),
            registry=registry,
        )
        self.oldest_pending = Gauge(
            "kiln_allocation_oldest_pending_seconds",
            "How long the oldest pending allocation of each queue has waited.",
            ("queue",),
            registry=registry,
        )
        self.breaker_states = Gauge(
            "kiln_bmc_breakers", "BMC circuit breakers by state.", ("state",), registry=registry
        )
        self.bmc_threads = Gauge(
            "kiln_bmc_threads_allowed",
            "BMC worker threads that may run at once, per protocol (fewer while their "
            "results reach a late event loop).",
            ("protocol",),
            registry=registry,
        )
        self.outbox_pending = Gauge(
            "kiln_events_outbox_pending",
            "Events recorded but not yet published to MQTT.",
            registry=registry,
        )
        self.outbox_lag = Gauge(
            "kiln_events_outbox_lag_seconds",
            "Age of the oldest event not yet published to MQTT (0: none waiting).",
            registry=registry,
        )
        self.report_interval = Gauge(
            "kiln_agent_report_interval_seconds",
            "The report interval agents are told now; above --sample-interval when "
            "the controller slows agents down (--max-health-reports-per-second, or "
            "its event loop's lag).",
            registry=registry,
        )
        self.loop_lag = Gauge(
            "kiln_controller_loop_lag_seconds",
            "How late the controller's event loop ran a short timer, median over the "
            "last window: above 0.1 s the agents are asked to report less often.",
            registry=registry,
        )
        self.report_delay = Gauge(
            "kiln_health_report_delay_seconds",
            "How much later than its agent's quickest the median health report reached "
            "the controller over the last window: above 0.1 s the agents are asked to "
            "report less often.",
            registry=registry,
        )
        self.write_behind = Gauge(
            "kiln_health_write_behind_pending",
            "Health samples held in memory and not yet written to the database.",
            registry=registry,
        )
        self.bmc_readers = Gauge(
            "kiln_bmc_readers",
            "BMC reader processes up (--bmc-readers): they do the power sync's, the leak "
            "watcher's and the thermal poll's BMC reads.",
            registry=registry,
        )
        self.bmc_reader_calls = Gauge(
            "kiln_bmc_reader_calls_in_flight",
            "Reads sent to the BMC reader processes and not yet answered.",
            registry=registry,
        )
        self.bmc_reader_restarts = Gauge(
            "kiln_bmc_reader_restarts",
            "BMC reader processes started again since the controller started (one ended).",
            registry=registry,
        )
        self.store_busy = Gauge(
            "kiln_store_write_busy_seconds",
            "Seconds the store's writing thread has spent running groups since the "
            "controller started (its rate: the share of that one thread's time busy).",
            registry=registry,
        )
        self.store_groups = Gauge(
            "kiln_store_write_groups",
            "Groups of write transactions the store's writing thread has run "
            "since the controller started.",
            registry=registry,
        )
        self.store_units = Gauge(
            "kiln_store_write_units",
            "Units of work (one caller's transaction each) run in those groups.",
            registry=registry,
        )
        self.store_queued = Gauge(
            "kiln_store_writes_queued",
            "Units of work waiting for the store's writing thread now.",
            registry=registry,
        )
        self.relay_workers = Gauge(
            "kiln_agent_relay_workers",
            "Agent relay worker processes running (--agent-relays).",
            registry=registry,
        )
        self.relay_calls = Gauge(
            "kiln_agent_relay_calls",
            "Calls open through the relay workers (agent streams and FleetService calls).",
            registry=registry,
        )
        self.relay_restarts = Gauge(
            "kiln_agent_relay_restarts",
            "Relay workers started again since the controller started (one died).",
            registry=registry,
        )
        self.relay_backlog = Gauge(
            "kiln_agent_relay_backlog",
            "Messages relayed to the controller and not yet taken up by their calls.",
            registry=registry,
        )

    async def refresh(self) -> None:
        fleet = self._fleet
        now = self._clock()
        self.nodes.count(Tally((node.state, node.rack) for node in await fleet.nodes.records()))
        self.agents.set(fleet.agents.count())
        allocations = await fleet.allocations.query()
        counts: Tally[tuple[str, str]] = Tally()
        oldest: dict[str, float] = {}
        for a in allocations:
            queue = a.spec.queue or "default"
            counts[(a.state.value, queue)] += 1
            if a.state == AllocationState.PENDING:
                oldest[queue] = max(oldest.get(queue, 0.0), now - a.created_at)
        self.allocations.clear()
        for open_state in OPEN:
            self.allocations.labels(open_state.value, "default")
        for (state, queue), count in counts.items():
            self.allocations.labels(state, queue).set(count)
        self.oldest_pending.clear()
        self.oldest_pending.labels("default")
        for queue, seconds in oldest.items():
            self.oldest_pending.labels(queue).set(seconds)
        if self._breakers is not None:
            for state, count in self._breakers().items():
                self.breaker_states.labels(state).set(count)
        if self._bmc_threads is not None:
            for protocol, allowed in self._bmc_threads().items():
                self.bmc_threads.labels(protocol).set(allowed)
        if self._outbox is not None:
            pending, oldest_at = await self._outbox()
            self.outbox_pending.set(pending)
            self.outbox_lag.set(max(0.0, now - oldest_at) if oldest_at is not None else 0.0)
        self.report_interval.set(fleet.report_interval)
        self.loop_lag.set(fleet.pace.lag)
        self.report_delay.set(fleet.pace.report_delay)
        self.write_behind.set(fleet.live.pending)
        writer = self._store_writer() if self._store_writer is not None else {}
        self.store_busy.set(writer.get("busy_seconds", 0.0))
        self.store_groups.set(writer.get("groups", 0))
        self.store_units.set(writer.get("units", 0))
        self.store_queued.set(writer.get("queued", 0))
        relays = self._relays() if self._relays is not None else {}
        self.relay_workers.set(relays.get("workers", 0))
        self.relay_calls.set(relays.get("calls", 0))
        self.relay_restarts.set(relays.get("restarts", 0))
        self.relay_backlog.set(relays.get("backlog", 0))
        readers = self._bmc_readers() if self._bmc_readers is not None else {}
        self.bmc_readers.set(readers.get("readers", 0))
        self.bmc_reader_calls.set(readers.get("in_flight", 0))
        self.bmc_reader_restarts.set(readers.get("restarts", 0))


class ControllerMetrics:
    """The registry, the meter the core counts through, and the gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.meter = PrometheusMeter(self.registry)
        self.gauges: FleetGauges | None = None

    def watch(
        self,
        fleet: Fleet,
        *,
        breakers: Callable[[], Mapping[str, int]] | None = None,
        bmc_threads: Callable[[], Mapping[str, int]] | None = None,
        outbox: Callable[[], Awaitable[tuple[int, float | None]]] | None = None,
        relays: Callable[[], Mapping[str, int]] | None = None,
        bmc_readers: Callable[[], Mapping[str, int]] | None = None,
        store_writer: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.gauges = FleetGauges(
            self.registry,
            fleet,
            breakers=breakers,
            bmc_threads=bmc_threads,
            outbox=outbox,
            relays=relays,
            bmc_readers=bmc_readers,
            store_writer=store_writer,
        )

    async def exposition(self) -> bytes:
        """The text format Prometheus scrapes, gauges refreshed first."""
        if self.gauges is not None:
            await self.gauges.refresh()
        return generate_latest(self.registry)
