"""What ``dcgmi diag -j`` and ``nvbandwidth -j`` would print on a simulated node.

The NVML fake is the GPU of a simulated node; these stand in for the two
diagnostic tools a real node runs, reading the same simulated hardware, so
that a fault injected into the fake fails the check a real one would: a
pending or failed row remap fails DCGM's memory tests, a lost GPU fails its
deployment tests, a downed NVLink or a degraded fabric cuts the bandwidth
nvbandwidth measures. Their output has the tools' own JSON shapes, and Kiln
parses it with the same code as the real tools' (``agent/checks.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.nvml import fake_state as fs

if TYPE_CHECKING:
    from agent.nvml.fake import FakeNvml

DCGM_VERSION = "3.3.9 (simulated)"
# Nominal one-way rate of one NVLink: NVLink4 (H100, H200) and NVLink5 (GB200).
LINK_GBPS = {"h100": 25.0, "h200": 25.0, "gb200": 50.0}
COPY_EFFICIENCY = 0.87  # what a copy-engine read reaches of the links' nominal rate
# Seconds a simulated run takes when the suite does not say (DCGM's run levels).
RUN_SECONDS = {1: 1.0, 2: 4.0, 3: 10.0, 4: 20.0}


def _result(index: int, failure: str | None, error_id: int = 0) -> dict[str, Any]:
    if failure is None:
        return {"gpu_id": str(index), "status": "Pass"}
    return {
        "gpu_id": str(index),
        "status": "Fail",
        "warnings": [{"warning": failure, "error_id": error_id}],
    }


def _lost(g: fs.GpuState) -> str | None:
    if g.lost:
        return f"GPU {g.index} is lost: it fell off the bus (NVML_ERROR_GPU_IS_LOST)"
    return None


def _row_remap(g: fs.GpuState) -> str | None:
    if g.remap_failure:
        return f"GPU {g.index} had uncorrectable memory errors and row remapping failed"
    if g.remap_pending:
        return f"GPU {g.index} has a pending row remap: it needs a reset"
    return None


def _memory(g: fs.GpuState) -> str | None:
    if g.lost:
        return None  # reported by the deployment tests
    if g.remap_failure or g.remap_pending:
        return (
            f"GPU {g.index}: memory test found an uncorrectable error on a bad row "
            f"({g.remap_uncorrectable} rows remapped for uncorrectable errors)"
        )
    if g.dbe_volatile:
        return f"GPU {g.index}: {g.dbe_volatile} volatile double-bit ECC errors"
    return None


def _test(name: str, gpus: list[fs.GpuState], check: Any, error_id: int) -> dict[str, Any]:
    return {"name": name, "results": [_result(g.index, check(g), error_id) for g in gpus]}


def dcgm_diag(fake: FakeNvml, run: int) -> dict[str, Any]:
    """The JSON ``dcgmi diag -r RUN -j`` prints for this node's simulated GPUs."""
    with fake._lock:
        gpus = list(fake.gpus)
        categories: list[dict[str, Any]] = [
            {
                "category": "Deployment",
                "tests": [
                    {"name": "Denylist", "results": [{"status": "Pass"}]},
                    _test("NVML Library", gpus, _lost, 3),
                    {"name": "CUDA Main Library", "results": [{"status": "Pass"}]},
                    {"name": "Permissions and OS Blocks", "results": [{"status": "Pass"}]},
                    {"name": "Persistence Mode", "results": [{"status": "Pass"}]},
                    _test("Page Retirement/Row Remap", gpus, _row_remap, 36),
                ],
            }
        ]
        if run >= 2:
            categories.append({"category": "Integration", "tests": [_test("PCIe", gpus, _lost, 3)]})
            categories.append(
                {"category": "Hardware", "tests": [_test("GPU Memory", gpus, _memory, 24)]}
            )
        if run >= 3:
            categories.append(
                {
                    "category": "Stress",
                    "tests": [
                        _test("Targeted Stress", gpus, _lost, 3),
                        _test("Targeted Power", gpus, _lost, 3),
                        _test("Memory Bandwidth", gpus, _memory, 24),
                    ],
                }
            )
    return {"DCGM GPU Diagnostic": {"test_categories": categories, "version": DCGM_VERSION}}


def _gpu_gbps(fake: FakeNvml, g: fs.GpuState) -> float:
    if g.lost:
        return 0.0
    links = max(0, fake.part.nvlinks - len(g.nvlink_down))
    gbps = links * LINK_GBPS.get(fake.part.key, 25.0) * COPY_EFFICIENCY
    return gbps / 2 if g.fabric_degraded else gbps


def nvbandwidth(fake: FakeNvml, testcase: str) -> dict[str, Any]:
    """The JSON ``nvbandwidth -t TESTCASE -j`` prints: GPU(row) <- GPU(column)
    in GB/s, each pair as fast as the slower GPU's NVLinks allow."""
    with fake._lock:
        rates = [_gpu_gbps(fake, g) for g in fake.gpus]
    if len(rates) < 2:
        case: dict[str, Any] = {"name": testcase, "status": "Waived"}
    else:
        matrix = [
            ["N/A" if i == j else f"{min(a, b):.2f}" for j, b in enumerate(rates)]
            for i, a in enumerate(rates)
        ]
        values = [min(a, b) for i, a in enumerate(rates) for j, b in enumerate(rates) if i != j]
        case = {
            "name": testcase,
            "status": "Passed",
            "bandwidth_description": "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)",
            "bandwidth_matrix": matrix,
            "min": round(min(values), 2),
            "max": round(max(values), 2),
            "average": round(sum(values) / len(values), 2),
            "sum": round(sum(values), 2),
        }
    return {"nvbandwidth": {"git_version": "v0.7 (simulated)", "testcases": [case]}}
