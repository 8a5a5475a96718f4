"""Prometheus metrics for one agent, named like NVIDIA's dcgm-exporter.

Dashboards built for dcgm-exporter work unchanged: the same series names and
labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname``). ``DCGM_FI_DEV_XID_ERRORS`` holds the last XID, as dcgm-exporter
does; because that gauge never shows repeats, ``kiln_gpu_xid_total`` counts
every XID by code. A reading that is missing (None) removes its series rather
than exporting an invented value.

Each :class:`AgentMetrics` owns its registry (no global state), so several
agents can run in one process. The HTTP endpoint runs in prometheus_client's
own server thread; ``start``/``stop`` never block the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from agent.gpu_inventory import GpuIdentity, NodeInventory
from agent.health import GpuHealth, NodeHealth

__all__ = ["DCGM_SERIES", "AgentMetrics"]

log = logging.getLogger(__name__)

_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")

# series name -> (help, GpuHealth attribute or None for derived)
DCGM_SERIES: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", "temp_c"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("Memory temperature (in C).", "mem_temp_c"),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", "power_w"),
    "DCGM_FI_DEV_SM_CLOCK": ("SM clock frequency (in MHz).", "sm_clock_mhz"),
    "DCGM_FI_DEV_MEM_CLOCK": ("Memory clock frequency (in MHz).", "mem_clock_mhz"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("Total single-bit volatile ECC errors.", "ecc_sbe_volatile"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("Total double-bit volatile ECC errors.", "ecc_dbe_volatile"),
    "DCGM_FI_DEV_XID_ERRORS": ("Value of the last XID error encountered.", "xids"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": (
        "Current clock event (throttle) reasons bitmask.",
        "clock_event_reasons",
    ),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "Number of remapped rows for uncorrectable errors.",
        "remap_uncorrectable",
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (
        "Number of remapped rows for correctable errors.",
        "remap_correctable",
    ),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("Whether remapping of rows has failed.", "remap_failure"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("Power management limit (in W).", "power_limit_w"),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": ("Slowdown temperature threshold (in C).", "slowdown_c"),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": ("Shutdown temperature threshold (in C).", "shutdown_c"),
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": ("Recovery action the driver asks for.", "recovery_action"),
}


class AgentMetrics:
    """dcgm-exporter-style metrics for one node, on a private registry. Thread-safe."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._gauges = {
            name: Gauge(name, help_text, _LABELS, registry=self.registry)
            for name, (help_text, _) in DCGM_SERIES.items()
        }
        self._xid_total = Counter(
            "kiln_gpu_xid",
            "XID errors seen, by code (DCGM_FI_DEV_XID_ERRORS only shows the last).",
            (*_LABELS, "xid"),
            registry=self.registry,
        )
        self._identity: dict[int, GpuIdentity] = {}
        self._last_xid: dict[str, int] = {}
        self._labels: dict[int, tuple[str, ...]] = {}
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"AgentMetrics(hostname={self.hostname!r})"

    # -- updates -----------------------------------------------------------------
    def update_inventory(self, inventory: NodeInventory) -> None:
        """Remember GPU identities (model name, PCI bus id) for the labels."""
        with self._lock:
            self._identity = {g.index: g for g in inventory.gpus}

    def update(self, inventory: NodeInventory, health: NodeHealth) -> None:
        """Refresh every series from an inventory and a health sample."""
        self.update_inventory(inventory)
        self.update_health(health)

    def update_health(self, health: NodeHealth) -> None:
        """Refresh every series from a health sample (identity from the last inventory)."""
        with self._lock:
            for gpu in health.gpus:
                self._update_gpu(gpu)

    def _labels_for(self, gpu: GpuHealth) -> tuple[str, ...]:
        ident = self._identity.get(gpu.index)
        return (
            str(gpu.index),
            gpu.uuid or (ident.uuid if ident else ""),
            ident.pci_bus_id if ident else "",
            f"nvidia{gpu.index}",
            ident.name if ident else "",
            self.hostname,
        )

    def _update_gpu(self, gpu: GpuHealth) -> None:
        labels = self._labels_for(gpu)
        old = self._labels.get(gpu.index)
        if old is not None and old != labels:
            for gauge in self._gauges.values():
                self._remove(gauge, old)
        self._labels[gpu.index] = labels
        key = labels[1] or labels[0]
        for xid in gpu.xids:
            self._xid_total.labels(*labels, str(xid)).inc()
            self._last_xid[key] = xid
        for name, (_, attr) in DCGM_SERIES.items():
            gauge = self._gauges[name]
            value: Any = self._last_xid.get(key, 0) if attr == "xids" else getattr(gpu, attr)
            if value is None or (gpu.lost and attr != "xids"):
                self._remove(gauge, labels)
            else:
                gauge.labels(*labels).set(float(value))

    @staticmethod
    def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return bytes(generate_latest(self.registry))

    # -- HTTP endpoint -------------------------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on host:port (0 = any free port); returns the bound port."""
        if self._server is not None:
            raise RuntimeError("metrics endpoint already started")
        server, thread = await asyncio.to_thread(
            start_http_server, port, addr=host, registry=self.registry
        )
        self._server, self._thread = server, thread
        bound = int(server.server_address[1])
        log.info("metrics for %s on %s:%s", self.hostname, host, bound)
        return bound

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is None:
            return

        def _shutdown() -> None:
            server.shutdown()
            server.server_close()
            if thread is not None:
                thread.join(timeout=5)

        await asyncio.to_thread(_shutdown)
