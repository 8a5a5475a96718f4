"""The health-check suite: levels of checks, what gates on them, and how a
check's figures are judged. Pure: parsing and judging, no I/O but the files
``load_suite_file`` and ``load_default_suite`` read.

The document shape is in ``docs/health-checks.md``. Validation is strict:
an unknown key, kind, level or operator is refused with a ``SuiteError``
naming where, so a typo cannot silently turn a check off.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from controller.core.errors import InvalidArgument
from kiln_common.durations import parse_duration

SUPPORTED_VERSIONS = ("v1",)
LEVELS = ("quick", "medium", "long")
KINDS = ("dcgm_diag", "nvbandwidth", "command")
TRIGGERS = ("intake", "repair", "periodic", "operator", "hand_off", "resumed")
_TOP_KEYS = {"version", "name", "revision", "gates", "periodic", "levels"}
_GATE_KEYS = {"intake", "repair"}
_PERIODIC_KEYS = {"level", "every", "per_rack", "fleet"}
_COMMON_KEYS = {"name", "kind", "timeout", "scope", "if_missing", "simulated"}
_KIND_KEYS: Mapping[str, frozenset[str]] = {
    "dcgm_diag": frozenset({"run"}),
    "nvbandwidth": frozenset({"testcase", "min_gbps"}),
    "command": frozenset({"run", "figures", "expect"}),
}
OPS: Mapping[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}


class SuiteError(InvalidArgument):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"check suite: {where}: {problem}")


@dataclass(frozen=True)
class CheckSpec:
    """One check of a level, as the suite defines it."""

    name: str
    kind: str
    timeout_s: float
    scope: str = "node"  # "rack": every tray of an NVL72 runs it together
    if_missing: str = "fail"  # the tool is not installed: "fail" or "skip"
    simulated_s: float | None = None  # how long the simulated GPUs take
    run: int = 1  # dcgm_diag: the run level
    argv: tuple[str, ...] = ()  # command
    testcase: str = ""  # nvbandwidth
    min_gbps: Mapping[str, float] = field(default_factory=dict)  # by GPU model; "" any
    figures: Mapping[str, str] = field(default_factory=dict)  # command: name -> regex
    expect: Mapping[str, tuple[str, float]] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        """What the node's agent needs to run it (the judging stays here)."""
        body: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "timeout_s": self.timeout_s,
            "if_missing": self.if_missing,
        }
        if self.simulated_s is not None:
            body["simulated_s"] = self.simulated_s
        if self.kind == "dcgm_diag":
            body["run"] = self.run
        elif self.kind == "nvbandwidth":
            body["testcase"] = self.testcase
        else:
            body["argv"] = list(self.argv)
            body["figures"] = dict(self.figures)
        return body


@dataclass(frozen=True)
class Periodic:
    level: str = ""  # "": no periodic checks
    every_s: float = 86400.0
    per_rack: int = 1
    fleet: int = 8


@dataclass(frozen=True)
class Suite:
    name: str
    revision: str
    levels: Mapping[str, tuple[CheckSpec, ...]]
    intake: str = ""
    repair: str = ""
    periodic: Periodic = field(default_factory=Periodic)

    @property
    def version(self) -> str:
        return f"{self.name}@{self.revision}"

    def level(self, name: str) -> tuple[CheckSpec, ...]:
        """The checks of level ``name``. Raises InvalidArgument for another name."""
        if name not in self.levels:
            known = ", ".join(n for n in LEVELS if n in self.levels)
            raise InvalidArgument(
                f"no check level {name!r} in suite {self.version}; it has {known}"
            )
        return self.levels[name]


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str  # why it failed, in the check's own words ("" when it passed)
    baseline: Mapping[str, Any]


def judge(
    spec: CheckSpec,
    gpu_model: str,
    *,
    ran: bool,
    failures: tuple[str, ...],
    figures: Mapping[str, Any],
) -> Verdict:
    """Whether one check passed, from what the agent answered: ``ran`` is the
    tool's own verdict (DCGM passed, the command exited 0), ``failures`` its
    words, ``figures`` what it measured."""
    if not ran:
        return Verdict(False, "; ".join(failures) or f"{spec.name} failed", {})
    if "skipped" in figures:
        return Verdict(True, "", {})
    if spec.kind == "nvbandwidth":
        return _judge_bandwidth(spec, gpu_model, figures)
    if spec.kind == "command":
        return _judge_figures(spec, figures)
    return Verdict(True, "", {"run": spec.run})


def _judge_bandwidth(spec: CheckSpec, gpu_model: str, figures: Mapping[str, Any]) -> Verdict:
    floor = spec.min_gbps.get(gpu_model, spec.min_gbps.get("", 0.0))
    baseline = {"min_gbps": floor, "gpu_model": gpu_model}
    per_gpu = figures.get("gpu_gbps")
    if not isinstance(per_gpu, Mapping) or not per_gpu:
        return Verdict(False, f"{spec.name}: no per-GPU bandwidth in the output", baseline)
    slow = [
        f"GPU {index}: {float(gbps):.1f} GB/s, under {floor:g} GB/s"
        for index, gbps in sorted(per_gpu.items(), key=lambda kv: int(kv[0]))
        if not isinstance(gbps, int | float) or float(gbps) < floor
    ]
    if slow:
        return Verdict(False, f"{spec.name}: " + "; ".join(slow), baseline)
    return Verdict(True, "", baseline)


def _judge_figures(spec: CheckSpec, figures: Mapping[str, Any]) -> Verdict:
    baseline = {name: {op: value} for name, (op, value) in spec.expect.items()}
    problems = []
    for name, (op, value) in spec.expect.items():
        got = figures.get(name)
        if not isinstance(got, int | float) or isinstance(got, bool):
            problems.append(f"{name} not found in the output")
        elif not OPS[op](float(got), value):
            problems.append(f"{name} {got:g}, not {op} {value:g}")
    if problems:
        return Verdict(False, f"{spec.name}: " + "; ".join(problems), baseline)
    return Verdict(True, "", baseline)


# -- loading ---------------------------------------------------------------------


def load_default_suite() -> Suite:
    text = resources.files("controller.checks").joinpath("default_suite.yaml").read_text()
    return load_suite(text)


def load_suite_file(path: str | Path) -> Suite:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidArgument(f"cannot read check suite {path}: {e.strerror}") from e
    return load_suite(text)


def load_suite(text: str) -> Suite:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SuiteError("document", f"not valid YAML: {e}") from e
    top = _mapping(doc, "document", _TOP_KEYS)
    version = top.get("version")
    if version not in SUPPORTED_VERSIONS:
        raise SuiteError("version", f"{version!r} is not one of {', '.join(SUPPORTED_VERSIONS)}")
    name = _text(top.get("name", "suite"), "name")
    revision = _text(top.get("revision", "1"), "revision")
    raw_levels = _mapping(top.get("levels"), "levels", set(LEVELS))
    levels = {
        level: _checks(raw_levels[level], f"levels.{level}")
        for level in LEVELS
        if level in raw_levels
    }
    if not levels:
        raise SuiteError("levels", "no level defined")
    gates = _mapping(top.get("gates", {}), "gates", _GATE_KEYS)
    intake = _level_name(gates.get("intake", ""), "gates.intake", levels)
    repair = _level_name(gates.get("repair", ""), "gates.repair", levels)
    return Suite(
        name=name,
        revision=revision,
        levels=levels,
        intake=intake,
        repair=repair,
        periodic=_periodic(top.get("periodic", {}), levels),
    )


def _periodic(raw: object, levels: Mapping[str, object]) -> Periodic:
    body = _mapping(raw, "periodic", _PERIODIC_KEYS)
    return Periodic(
        level=_level_name(body.get("level", ""), "periodic.level", levels),
        every_s=_duration(body.get("every", "24h"), "periodic.every"),
        per_rack=_count(body.get("per_rack", 1), "periodic.per_rack"),
        fleet=_count(body.get("fleet", 8), "periodic.fleet"),
    )


def _checks(raw: object, where: str) -> tuple[CheckSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise SuiteError(where, "a level is a non-empty list of checks")
    specs = tuple(_check(item, f"{where}[{i}]") for i, item in enumerate(raw))
    names = [s.name for s in specs]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise SuiteError(where, f"check names must be unique: {', '.join(doubled)}")
    return specs


def _check(raw: object, where: str) -> CheckSpec:
    if not isinstance(raw, Mapping):
        raise SuiteError(where, "a check is a mapping")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise SuiteError(f"{where}.kind", f"{kind!r} is not one of {', '.join(KINDS)}")
    body = _mapping(raw, where, _COMMON_KEYS | _KIND_KEYS[kind])
    name = _text(body.get("name"), f"{where}.name")
    where = f"{where} ({name})"
    scope = body.get("scope", "node")
    if scope not in ("node", "rack"):
        raise SuiteError(f"{where}.scope", f"{scope!r} is not node or rack")
    if_missing = body.get("if_missing", "fail")
    if if_missing not in ("fail", "skip"):
        raise SuiteError(f"{where}.if_missing", f"{if_missing!r} is not fail or skip")
    simulated = body.get("simulated")
    spec = CheckSpec(
        name=name,
        kind=kind,
        timeout_s=_duration(body.get("timeout", "300s"), f"{where}.timeout"),
        scope=scope,
        if_missing=if_missing,
        simulated_s=None if simulated is None else _duration(simulated, f"{where}.simulated"),
    )
    if kind == "dcgm_diag":
        run = body.get("run", 1)
        if run not in (1, 2, 3, 4):
            raise SuiteError(f"{where}.run", f"{run!r} is not a DCGM run level 1 to 4")
        return replace(spec, run=run)
    if kind == "nvbandwidth":
        return replace(
            spec,
            testcase=_text(
                body.get("testcase", "device_to_device_memcpy_read_ce"), f"{where}.testcase"
            ),
            min_gbps=_floors(body.get("min_gbps"), f"{where}.min_gbps"),
        )
    argv = body.get("run")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
        raise SuiteError(f"{where}.run", "a command is a non-empty list of strings (no shell)")
    figures = _mapping(body.get("figures", {}), f"{where}.figures", None)
    for fig, pattern in figures.items():
        try:
            compiled = re.compile(_text(pattern, f"{where}.figures.{fig}"))
        except re.error as e:
            raise SuiteError(f"{where}.figures.{fig}", f"not a regular expression: {e}") from e
        if compiled.groups != 1:
            raise SuiteError(f"{where}.figures.{fig}", "the pattern needs exactly one group")
    expect = {
        fig: _expectation(crit, f"{where}.expect.{fig}")
        for fig, crit in _mapping(body.get("expect", {}), f"{where}.expect", None).items()
    }
    unknown = sorted(set(expect) - set(figures))
    if unknown:
        raise SuiteError(f"{where}.expect", f"no figure named {', '.join(unknown)}")
    return replace(spec, argv=tuple(argv), figures=dict(figures), expect=expect)


def _expectation(raw: object, where: str) -> tuple[str, float]:
    body = _mapping(raw, where, set(OPS))
    if len(body) != 1:
        raise SuiteError(where, f"one comparison, e.g. {{'>=': 300}}; one of {', '.join(OPS)}")
    ((op, value),) = body.items()
    return op, _number(value, f"{where}.{op}")


def _floors(raw: object, where: str) -> Mapping[str, float]:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return {"": _number(raw, where)}
    body = _mapping(raw, where, None)
    if not body:
        raise SuiteError(where, "a number of GB/s, or one per GPU model")
    return {str(model).upper(): _number(v, f"{where}.{model}") for model, v in body.items()}


def _level_name(raw: object, where: str, levels: Mapping[str, object]) -> str:
    if raw in ("", None):
        return ""
    if raw not in levels:
        raise SuiteError(where, f"{raw!r} is not a level of this suite ({', '.join(levels)})")
    return str(raw)


def _mapping(raw: object, where: str, allowed: set[str] | frozenset[str] | None) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SuiteError(where, "must be a mapping")
    if allowed is not None:
        unknown = sorted(str(k) for k in raw if k not in allowed)
        if unknown:
            raise SuiteError(
                where, f"unknown key {', '.join(unknown)} (known: {', '.join(sorted(allowed))})"
            )
    return {str(k): v for k, v in raw.items()}


def _text(raw: object, where: str) -> str:
    if not isinstance(raw, str | int) or isinstance(raw, bool) or not str(raw).strip():
        raise SuiteError(where, "must be a non-empty string")
    return str(raw)


def _number(raw: object, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise SuiteError(where, f"{raw!r} is not a finite number")
    return float(raw)


def _count(raw: object, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise SuiteError(where, f"{raw!r} is not a whole number of at least 1")
    return raw


def _duration(raw: object, where: str) -> float:
    try:
        return parse_duration(raw)
    except ValueError as e:
        raise SuiteError(where, str(e)) from None
