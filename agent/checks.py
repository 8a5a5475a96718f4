"""Run one check of the controller's health-check suite on this node.

A check is ``dcgm_diag`` (``dcgmi diag -r N -j``), ``nvbandwidth``
(``nvbandwidth -t TESTCASE -j``) or ``command`` (any program, no shell, its
figures read from its output with the suite's patterns). On a simulated node
the two NVIDIA tools are stood in for by ``agent.nvml.fake_tools``, which
read the fake GPUs and print the tools' own JSON; everything after that —
parsing, figures, the verdict's words — is the same code for both.

The agent answers what the tool said and measured; the controller judges the
figures against the suite's baseline (``controller.checks.judge``).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.nvml import fake_tools
from agent.nvml.backend import NvmlBackend

OUTPUT_LIMIT = 1 << 20  # bytes of a tool's output kept for parsing


@dataclass
class CheckResult:
    ok: bool  # the tool's own verdict: DCGM passed, the command exited 0
    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0


class CheckError(Exception):
    """The check could not be run as asked (a bad spec, a tool's garbled output)."""


async def run_check(spec: Mapping[str, Any], nvml: NvmlBackend, *, gpus: int) -> CheckResult:
    """Run ``spec`` (``CheckSpec.wire()``) and time it. Never raises for what
    the tool did: a timeout, a missing tool or garbled output is a failed result."""
    started = time.monotonic()
    try:
        result = await _run(spec, nvml, gpus)
    except CheckError as e:
        result = CheckResult(ok=False, failures=[str(e)])
    result.duration_s = round(time.monotonic() - started, 3)
    return result


async def _run(spec: Mapping[str, Any], nvml: NvmlBackend, gpus: int) -> CheckResult:
    kind = spec.get("kind")
    simulated = getattr(nvml, "faults", None) is not None  # the NVML fake
    if kind == "dcgm_diag":
        run = int(spec.get("run", 1))
        if simulated:
            await asyncio.sleep(float(spec.get("simulated_s", fake_tools.RUN_SECONDS[run])))
            return parse_dcgm_diag(fake_tools.dcgm_diag(nvml, run))  # type: ignore[arg-type]
        argv = ["dcgmi", "diag", "-r", str(run), "-j"]
        return await _tool(spec, argv, lambda out: parse_dcgm_diag(_json(out, "dcgmi")))
    if kind == "nvbandwidth":
        testcase = str(spec.get("testcase", "device_to_device_memcpy_read_ce"))
        if simulated:
            await asyncio.sleep(float(spec.get("simulated_s", 1.0)))
            return parse_nvbandwidth(fake_tools.nvbandwidth(nvml, testcase), testcase)  # type: ignore[arg-type]
        argv = ["nvbandwidth", "-t", testcase, "-j"]
        return await _tool(
            spec, argv, lambda out: parse_nvbandwidth(_json(out, "nvbandwidth"), testcase)
        )
    if kind == "command":
        argv = [str(a).replace("{gpus}", str(gpus)) for a in spec.get("argv", ())]
        if not argv:
            raise CheckError("a command check needs a command")
        patterns = {str(k): str(v) for k, v in dict(spec.get("figures", {})).items()}
        return await _tool(spec, argv, lambda out: CheckResult(ok=True), patterns=patterns)
    raise CheckError(f"unknown check kind {kind!r}")


async def _tool(
    spec: Mapping[str, Any],
    argv: list[str],
    parse: Any,
    *,
    patterns: Mapping[str, str] | None = None,
) -> CheckResult:
    """Run a real tool with the check's timeout and parse what it printed."""
    path = shutil.which(argv[0])
    if path is None:
        if spec.get("if_missing") == "skip":
            return CheckResult(ok=True, figures={"skipped": f"{argv[0]} is not installed"})
        return CheckResult(ok=False, failures=[f"{argv[0]} is not installed on this node"])
    timeout = float(spec.get("timeout_s", 300.0))
    proc = await asyncio.create_subprocess_exec(
        path,
        *argv[1:],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return CheckResult(ok=False, failures=[f"{argv[0]} ran past its {timeout:g}s timeout"])
    text = out[:OUTPUT_LIMIT].decode(errors="replace")
    if patterns is not None:  # a command: its exit status and the figures it printed
        figures = read_figures(text + "\n" + err[:OUTPUT_LIMIT].decode(errors="replace"), patterns)
        if proc.returncode != 0:
            words = err.decode(errors="replace").strip().splitlines()
            why = words[-1] if words else f"exited {proc.returncode}"
            return CheckResult(ok=False, failures=[f"{argv[0]}: {why}"], figures=figures)
        return CheckResult(ok=True, figures=figures)
    result: CheckResult = parse(text)  # DCGM exits non-zero when a test fails
    return result


def _json(text: str, tool: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckError(f"{tool} printed no JSON: {e.msg}") from e
    if not isinstance(doc, dict):
        raise CheckError(f"{tool} printed JSON that is not an object")
    return doc


def read_figures(text: str, patterns: Mapping[str, str]) -> dict[str, Any]:
    """Each pattern's one group, from the last line it matches, as a number."""
    figures: dict[str, Any] = {}
    for name, pattern in patterns.items():
        found = re.findall(pattern, text)
        if found:
            try:
                figures[name] = float(found[-1])
            except ValueError:
                figures[name] = found[-1]
    return figures


def parse_dcgm_diag(doc: Mapping[str, Any]) -> CheckResult:
    """``dcgmi diag -j``: every test's status; any "Fail" fails the check,
    with DCGM's own warning text."""
    body = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")
    if not isinstance(body, Mapping) or not isinstance(body.get("test_categories"), list):
        raise CheckError("dcgmi printed no test_categories")
    statuses: dict[str, str] = {}
    failures: list[str] = []
    for category in body["test_categories"]:
        for test in category.get("tests", ()) if isinstance(category, Mapping) else ():
            name = str(test.get("name", "?"))
            worst = "Pass"
            for result in test.get("results", ()):
                status = str(result.get("status", ""))
                if status == "Fail":
                    worst = "Fail"
                    words = [str(w.get("warning", "")) for w in result.get("warnings", ())]
                    gpu = result.get("gpu_id", result.get("gpu_ids", ""))
                    text = "; ".join(w for w in words if w) or f"GPU {gpu} failed"
                    failures.append(f"{name}: {text}")
                elif status in ("Warn", "Skip") and worst == "Pass":
                    worst = status
            statuses[name] = worst
    figures = {"tests": statuses, "dcgm_version": str(body.get("version", ""))}
    return CheckResult(ok=not failures, failures=failures, figures=figures)


def parse_nvbandwidth(doc: Mapping[str, Any], testcase: str) -> CheckResult:
    """``nvbandwidth -j``: per GPU, the median rate of the pairs it is in (GB/s)."""
    body = doc.get("nvbandwidth")
    cases = body.get("testcases") if isinstance(body, Mapping) else None
    if not isinstance(cases, list):
        raise CheckError("nvbandwidth printed no testcases")
    case = next((c for c in cases if isinstance(c, Mapping) and c.get("name") == testcase), None)
    if case is None:
        raise CheckError(f"nvbandwidth did not run {testcase}")
    status = str(case.get("status", ""))
    if status == "Waived":
        return CheckResult(ok=True, figures={"skipped": f"{testcase} waived (fewer than 2 GPUs)"})
    if status != "Passed":
        return CheckResult(ok=False, failures=[f"nvbandwidth {testcase}: {status or 'no status'}"])
    matrix = case.get("bandwidth_matrix")
    if not isinstance(matrix, list):
        raise CheckError(f"nvbandwidth {testcase}: no bandwidth matrix")
    pairs: dict[str, list[float]] = {}
    for i, row in enumerate(matrix):
        for j, cell in enumerate(row):
            try:
                gbps = float(cell)
            except (TypeError, ValueError):
                continue  # "N/A": a GPU to itself
            for gpu in (str(i), str(j)):
                pairs.setdefault(gpu, []).append(gbps)
    # The median of the pairs a GPU is in: a slow GPU slows every pair it is
    # in, a healthy peer only its one pair with it, so the slow one is named.
    rates = {gpu: statistics.median(values) for gpu, values in pairs.items()}
    figures: dict[str, Any] = {"gpu_gbps": rates}
    if isinstance(case.get("sum"), int | float):
        figures["sum_gbps"] = float(case["sum"])
    return CheckResult(ok=True, figures=figures)
