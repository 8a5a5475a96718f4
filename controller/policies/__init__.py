"""Health policies: declarative rules that drain, quarantine, reset GPUs or power down nodes.

Pure domain code: no I/O except reading a rule file, no clock (times are
passed in). See ``docs/policies.md``.
"""

from controller.policies.caps import PastAction
from controller.policies.engine import Action, PolicyEngine
from controller.policies.loader import (
    RuleSetError,
    load_default_rules,
    load_rules,
    load_rules_file,
    parse_rules,
)
from controller.policies.rules import (
    TAKE_DOWN_KINDS,
    ActionKind,
    BlastRadius,
    Metric,
    Op,
    RecoveryAction,
    Rule,
    RuleSet,
)
from controller.policies.samples import GpuReading, HealthSample

__all__ = [
    "TAKE_DOWN_KINDS",
    "Action",
    "ActionKind",
    "BlastRadius",
    "GpuReading",
    "HealthSample",
    "Metric",
    "Op",
    "PastAction",
    "PolicyEngine",
    "RecoveryAction",
    "Rule",
    "RuleSet",
    "RuleSetError",
    "load_default_rules",
    "load_rules",
    "load_rules_file",
    "parse_rules",
]
