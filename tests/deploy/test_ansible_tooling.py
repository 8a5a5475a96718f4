"""The playbook and the inventory script under Ansible itself.

These run only where ``ansible-core`` is installed (``pip install
ansible-core``): the structure tests in ``test_ansible_roles.py`` and the
inventory protocol tests in ``test_ansible_inventory.py`` need no Ansible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"


def tool(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install ansible ansible-lint)")
    return found


def env(tmp_path: Path, controller: str = "") -> dict[str, str]:
    # The inventory script's "#!/usr/bin/env python3" must find this
    # interpreter (it has grpcio and the kiln.v1 stubs).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    out = {
        "PATH": path,
        "HOME": str(tmp_path),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
        "ANSIBLE_NOCOLOR": "1",
    }
    if controller:
        out["KILN_CONTROLLER"] = controller
    return out


@pytest.mark.timeout(300)
def test_site_playbook_passes_syntax_check(tmp_path: Path) -> None:
    done = subprocess.run(
        [tool("ansible-playbook"), "--syntax-check", "-i", "examples/hosts.yml", "site.yml"],
        cwd=ANSIBLE,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_ansible_reads_the_fleet_through_the_script(controller_addr: str, tmp_path: Path) -> None:
    with grpc.insecure_channel(controller_addr) as channel:
        fleet_pb2_grpc.FleetServiceStub(channel).EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name="h200-r07-n01",
                bmc_url=f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/1",
                username="admin",
                password="tooling-test-secret",
                rack="r07",
            ),
            timeout=10,
        )
    done = subprocess.run(
        [
            tool("ansible-inventory"),
            "-i",
            "examples/hosts.yml",
            "-i",
            "inventory/kiln_inventory.py",
            "--list",
        ],
        cwd=ANSIBLE,
        env=env(tmp_path, controller_addr),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    inventory = json.loads(done.stdout)
    assert inventory["rack_r07"]["hosts"] == ["h200-r07-n01"]
    assert "h200-r07-n01" in inventory["kiln_nodes"]["hosts"]
    assert inventory["kiln_controllers"]["hosts"] == ["kiln-ctl-01"]
    assert inventory["_meta"]["hostvars"]["h200-r07-n01"]["rack"] == "r07"
    assert "tooling-test-secret" not in done.stdout


@pytest.mark.timeout(600)
def test_ansible_lint_is_clean(tmp_path: Path) -> None:
    """``ansible-lint`` over ansible/ (the production profile): no failure, no warning."""
    lint = tool("ansible-lint")
    done = subprocess.run(
        [lint, "--offline", "--nocolor", "--profile", "production"],
        cwd=ANSIBLE,
        env={
            "PATH": env(tmp_path)["PATH"],
            "HOME": str(tmp_path),
            "NO_COLOR": "1",
            "ANSIBLE_LINT_SKIP_VERSION_CHECK": "1",
        },
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "Passed: 0 failure(s), 0 warning(s)" in report, report
