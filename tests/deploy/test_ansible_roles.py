"""The Ansible roles and playbook: structure, and that what they install works.

Ansible itself is not needed: YAML is read with PyYAML, templates are
rendered with Jinja2 as Ansible's ``template`` module renders them, the
systemd units' command lines are parsed by the real ``kiln-controller`` and
``kiln-agent`` argument parsers, and the broker configuration is run by a
real ``mosquitto`` on loopback.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import pytest
from ansible_tree import ANSIBLE, ROLES, exec_start, load, render, role_file, role_vars

from agent.main import build_parser as agent_parser
from controller.main import build_parser as controller_parser
from controller.sim.ports import free_port

SERVICE_ROLES = ("kiln_controller", "kiln_agent", "mosquitto")
ALL_ROLES = (*SERVICE_ROLES, "kiln_install")
PREFIX = {
    "kiln_controller": "kiln_controller_",
    "kiln_agent": "kiln_agent_",
    "mosquitto": "mosquitto_",
    "kiln_install": "kiln_install_",
}
# Variables Ansible itself supplies to every template.
MAGIC = {"ansible_managed", "inventory_hostname", "groups"}
GROUPS = {"kiln_controllers": ["ctl-1"], "kiln_brokers": ["ctl-1"], "kiln_nodes": ["gb200-r01-t01"]}


def tasks(role: str) -> list[dict[str, Any]]:
    return list(role_file(role, "tasks"))


def handlers(role: str) -> list[dict[str, Any]]:
    path = ROLES / role / "handlers" / "main.yml"
    return list(load(path)) if path.exists() else []


def module_of(task: dict[str, Any]) -> str:
    modules = [k for k in task if k.startswith("ansible.")]
    assert len(modules) == 1, task
    return modules[0]


def test_every_yaml_file_parses() -> None:
    files = sorted(ANSIBLE.rglob("*.yml"))
    assert len(files) >= 12
    for path in files:
        assert load(path) is not None, path


def test_site_runs_each_role_on_its_group() -> None:
    plays = load(ANSIBLE / "site.yml")
    hosts = {play["hosts"]: [r["role"] for r in play["roles"]] for play in plays}
    assert hosts == {
        "kiln_brokers": ["mosquitto"],
        "kiln_controllers": ["kiln_controller"],
        "kiln_nodes": ["kiln_agent"],
    }
    for play in plays:
        assert play["become"] is True
        assert play["name"]


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_service_roles_have_defaults_tasks_templates_handlers(role: str) -> None:
    assert isinstance(role_file(role, "defaults"), dict)
    assert tasks(role)
    assert handlers(role)
    assert sorted((ROLES / role / "templates").glob("*.j2"))


@pytest.mark.parametrize("role", ALL_ROLES)
def test_tasks_are_named_and_use_builtin_modules(role: str) -> None:
    for task in tasks(role) + handlers(role):
        assert task.get("name"), task
        assert module_of(task).startswith("ansible.builtin."), task


@pytest.mark.parametrize("role", ALL_ROLES)
def test_defaults_are_prefixed_with_the_role(role: str) -> None:
    for key in role_file(role, "defaults"):
        assert key.startswith(PREFIX[role]), key


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_templates_exist_and_all_are_used(role: str) -> None:
    used = {
        t[module_of(t)]["src"] for t in tasks(role) if module_of(t) == "ansible.builtin.template"
    }
    present = {p.name for p in (ROLES / role / "templates").glob("*.j2")}
    assert used == present


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_templates_use_only_variables_the_role_defines(role: str) -> None:
    known = set(MAGIC)
    for name in [role, *(["kiln_install"] if role.startswith("kiln_") else [])]:
        known |= set(role_file(name, "defaults"))
    env = jinja2.Environment()
    for path in (ROLES / role / "templates").glob("*.j2"):
        ast = env.parse(path.read_text(encoding="utf-8"))
        loop_vars = {"arg", "line", "listener"}
        missing = jinja2.meta.find_undeclared_variables(ast) - known - loop_vars
        assert not missing, f"{path.name}: {sorted(missing)}"


def test_every_notification_reaches_a_handler() -> None:
    # kiln_install runs as a dependency of the controller and agent roles,
    # so their handlers answer its notifications.
    for role in ALL_ROLES:
        peers = [role] if role != "kiln_install" else ["kiln_controller", "kiln_agent"]
        for peer in peers:
            names = {h["name"] for h in handlers(peer)} | {
                h["listen"] for h in handlers(peer) if "listen" in h
            }
            for task in tasks(role):
                notify = task.get("notify", [])
                for target in [notify] if isinstance(notify, str) else notify:
                    assert target in names, (role, peer, target)


def test_agent_and_controller_depend_on_the_install_role() -> None:
    for role in ("kiln_controller", "kiln_agent"):
        deps = role_file(role, "meta")["dependencies"]
        assert deps == [{"role": "kiln_install"}]


def test_secrets_tasks_are_not_logged() -> None:
    for task in tasks("kiln_controller"):
        if "password" in task["name"].lower() and module_of(task) == "ansible.builtin.template":
            assert task["no_log"] is True
            assert task[module_of(task)]["mode"] == "0600"


# -- the systemd units' command lines, parsed by the programs themselves -----


def controller_argv(hostname: str = "ctl-1", **overrides: Any) -> list[str]:
    variables = role_vars("kiln_controller", hostname, GROUPS, **overrides)
    unit = render("kiln_controller", "kiln-controller.service.j2", variables)
    argv = shlex.split(exec_start(unit))
    assert argv[0] == "/opt/kiln/venv/bin/kiln-controller"
    return argv[1:]


def test_controller_unit_defaults() -> None:
    args = controller_parser().parse_args(controller_argv())
    assert args.listen == "0.0.0.0:50051"
    assert args.state_dir == Path("/var/lib/kiln")
    assert args.mqtt == "127.0.0.1:1883"  # the broker is on this host
    assert args.db is None
    assert args.profiles is None and args.rules is None and args.queues is None
    assert args.power_sync_interval == 60.0
    assert args.power_sync_rate is None  # the controller's: 200, or no cap with BMC readers


def test_controller_unit_with_a_remote_broker_and_every_option() -> None:
    argv = controller_argv(
        hostname="ctl-2",
        kiln_controller_db_url="postgresql+psycopg://kiln@db.example/kiln",
        kiln_controller_profiles_src="/src/profiles",
        kiln_controller_rules_src="/src/rules.yaml",
        kiln_controller_queues_src="/src/queues.yaml",
        kiln_controller_verbose=True,
        kiln_controller_power_sync_interval=30,
        kiln_controller_power_sync_rate=500,
    )
    args = controller_parser().parse_args(argv)
    assert args.mqtt == "ctl-1:1883"
    assert args.db == "postgresql+psycopg://kiln@db.example/kiln"
    assert args.profiles == Path("/etc/kiln/profiles")
    assert args.rules == Path("/etc/kiln/rules.yaml")
    assert args.queues == Path("/etc/kiln/queues.yaml")
    assert args.verbose is True
    assert args.power_sync_interval == 30.0
    assert args.power_sync_rate == 500.0


def test_controller_unit_without_a_broker_has_no_mqtt() -> None:
    variables = role_vars("kiln_controller", "ctl-1", {"kiln_controllers": ["ctl-1"]})
    unit = render("kiln_controller", "kiln-controller.service.j2", variables)
    assert "--mqtt" not in unit
    assert "mosquitto.service" not in unit
    args = controller_parser().parse_args(shlex.split(exec_start(unit))[1:])
    assert args.mqtt is None


def test_controller_unit_runs_unprivileged_with_its_state_dir_writable() -> None:
    unit = render(
        "kiln_controller",
        "kiln-controller.service.j2",
        role_vars("kiln_controller", "ctl-1", GROUPS),
    )
    assert "User=kiln\n" in unit
    assert "ReadWritePaths=/var/lib/kiln\n" in unit
    assert "ProtectSystem=strict\n" in unit
    assert "\n[Install]\nWantedBy=multi-user.target\n" in unit


def test_db_password_goes_to_a_root_only_environment_file() -> None:
    variables = role_vars("kiln_controller", "ctl-1", GROUPS, kiln_controller_db_password="s3cr3t")
    assert render("kiln_controller", "controller.env.j2", variables).endswith("PGPASSWORD=s3cr3t\n")
    unit = render("kiln_controller", "kiln-controller.service.j2", variables)
    assert "s3cr3t" not in unit
    assert "EnvironmentFile=-/etc/kiln/controller.env" in unit


@pytest.mark.parametrize(
    ("groups", "overrides", "controller", "nvml"),
    [
        pytest.param(GROUPS, {}, "ctl-1:50051", "real", id="defaults"),
        pytest.param({}, {}, "127.0.0.1:50051", "real", id="no-controller-group"),
        pytest.param(
            GROUPS,
            {"kiln_agent_controller": "10.1.2.3:6000", "kiln_agent_nvml": "fake:h200"},
            "10.1.2.3:6000",
            "fake:h200",
            id="overridden",
        ),
    ],
)
def test_agent_unit(
    groups: dict[str, list[str]], overrides: dict[str, Any], controller: str, nvml: str
) -> None:
    variables = role_vars("kiln_agent", "gb200-r01-t01", groups, **overrides)
    unit = render("kiln_agent", "kiln-agent.service.j2", variables)
    argv = shlex.split(exec_start(unit))
    assert argv[0] == "/opt/kiln/venv/bin/kiln-agent"
    args = agent_parser().parse_args(argv[1:])
    assert args.controller == controller
    assert args.node_name == "gb200-r01-t01"
    assert args.metrics_port == 9400
    assert args.nvml == nvml
    assert "Restart=always" in unit


# -- the broker configuration, run by a real mosquitto -------------------------


def run_broker(config: Path, port: int) -> subprocess.Popen[bytes]:
    """Start ``mosquitto -c config``; return once it accepts TCP connections on ``port``."""
    proc = subprocess.Popen(
        ["mosquitto", "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            pass
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise AssertionError(f"mosquitto exited with {proc.returncode}: {err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("mosquitto did not start listening")
        time.sleep(0.05)


@pytest.mark.parametrize(("anonymous", "accepted"), [(True, True), (False, False)])
def test_mosquitto_config_runs_and_governs_anonymous_access(
    tmp_path: Path, anonymous: bool, accepted: bool
) -> None:
    if shutil.which("mosquitto") is None:
        pytest.fail("mosquitto is not installed (Debian: mosquitto, mosquitto-clients)")
    port = free_port()
    variables = role_vars(
        "mosquitto",
        "ctl-1",
        GROUPS,
        mosquitto_port=port,
        mosquitto_allow_anonymous=anonymous,
        mosquitto_persistence=False,
    )
    config = tmp_path / "kiln.conf"
    config.write_text(render("mosquitto", "kiln.conf.j2", variables), encoding="utf-8")
    assert f"listener {port} 127.0.0.1\n" in config.read_text(encoding="utf-8")
    proc = run_broker(config, port)
    try:
        pub = subprocess.run(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", "kiln/test", "-m", "x"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        assert (pub.returncode == 0) is accepted, pub.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.timeout(60)
def test_agent_unit_with_tls_and_a_token_file() -> None:
    variables = role_vars(
        "kiln_agent",
        "gb200-r01-t01",
        GROUPS,
        kiln_agent_tls_ca_src="/src/ca.pem",
        kiln_agent_tls_cert_src="/src/node.pem",
        kiln_agent_tls_key_src="/src/node-key.pem",
        kiln_agent_token_src="/src/node.token",
    )
    unit = render("kiln_agent", "kiln-agent.service.j2", variables)
    args = agent_parser().parse_args(shlex.split(exec_start(unit))[1:])
    assert args.tls_ca == Path("/etc/kiln/agent/ca.pem")
    assert args.tls_cert == Path("/etc/kiln/agent/agent.pem")
    assert args.tls_key == Path("/etc/kiln/agent/agent.key")
    assert args.token_file == Path("/etc/kiln/agent/agent.token")
    assert "/src/" not in unit  # the host's paths, never the control machine's
    plain = render(
        "kiln_agent", "kiln-agent.service.j2", role_vars("kiln_agent", "gb200-r01-t01", GROUPS)
    )
    assert "--tls-" not in plain and "--token-file" not in plain
