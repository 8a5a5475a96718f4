"""Load and validate a declarative rule set (``version: v1``).

The document shape is described in ``docs/policies.md``. Validation is strict:
unknown keys, versions, metrics, operators and actions are rejected with a
:class:`RuleSetError` that names the rule and the field, so a typo cannot
silently disable a guard rail. Loading is pure (``load_rules`` takes text);
only :func:`load_rules_file` and :func:`load_default_rules` read a file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from controller.core.errors import InvalidArgument
from controller.policies.rules import (
    BOOL_METRICS,
    NUMERIC_METRICS,
    POWER_OFF_KINDS,
    TAKE_DOWN_KINDS,
    THERMAL_METRICS,
    ActionKind,
    ActionSpec,
    BlastRadius,
    Cap,
    Caps,
    Condition,
    Metric,
    Op,
    RecoveryAction,
    Rule,
    RuleSet,
    Thresholds,
)
from kiln_common.durations import parse_duration

SUPPORTED_VERSIONS = ("v1",)
_TOP_KEYS = {
    "version",
    "rules",
    "caps",
    "blast_radius",
    "dry_run",
    "thresholds",
    "max_sample_gap",
}
_RULE_KEYS = {"name", "when", "for", "for_samples", "actions", "dry_run", "thresholds", "caps"}
_WHEN_KEYS = {"metric", "op", "value", "in"}
_CAP_KEYS = {"per_rack", "fleet", "window"}
_CAPS_KEYS = {"power_off", "power_cycle"}
_BLAST_RADIUS_KEYS = _CAP_KEYS | {"counts"}
# What a blast radius may count; power_off covers graceful and now.
_TAKE_DOWNS = {
    "drain": frozenset({ActionKind.DRAIN}),
    "quarantine": frozenset({ActionKind.QUARANTINE}),
    "power_off": POWER_OFF_KINDS,
    "power_cycle": frozenset({ActionKind.POWER_CYCLE}),
    "reset_gpu": frozenset({ActionKind.RESET_GPU}),
}
_THRESHOLD_KEYS = {"slowdown_c", "shutdown_c"}
_SIMPLE_ACTIONS = {
    "drain": ActionKind.DRAIN,
    "notify_job": ActionKind.NOTIFY_JOB,
    "quarantine": ActionKind.QUARANTINE,
    "power_cycle": ActionKind.POWER_CYCLE,
    # Kiln reboots a node by power-cycling it through its BMC: one action, two names.
    "reboot": ActionKind.POWER_CYCLE,
    "reset_gpu": ActionKind.RESET_GPU,
}
_RECOVERY_NAMES = ", ".join(a.label for a in RecoveryAction)
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class RuleSetError(InvalidArgument):
    """A rule set document is malformed; ``where`` names the rule and field."""

    template = "invalid rule set: %(where)s: %(problem)s"

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where=where, problem=problem)


def load_rules(text: str) -> RuleSet:
    """Parse and validate a YAML rule set. Raises :class:`RuleSetError`."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RuleSetError("document", f"not valid YAML: {e}") from e
    return parse_rules(doc)


def load_rules_file(path: str | Path) -> RuleSet:
    """Read and validate a rule set file (blocking I/O; call from a thread)."""
    return load_rules(Path(path).read_text(encoding="utf-8"))


def load_default_rules() -> RuleSet:
    """The rule set shipped with Kiln (``controller/policies/default_rules.yaml``)."""
    text = resources.files("controller.policies").joinpath("default_rules.yaml").read_text("utf-8")
    return load_rules(text)


def parse_rules(doc: object) -> RuleSet:
    """Validate an already-decoded document (e.g. from JSON or a database row)."""
    top = _mapping(doc, "document")
    _no_unknown(top, _TOP_KEYS, "document")
    version = top.get("version")
    if version not in SUPPORTED_VERSIONS:
        raise RuleSetError(
            "version",
            f"unsupported version {version!r} (supported: {', '.join(SUPPORTED_VERSIONS)})",
        )
    thresholds = _thresholds(top.get("thresholds", {}), Thresholds(), "thresholds")
    caps = _caps(top.get("caps", {}), Caps(), "caps")
    raw_rules = top.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise RuleSetError("rules", "must be a non-empty list")
    rules: list[Rule] = []
    for i, raw in enumerate(raw_rules):
        rule = _rule(raw, i, thresholds, caps)
        if any(r.name == rule.name for r in rules):
            raise RuleSetError(f"rules[{i}] {rule.name!r}", "duplicate rule name")
        rules.append(rule)
    gap = _duration(top.get("max_sample_gap", "30s"), "max_sample_gap")
    blast_radius = (
        _blast_radius(top["blast_radius"], "blast_radius") if "blast_radius" in top else None
    )
    return RuleSet(
        rules=tuple(rules),
        dry_run=_bool(top.get("dry_run", False), "dry_run"),
        max_sample_gap_s=gap,
        blast_radius=blast_radius,
    )


def _rule(raw: object, i: int, thresholds: Thresholds, caps: Caps) -> Rule:
    body = _mapping(raw, f"rules[{i}]")
    name = body.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise RuleSetError(
            f"rules[{i}].name", f"{name!r} is not a valid name (lowercase letters, digits, -_.)"
        )
    where = f"rule {name!r}"
    _no_unknown(body, _RULE_KEYS, where)
    if "when" not in body:
        raise RuleSetError(f"{where} field 'when'", "is required")
    when = _condition(body["when"], f"{where} field 'when'")
    for_s = None
    if "for" in body:
        for_s = _duration(body["for"], f"{where} field 'for'")
        if for_s <= 0:
            raise RuleSetError(f"{where} field 'for'", "must be longer than 0s")
    for_samples = None
    if "for_samples" in body:
        for_samples = body["for_samples"]
        if not _is_int(for_samples) or for_samples < 2:
            raise RuleSetError(
                f"{where} field 'for_samples'", f"must be an integer >= 2, got {for_samples!r}"
            )
    actions = _actions(body.get("actions"), when, f"{where} field 'actions'")
    rule = Rule(
        name=name,
        when=when,
        actions=actions,
        for_s=for_s,
        for_samples=for_samples,
        dry_run=_bool(body.get("dry_run", False), f"{where} field 'dry_run'"),
        thresholds=_thresholds(
            body.get("thresholds", {}), thresholds, f"{where} field 'thresholds'"
        ),
        caps=_caps(body.get("caps", {}), caps, f"{where} field 'caps'"),
    )
    if any(a.kind in POWER_OFF_KINDS for a in actions) and not rule.sustained:
        raise RuleSetError(
            f"{where} field 'actions'",
            "power_off needs 'for' or 'for_samples' so one bad sample cannot power a node down",
        )
    return rule


def _condition(raw: object, where: str) -> Condition:
    body = _mapping(raw, where)
    _no_unknown(body, _WHEN_KEYS, where)
    try:
        metric = Metric(str(body.get("metric")))
    except ValueError:
        raise RuleSetError(
            f"{where}.metric",
            f"unknown metric {body.get('metric')!r} (known: {', '.join(m.value for m in Metric)})",
        ) from None
    if "in" in body:
        if "op" in body or "value" in body:
            raise RuleSetError(where, "use either 'in: [...]' or 'op' with 'value', not both")
        op, value = Op.IN, body["in"]
    else:
        try:
            op = Op(str(body.get("op")))
        except ValueError:
            raise RuleSetError(
                f"{where}.op",
                f"unknown op {body.get('op')!r} (known: {', '.join(o.value for o in Op)})",
            ) from None
        if "value" not in body:
            raise RuleSetError(f"{where}.value", "is required")
        value = body["value"]
    if metric is Metric.XID:
        if op is not Op.IN:
            raise RuleSetError(f"{where}.op", "metric xid takes 'in: [xid, ...]'")
        return Condition(metric, op, _xid_set(value, f"{where}.in"))
    if metric is Metric.RECOVERY_ACTION:
        return _recovery_condition(op, value, where)
    if op is Op.IN:
        raise RuleSetError(
            f"{where}.op", f"'in' only applies to metric xid or recovery_action, not {metric}"
        )
    if metric in BOOL_METRICS:
        if op not in (Op.EQ, Op.NE) or not isinstance(value, bool):
            raise RuleSetError(
                where, f"metric {metric} is a boolean: use op '==' or '!=' with true/false"
            )
        return Condition(metric, op, value)
    assert metric in NUMERIC_METRICS
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RuleSetError(
            f"{where}.value", f"metric {metric} needs a finite number, got {value!r}"
        )
    return Condition(metric, op, float(value))


def _recovery_condition(op: Op, value: object, where: str) -> Condition:
    """``recovery_action in [names]``, ``== name`` or ``!= name``."""
    metric = Metric.RECOVERY_ACTION
    if op is Op.IN:
        if not isinstance(value, list) or not value:
            raise RuleSetError(
                f"{where}.in", f"must be a non-empty list of recovery actions ({_RECOVERY_NAMES})"
            )
        codes = frozenset(int(_recovery_name(v, f"{where}.in")) for v in value)
        return Condition(metric, op, codes)
    if op not in (Op.EQ, Op.NE):
        raise RuleSetError(
            f"{where}.op",
            f"metric {metric} takes '==' or '!=' with a recovery action, or 'in: [...]', "
            f"not {op.value!r}",
        )
    return Condition(metric, op, float(_recovery_name(value, f"{where}.value")))


def _recovery_name(raw: object, where: str) -> RecoveryAction:
    action = RecoveryAction.named(raw) if isinstance(raw, str) else None
    if action is None:
        raise RuleSetError(where, f"unknown recovery action {raw!r} (known: {_RECOVERY_NAMES})")
    return action


def _actions(raw: object, when: Condition, where: str) -> tuple[ActionSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise RuleSetError(where, "must be a non-empty list")
    specs = [_action(item, when, f"{where}[{i}]") for i, item in enumerate(raw)]
    kinds = [s.kind for s in specs]
    if len(set(kinds)) != len(kinds):
        raise RuleSetError(where, "lists the same action twice")
    if ActionKind.POWER_OFF_NOW in kinds and ActionKind.POWER_OFF_GRACEFUL in kinds:
        raise RuleSetError(where, "power_off: now and power_off: graceful exclude each other")
    if ActionKind.RESET_GPU in kinds and when.metric in THERMAL_METRICS:
        raise RuleSetError(
            where,
            f"reset_gpu needs a GPU to reset, and a rule on {when.metric} may fire on a BMC "
            "sample, which names none (and a reset does not cool a GPU)",
        )
    return tuple(specs)


def _action(raw: object, when: Condition, where: str) -> ActionSpec:
    if isinstance(raw, str):
        if raw not in _SIMPLE_ACTIONS:
            known = [*_SIMPLE_ACTIONS, "{power_off: now|graceful}", "{power_cycle_on_xid: [..]}"]
            raise RuleSetError(where, f"unknown action {raw!r} (known: {', '.join(known)})")
        return ActionSpec(_SIMPLE_ACTIONS[raw])
    body = _mapping(raw, where)
    if "power_off" in body:
        _no_unknown(body, {"power_off", "after"}, where)
        mode = body["power_off"]
        if mode == "now":
            if "after" in body:
                raise RuleSetError(f"{where}.after", "only applies to power_off: graceful")
            return ActionSpec(ActionKind.POWER_OFF_NOW)
        if mode == "graceful":
            after = _duration(body.get("after", "0s"), f"{where}.after")
            return ActionSpec(ActionKind.POWER_OFF_GRACEFUL, after_s=after)
        raise RuleSetError(f"{where}.power_off", f"must be 'now' or 'graceful', got {mode!r}")
    if "power_cycle_on_xid" in body:
        _no_unknown(body, {"power_cycle_on_xid"}, where)
        if when.metric is not Metric.XID:
            raise RuleSetError(where, "power_cycle_on_xid only applies to a rule on metric xid")
        xids = _xid_set(body["power_cycle_on_xid"], f"{where}.power_cycle_on_xid")
        assert isinstance(when.value, frozenset)
        if not xids <= when.value:
            missing = sorted(xids - when.value)
            raise RuleSetError(
                f"{where}.power_cycle_on_xid", f"XIDs {missing} are not in the rule's 'in' list"
            )
        return ActionSpec(ActionKind.POWER_CYCLE, on_xids=xids)
    raise RuleSetError(where, f"unknown action {sorted(body)!r}")


def _thresholds(raw: object, base: Thresholds, where: str) -> Thresholds:
    body = _mapping(raw, where)
    _no_unknown(body, _THRESHOLD_KEYS, where)
    values: dict[str, float | None] = {"slowdown_c": base.slowdown_c, "shutdown_c": base.shutdown_c}
    for key in _THRESHOLD_KEYS & body.keys():
        v = body[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 150:
            raise RuleSetError(f"{where}.{key}", f"must be a temperature in (0, 150] °C, got {v!r}")
        values[key] = float(v)
    return Thresholds(**values)


def _caps(raw: object, base: Caps, where: str) -> Caps:
    body = _mapping(raw, where)
    _no_unknown(body, _CAPS_KEYS, where)
    power_off = _cap(body["power_off"], f"{where}.power_off") if "power_off" in body else None
    power_cycle = (
        _cap(body["power_cycle"], f"{where}.power_cycle") if "power_cycle" in body else None
    )
    return Caps(power_off=power_off or base.power_off, power_cycle=power_cycle or base.power_cycle)


def _blast_radius(raw: object, where: str) -> BlastRadius:
    body = _mapping(raw, where)
    _no_unknown(body, _BLAST_RADIUS_KEYS, where)
    cap = _cap({k: v for k, v in body.items() if k != "counts"}, where)
    if "counts" not in body:
        return BlastRadius(cap=cap, kinds=TAKE_DOWN_KINDS)
    raw_counts = body["counts"]
    where = f"{where}.counts"
    if not isinstance(raw_counts, list) or not raw_counts:
        raise RuleSetError(where, f"must be a non-empty list of {', '.join(_TAKE_DOWNS)}")
    kinds: set[ActionKind] = set()
    for item in raw_counts:
        if not isinstance(item, str) or item not in _TAKE_DOWNS:
            raise RuleSetError(
                where,
                f"{item!r} is not one of {', '.join(_TAKE_DOWNS)} (the actions that take a "
                "node down)",
            )
        if _TAKE_DOWNS[item] <= kinds:
            raise RuleSetError(where, f"lists {item} twice")
        kinds |= _TAKE_DOWNS[item]
    return BlastRadius(cap=cap, kinds=frozenset(kinds))


def _cap(raw: object, where: str) -> Cap:
    body = _mapping(raw, where)
    _no_unknown(body, _CAP_KEYS, where)
    limits: dict[str, int | None] = {}
    for key in ("per_rack", "fleet"):
        v = body.get(key)
        if v is not None and (not _is_int(v) or v < 0):
            raise RuleSetError(f"{where}.{key}", f"must be an integer >= 0 or absent, got {v!r}")
        limits[key] = v
    if "window" not in body:
        raise RuleSetError(f"{where}.window", "is required")
    window = _duration(body["window"], f"{where}.window")
    if window <= 0:
        raise RuleSetError(f"{where}.window", "must be longer than 0s")
    return Cap(per_rack=limits["per_rack"], fleet=limits["fleet"], window_s=window)


def _xid_set(raw: object, where: str) -> frozenset[int]:
    if not isinstance(raw, list) or not raw or not all(_is_int(x) and x > 0 for x in raw):
        raise RuleSetError(where, f"must be a non-empty list of positive XID numbers, got {raw!r}")
    return frozenset(raw)


def _duration(raw: object, where: str) -> float:
    """``"90s"``, ``"5m"``, ``"1h"``, ``"500ms"`` or a number of seconds."""
    try:
        return parse_duration(raw)
    except ValueError as e:
        raise RuleSetError(where, str(e)) from None


def _mapping(raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise RuleSetError(where, f"must be a mapping, got {type(raw).__name__}")
    return raw


def _no_unknown(body: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in body.keys() - allowed)
    if unknown:
        raise RuleSetError(
            where, f"unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def _bool(raw: object, where: str) -> bool:
    if not isinstance(raw, bool):
        raise RuleSetError(where, f"must be true or false, got {raw!r}")
    return raw


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
