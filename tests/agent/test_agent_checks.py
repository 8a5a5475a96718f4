"""The agent runs a check of the suite: DCGM diagnostics and nvbandwidth on
the simulated GPUs (failing where an injected fault would fail the real
tool), real commands with figures read from their output, timeouts, and
tools that are not installed."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from agent.checks import parse_dcgm_diag, parse_nvbandwidth, run_check
from agent.nvml import FakeNvml, open_backend
from controller.checks import judge, load_default_suite

FAST = 0.01  # seconds a simulated run takes here


@pytest.fixture
def h200() -> Iterator[FakeNvml]:
    nvml = open_backend("fake:h200", node_name="gpu-a")
    assert isinstance(nvml, FakeNvml)
    nvml.nvmlInit()
    yield nvml
    nvml.nvmlShutdown()


def diag(run: int) -> dict[str, object]:
    return {"name": f"dcgm-r{run}", "kind": "dcgm_diag", "run": run, "simulated_s": FAST}


@pytest.mark.timeout(30)
async def test_healthy_gpus_pass_every_dcgm_run_level(h200: FakeNvml) -> None:
    for run in (1, 2, 3):
        result = await run_check(diag(run), h200, gpus=8)
        assert result.ok, result.failures
        tests = result.figures["tests"]
        assert tests["Page Retirement/Row Remap"] == "Pass"
        assert ("GPU Memory" in tests) == (run >= 2)
        assert ("Targeted Stress" in tests) == (run >= 3)
        assert result.duration_s >= FAST


@pytest.mark.timeout(30)
async def test_a_bad_memory_row_fails_the_memory_tests_with_dcgms_words(h200: FakeNvml) -> None:
    h200.faults.apply_fault({"kind": "row_remap", "gpu": 3, "pending": True, "uncorrectable": 1})
    quick = await run_check(diag(1), h200, gpus=8)
    assert not quick.ok
    assert quick.failures == [
        "Page Retirement/Row Remap: GPU 3 has a pending row remap: it needs a reset"
    ]
    medium = await run_check(diag(2), h200, gpus=8)
    assert not medium.ok
    assert any(f.startswith("GPU Memory: GPU 3: memory test found") for f in medium.failures)
    assert medium.figures["tests"]["GPU Memory"] == "Fail"
    assert medium.figures["tests"]["PCIe"] == "Pass"  # the other GPUs' tests still ran


@pytest.mark.timeout(30)
async def test_a_lost_gpu_fails_deployment(h200: FakeNvml) -> None:
    h200.faults.apply_fault({"kind": "fall_off_bus", "gpu": 5})
    result = await run_check(diag(1), h200, gpus=8)
    assert not result.ok
    assert any("GPU 5 is lost" in f for f in result.failures)


@pytest.mark.timeout(30)
async def test_a_downed_nvlink_fails_the_bandwidth_check_against_the_baseline(
    h200: FakeNvml,
) -> None:
    suite = load_default_suite()
    spec = next(c for c in suite.level("medium") if c.kind == "nvbandwidth")
    wire = {**spec.wire(), "simulated_s": FAST}
    healthy = await run_check(wire, h200, gpus=8)
    assert healthy.ok
    rates = healthy.figures["gpu_gbps"]
    assert sorted(rates) == [str(i) for i in range(8)]
    assert all(r == pytest.approx(18 * 25 * 0.87, rel=0.01) for r in rates.values())
    assert judge(spec, "H200", ran=True, failures=(), figures=healthy.figures).passed

    for link in range(6):
        h200.faults.apply_fault({"kind": "nvlink_down", "gpu": 2, "link": link})
    degraded = await run_check(wire, h200, gpus=8)
    assert degraded.ok  # the tool ran; the figures are what fail
    assert degraded.figures["gpu_gbps"]["2"] < 300
    verdict = judge(spec, "H200", ran=True, failures=(), figures=degraded.figures)
    assert not verdict.passed
    assert verdict.reason.startswith("nvlink-bandwidth: GPU 2: ")
    assert "under 380 GB/s" in verdict.reason
    assert verdict.baseline == {"min_gbps": 380.0, "gpu_model": "H200"}


@pytest.mark.timeout(30)
async def test_a_command_check_reads_its_figures_and_exit_status() -> None:
    nvml = open_backend("fake:h100")
    script = "print('# Avg bus bandwidth    : 361.5'); print('gpus {gpus}')"
    spec = {
        "name": "nccl",
        "kind": "command",
        "argv": [sys.executable, "-c", script.replace("{gpus}", "{gpus}")],
        "figures": {"busbw_gbps": r"Avg bus bandwidth\s*:\s*([0-9.]+)", "gpus": r"gpus (\d+)"},
        "timeout_s": 20,
    }
    result = await run_check(spec, nvml, gpus=8)
    assert result.ok, result.failures
    assert result.figures == {"busbw_gbps": 361.5, "gpus": 8.0}

    failing = {**spec, "argv": [sys.executable, "-c", "import sys; sys.exit('NCCL WARN no peer')"]}
    result = await run_check(failing, nvml, gpus=8)
    assert not result.ok
    assert result.failures == [f"{sys.executable}: NCCL WARN no peer"]


@pytest.mark.timeout(30)
async def test_a_command_past_its_timeout_is_killed_and_fails() -> None:
    nvml = open_backend("fake:h100")
    spec = {
        "name": "slow",
        "kind": "command",
        "argv": [sys.executable, "-c", "import time; time.sleep(30)"],
        "timeout_s": 0.5,
    }
    result = await run_check(spec, nvml, gpus=8)
    assert not result.ok
    assert result.failures == [f"{sys.executable} ran past its 0.5s timeout"]
    assert result.duration_s < 10


@pytest.mark.timeout(30)
async def test_a_missing_tool_fails_or_is_skipped_as_the_suite_says() -> None:
    nvml = open_backend("fake:h100")
    spec = {"name": "x", "kind": "command", "argv": ["kiln-no-such-tool"], "timeout_s": 5}
    missing = await run_check(spec, nvml, gpus=8)
    assert not missing.ok
    assert missing.failures == ["kiln-no-such-tool is not installed on this node"]
    skipped = await run_check({**spec, "if_missing": "skip"}, nvml, gpus=8)
    assert skipped.ok
    assert skipped.figures == {"skipped": "kiln-no-such-tool is not installed"}


@pytest.mark.timeout(30)
def test_parsers_refuse_garbled_output() -> None:
    from agent.checks import CheckError

    with pytest.raises(CheckError, match="no test_categories"):
        parse_dcgm_diag({"something": "else"})
    with pytest.raises(CheckError, match="did not run"):
        parse_nvbandwidth({"nvbandwidth": {"testcases": []}}, "device_to_device_memcpy_read_ce")
    failed = parse_nvbandwidth(
        {"nvbandwidth": {"testcases": [{"name": "t", "status": "Error"}]}}, "t"
    )
    assert not failed.ok and failed.failures == ["nvbandwidth t: Error"]
