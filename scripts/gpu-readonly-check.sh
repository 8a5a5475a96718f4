#!/usr/bin/env bash
# Read-only check of the agent's NVML layer on a real GPU machine.
#
# Runs the read-only NVML contract suite against real NVML (and the fakes),
# then prints a short nvidia-smi-like summary. It only reads: it never changes
# clocks, power limits, persistence, MIG or ECC, and never resets a GPU.
#
# Usage: scripts/gpu-readonly-check.sh   (from anywhere inside the repository)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

"$PYTHON" -m pytest tests/agent/test_nvml_readonly_contract.py -v -rs

"$PYTHON" - <<'PY'
"""nvidia-smi-like summary using read calls only."""
import pynvml

from agent.gpu_inventory import read_inventory
from agent.health import HealthSampler
from agent.nvml import RealNvml

nvml = RealNvml()
try:
    nvml.nvmlInit()
except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as e:
    print(f"no NVIDIA driver here ({e}); summary skipped")
    raise SystemExit(0)
try:
    inv = read_inventory(nvml)
    health = HealthSampler(nvml).sample()
    print(f"driver {inv.driver_version}, {len(inv.gpus)} GPU(s)")
    print(f"{'GPU':>3}  {'name':<24} {'bus id':<17} {'temp':>5} {'power/limit W':>14} "
          f"{'SM MHz':>6} {'MIG':>4} {'DBE':>4}  clique")
    for ident, g in zip(inv.gpus, health.gpus):
        h = nvml.nvmlDeviceGetHandleByIndex(ident.index)
        try:
            mig = "on" if nvml.nvmlDeviceGetMigMode(h)[0] else "off"
        except pynvml.NVMLError:
            mig = "n/a"
        temp = "-" if g.temp_c is None else f"{g.temp_c:.0f}C"
        power = "-" if g.power_w is None else f"{g.power_w:.0f}/{g.power_limit_w or 0:.0f}"
        print(f"{ident.index:>3}  {ident.name[:24]:<24} {ident.pci_bus_id:<17} {temp:>5} "
              f"{power:>14} {g.sm_clock_mhz or 0:>6} {mig:>4} {g.ecc_dbe_volatile:>4}  "
              f"{ident.clique or '-'}")
        for err in g.errors:
            print(f"       note: {err}")
finally:
    nvml.nvmlShutdown()
PY
