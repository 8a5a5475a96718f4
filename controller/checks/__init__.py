"""The health-check suite (pure): what to run at each level and how to judge it."""

from controller.checks.suite import (
    LEVELS,
    TRIGGERS,
    CheckSpec,
    Periodic,
    Suite,
    SuiteError,
    Verdict,
    judge,
    load_default_suite,
    load_suite,
    load_suite_file,
)

__all__ = [
    "LEVELS",
    "TRIGGERS",
    "CheckSpec",
    "Periodic",
    "Suite",
    "SuiteError",
    "Verdict",
    "judge",
    "load_default_suite",
    "load_suite",
    "load_suite_file",
]
