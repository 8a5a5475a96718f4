"""The exit statuses kiln-controller documents are the ones systemd acts on."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from controller import main

ROOT = Path(__file__).resolve().parents[2]


def ansible_tree() -> ModuleType:
    """tests/deploy's reader of the Ansible roles (renders as Ansible does)."""
    spec = importlib.util.spec_from_file_location(
        "reliability_ansible_tree", ROOT / "tests" / "deploy" / "ansible_tree.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def controller_unit() -> dict[str, dict[str, str]]:
    tree = ansible_tree()
    groups = {"kiln_controllers": ["ctl-1"], "kiln_brokers": ["ctl-1"]}
    text = tree.render(
        "kiln_controller",
        "kiln-controller.service.j2",
        tree.role_vars("kiln_controller", "ctl-1", groups),
    )
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = {}
        elif "=" in line and not line.startswith((" ", "#")):
            key, _, value = line.partition("=")
            sections[current][key] = value
    return sections


def test_systemd_restarts_a_controller_that_refused_to_start_or_stood_down() -> None:
    unit = controller_unit()
    service = unit["Service"]
    assert service["Restart"] == "on-failure"  # every non-zero status: 1, 2 and 3
    assert int(service["RestartSec"]) > 0
    assert "RestartPreventExitStatus" not in service
    assert unit["Unit"]["StartLimitIntervalSec"] == "0", "a long database outage must not end it"
    assert {main.EXIT_REFUSED, main.EXIT_STOOD_DOWN, main.EXIT_FAILED} == {1, 2, 3}
    assert main.EXIT_OK == 0


def test_every_exit_status_is_documented() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    documented = {int(code) for code in re.findall(r"^\| `(\d)` \|", doc, re.MULTILINE)}
    assert documented == {main.EXIT_OK, main.EXIT_FAILED, main.EXIT_REFUSED, main.EXIT_STOOD_DOWN}
