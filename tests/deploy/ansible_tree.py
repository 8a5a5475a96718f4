"""Reading ``ansible/`` the way Ansible would, without Ansible: YAML files,
role defaults resolved with plain Jinja2, and templates rendered with the
settings of Ansible's ``template`` module (``trim_blocks``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import yaml

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
ROLES = ANSIBLE / "roles"
# Roles each role pulls in through meta/main.yml, whose defaults it sees too.
DEPENDENCIES = {"kiln_controller": ["kiln_install"], "kiln_agent": ["kiln_install"]}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def role_file(role: str, part: str) -> Any:
    return load(ROLES / role / part / "main.yml")


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined
    )


def role_vars(role: str, hostname: str, groups: dict[str, list[str]], **overrides: Any) -> dict:
    """The role's defaults (and its dependencies'), with ``overrides`` on top,
    every Jinja expression in them resolved."""
    values: dict[str, Any] = {}
    for name in [*DEPENDENCIES.get(role, []), role]:
        values.update(role_file(name, "defaults") or {})
    values.update(overrides)
    context: dict[str, Any] = {"inventory_hostname": hostname, "groups": groups}
    env = environment()

    def resolve(value: Any) -> Any:
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            return env.from_string(value).render(**context, **values)
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    for _ in range(10):  # defaults may refer to other defaults
        resolved = {k: resolve(v) for k, v in values.items()}
        if resolved == values:
            break
        values = resolved
    return {**context, **values}


def render(role: str, template: str, variables: dict[str, Any]) -> str:
    text = (ROLES / role / "templates" / template).read_text(encoding="utf-8")
    return environment().from_string(text).render(**variables)


def exec_start(unit: str) -> str:
    """The ``ExecStart=`` command line of a systemd unit, continuations joined."""
    lines = unit.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("ExecStart="):
            command = line.removeprefix("ExecStart=")
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            return command
    raise AssertionError("no ExecStart= line")
