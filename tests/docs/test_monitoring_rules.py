"""docs/monitoring: the alert rules and the Grafana dashboard stay valid and
name only metrics that Kiln (controller and agents) exports.

``promtool`` (Debian's ``prometheus`` package) checks the rules file, runs unit
tests of a few alerts, and parses every dashboard query; without it the tests
that need it fail rather than skip, so CI cannot pass without checking.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
RULES = MONITORING / "kiln-alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
README = MONITORING / "README.md"

# The controller's metrics (/metrics on --http-listen).
CONTROLLER_HISTOGRAMS = {
    "kiln_allocation_wait_seconds",
    "kiln_placement_seconds",
    "kiln_bmc_call_seconds",
    "kiln_power_sync_pass_seconds",
}
CONTROLLER_METRICS = CONTROLLER_HISTOGRAMS | {
    "kiln_nodes",
    "kiln_agents_connected",
    "kiln_allocations",
    "kiln_allocation_oldest_pending_seconds",
    "kiln_bmc_call_failures_total",
    "kiln_bmc_breakers",
    "kiln_bmc_threads_allowed",
    "kiln_power_sync_rows_written",
    "kiln_policy_actions_total",
    "kiln_events_outbox_pending",
    "kiln_events_outbox_lag_seconds",
    "kiln_health_reports_total",
    "kiln_agent_report_interval_seconds",
    "kiln_controller_loop_lag_seconds",
    "kiln_health_report_delay_seconds",
    "kiln_health_write_behind_pending",
    "kiln_agent_relay_workers",
    "kiln_agent_relay_calls",
    "kiln_agent_relay_restarts",
    "kiln_agent_relay_backlog",
    "kiln_store_write_busy_seconds",
    "kiln_store_write_groups",
    "kiln_store_write_units",
    "kiln_store_writes_queued",
    "kiln_bmc_readers",
    "kiln_bmc_reader_calls_in_flight",
    "kiln_bmc_reader_restarts",
    "kiln_gc_pause_seconds",
}
# The agents' metrics (dcgm-exporter names, on --metrics-port).
AGENT_METRICS = {
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "kiln_gpu_xid_total",
}
DOCUMENTED = CONTROLLER_METRICS | AGENT_METRICS

# PromQL functions, aggregations and keywords: identifiers that are not metrics.
PROMQL_WORDS = {
    "abs",
    "absent",
    "absent_over_time",
    "and",
    "avg",
    "avg_over_time",
    "bool",
    "by",
    "ceil",
    "changes",
    "clamp_max",
    "clamp_min",
    "count",
    "count_over_time",
    "delta",
    "deriv",
    "floor",
    "group_left",
    "group_right",
    "histogram_quantile",
    "idelta",
    "ignoring",
    "increase",
    "inf",
    "irate",
    "label_replace",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "nan",
    "offset",
    "on",
    "or",
    "quantile",
    "rate",
    "resets",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "sum",
    "sum_over_time",
    "time",
    "timestamp",
    "topk",
    "bottomk",
    "unless",
    "vector",
    "without",
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")  # label matchers
_BRACKETS = re.compile(r"\[[^\[\]]*\]")  # ranges and subqueries
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_VARIABLE = re.compile(r"\$\{?\w+\}?")  # Grafana's $__rate_interval, ${datasource}
# An identifier not glued to a digit, letter or dot before it: "10m" is no "m".
_IDENT = re.compile(r"(?<![\w:.])[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects, histogram suffixes stripped."""
    text = _STRING.sub('""', expr)
    text = _VARIABLE.sub("", text)
    text = _BRACES.sub("{}", text)
    text = _BRACKETS.sub("[]", text)
    text = _GROUPING.sub(r"\1", text)
    names = set()
    for word in _IDENT.findall(text):
        if word.lower() in PROMQL_WORDS:
            continue
        for suffix in ("_bucket", "_sum", "_count"):
            base = word.removesuffix(suffix)
            if base != word and base in CONTROLLER_HISTOGRAMS:
                word = base
                break
        names.add(word)
    return names


def load_rules() -> dict[str, Any]:
    with RULES.open(encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    assert isinstance(doc, dict), "the rules file must be a mapping"
    return doc


def alerts() -> list[dict[str, Any]]:
    return [rule for group in load_rules()["groups"] for rule in group["rules"]]


def load_dashboard() -> dict[str, Any]:
    with DASHBOARD.open(encoding="utf-8") as f:
        doc = json.load(f)
    assert isinstance(doc, dict)
    return doc


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    return [
        (f"panel {p['id']} ({p.get('title')}) target {t.get('refId')}", t["expr"])
        for p in all_panels(load_dashboard())
        for t in p.get("targets", [])
    ]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not installed: install Debian's prometheus package "
            "(apt-get install --no-install-recommends prometheus)"
        )
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=50, check=False
    )


# -- the metric-name extraction itself -----------------------------------------


@pytest.mark.timeout(60)
def test_metric_names_skips_functions_labels_strings_and_durations() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, protocol) (rate(kiln_bmc_call_seconds_bucket{a="x_y"}'
        "[5m]))) / on (instance) group_left (rack) kiln_nodes offset 10m > 1e3 "
        "or increase(kiln_gpu_xid_total[$__rate_interval])"
    )
    assert metric_names(expr) == {"kiln_bmc_call_seconds", "kiln_nodes", "kiln_gpu_xid_total"}
    # A suffix counts as a histogram's only where the metric is a histogram.
    assert metric_names("kiln_nodes_count") == {"kiln_nodes_count"}


# -- the rules file ------------------------------------------------------------


@pytest.mark.timeout(60)
def test_rules_file_has_the_prometheus_rule_file_shape() -> None:
    doc = load_rules()
    assert set(doc) == {"groups"}
    groups = doc["groups"]
    assert [g["name"] for g in groups] == ["dcgm", "kiln"]
    names = set()
    for group in groups:
        assert set(group) <= {"name", "interval", "limit", "rules"}, group["name"]
        assert group["rules"], f"group {group['name']} has no rules"
        for rule in group["rules"]:
            name = rule.get("alert")
            assert isinstance(name, str) and name, f"a rule of {group['name']} has no alert name"
            assert name not in names, f"alert {name} is defined twice"
            names.add(name)
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), name
            assert rule.get("labels", {}).get("severity") in {"critical", "warning", "info"}, name
            annotations = rule.get("annotations", {})
            assert annotations.get("summary"), f"{name} has no summary"
            assert annotations.get("description"), f"{name} has no description"


@pytest.mark.timeout(60)
def test_rules_use_only_documented_metrics() -> None:
    for rule in alerts():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        unknown = names - DOCUMENTED
        assert not unknown, f"{rule['alert']} uses undocumented metric(s) {sorted(unknown)}"


@pytest.mark.timeout(60)
def test_promtool_accepts_the_rules() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


GPU = {"gpu": "0", "UUID": "GPU-1", "Hostname": "h200-r01-t01", "instance": "a:9400"}
CTL = {"instance": "ctl:9100", "job": "kiln-controller"}


@pytest.mark.timeout(60)
def test_promtool_unit_tests_of_the_alerts(tmp_path: Path) -> None:
    """A few alerts against made-up series: they fire when they should, not before."""
    xid79 = {**GPU, "xid": "79"}
    xid13 = {**GPU, "xid": "13"}
    ready = {"state": "ready", "rack": "r01"}
    quarantined = {"state": "quarantined", "rack": "r01"}
    bmc = {"protocol": "redfish", "operation": "power_state"}
    # promtool compares annotations too; these tests are about when alerts
    # fire (promtool check rules has parsed the templates), so drop them.
    rules = load_rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules_path = tmp_path / "kiln-alerts.yml"
    rules_path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    tests = {
        "rule_files": [str(rules_path)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    _series("DCGM_FI_DEV_GPU_TEMP", GPU, "90x10"),
                    # An XID's series appears at its first XID, already at 1.
                    _series("kiln_gpu_xid_total", xid79, "_x15 1x20"),
                    _series("kiln_gpu_xid_total", xid13, "_x15 1x20"),
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "GpuTemperatureHigh", "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": "GpuTemperatureHigh",
                        "exp_alerts": [{"exp_labels": {**GPU, "severity": "warning"}}],
                    },
                    {"eval_time": "14m", "alertname": "GpuCriticalXid", "exp_alerts": []},
                    {
                        "eval_time": "16m",
                        "alertname": "GpuCriticalXid",
                        "exp_alerts": [{"exp_labels": {**xid79, "severity": "critical"}}],
                    },
                    {"eval_time": "30m", "alertname": "GpuCriticalXid", "exp_alerts": []},
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series("kiln_nodes", {**CTL, **ready}, "3x20"),
                    _series("kiln_nodes", {**CTL, **quarantined}, "0x4 1x15"),
                    _series("kiln_agents_connected", CTL, "3x4 0x15"),
                    _series("kiln_bmc_call_seconds_count", {**CTL, **bmc}, "0+10x30"),
                    _series("kiln_bmc_call_failures_total", {**CTL, **bmc}, "0+1x5 5+5x25"),
                ],
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": "KilnNodesQuarantined", "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": "KilnNodesQuarantined",
                        "exp_alerts": [{"exp_labels": {"rack": "r01", "severity": "warning"}}],
                    },
                    {"eval_time": "3m", "alertname": "KilnNoAgentsConnected", "exp_alerts": []},
                    {
                        "eval_time": "12m",
                        "alertname": "KilnNoAgentsConnected",
                        "exp_alerts": [{"exp_labels": {**CTL, "severity": "critical"}}],
                    },
                    {"eval_time": "8m", "alertname": "KilnBmcCallFailureRatio", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "KilnBmcCallFailureRatio",
                        "exp_alerts": [{"exp_labels": {**bmc, "severity": "warning"}}],
                    },
                    {
                        "eval_time": "10m",
                        "alertname": "KilnControllerMetricsAbsent",
                        "exp_alerts": [],
                    },
                ],
            },
        ],
    }
    path = tmp_path / "kiln-alerts-test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = run_promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


# -- the dashboard -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_dashboard_panels_have_unique_ids_and_a_place() -> None:
    dashboard = load_dashboard()
    assert dashboard.get("schemaVersion", 0) >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    cells: dict[tuple[int, int], int] = {}
    for panel in all_panels(dashboard):
        pos = panel["gridPos"]
        assert set(pos) >= {"h", "w", "x", "y"}, panel["id"]
        assert pos["x"] + pos["w"] <= 24, f"panel {panel['id']} is wider than the grid"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                other = cells.setdefault((x, y), panel["id"])
                assert other == panel["id"], f"panels {other} and {panel['id']} overlap"
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["id"]
            assert panel["targets"], f"panel {panel['id']} has no query"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["id"]


@pytest.mark.timeout(60)
def test_dashboard_uses_only_documented_metrics() -> None:
    exprs = dashboard_exprs()
    assert exprs
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        unknown = names - DOCUMENTED
        assert not unknown, f"{where} uses undocumented metric(s) {sorted(unknown)}"


@pytest.mark.timeout(60)
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each query, Grafana's variables filled in, as a recording rule promtool checks."""
    rules = []
    for i, (_, expr) in enumerate(dashboard_exprs()):
        text = expr.replace("$__rate_interval", "5m").replace("$Hostname", ".*")
        assert "$" not in text, f"a Grafana variable this test does not fill in: {expr!r}"
        rules.append({"record": f"kiln:dashboard_query_{i}", "expr": text})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


# -- the README ------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_readme_documents_every_controller_metric_and_alert() -> None:
    text = README.read_text(encoding="utf-8")
    for name in sorted(CONTROLLER_METRICS):
        assert f"`{name}`" in text, f"README.md does not document {name}"
    for rule in alerts():
        assert f"`{rule['alert']}`" in text, f"README.md does not explain {rule['alert']}"
