"""Queue (tenant) configuration: GPU quotas with borrowing limits.

version: v1
queues:
  - name: research
    gpu_quota: 512        # GPUs the queue may hold; omit for no limit
    borrowing_limit: 128  # GPUs beyond its quota it may borrow when others idle

A queue name is 1-63 letters, digits, ``.``, ``_`` or ``-``, starting with a
letter or digit: it is typed on command lines and shown in events.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from controller.core.errors import InvalidArgument
from controller.placement import QueueConfig

KEYS = frozenset({"name", "gpu_quota", "borrowing_limit"})
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def parse_queues(data: Any, origin: str = "queues") -> list[QueueConfig]:
    """Raises InvalidArgument naming ``origin``, the queue and the problem."""
    if not isinstance(data, dict) or data.get("version") != "v1":
        raise InvalidArgument(f"{origin}: expected a mapping with version: v1")
    unknown = set(data) - {"version", "queues"}
    if unknown:
        raise InvalidArgument(f"{origin}: unknown keys {sorted(unknown)}")
    entries = data.get("queues") or []
    if not isinstance(entries, list):
        raise InvalidArgument(f"{origin}: 'queues' must be a list")
    queues: list[QueueConfig] = []
    for i, entry in enumerate(entries):
        where = f"{origin}: queues[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidArgument(f"{where}: each queue needs a name")
        if not NAME.fullmatch(entry["name"]):
            raise InvalidArgument(
                f"{where}: queue name {entry['name']!r} must be 1-63 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit"
            )
        bad = set(entry) - KEYS
        if bad:
            raise InvalidArgument(f"{where} ({entry['name']}): unknown keys {sorted(bad)}")
        quota = entry.get("gpu_quota")
        borrow = entry.get("borrowing_limit", 0)
        if quota is not None and (not isinstance(quota, int) or quota < 0):
            raise InvalidArgument(f"{where} ({entry['name']}): gpu_quota must be a whole number")
        if not isinstance(borrow, int) or borrow < 0:
            raise InvalidArgument(
                f"{where} ({entry['name']}): borrowing_limit must be a whole number"
            )
        queues.append(QueueConfig(name=entry["name"], gpu_quota=quota, borrowing_limit=borrow))
    names = [q.name for q in queues]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"{origin}: queue names must be unique")
    return queues


def load_queues(path: Path, origin: str | None = None) -> list[QueueConfig]:
    """The queues in ``path``; messages name it as ``origin`` (default: its name).

    Raises InvalidArgument when the file cannot be read, is not UTF-8 or YAML,
    or is not a valid queue configuration.
    """
    where = origin or path.name
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise InvalidArgument(f"{where}: cannot read queues: {e}") from e
    except UnicodeDecodeError as e:
        raise InvalidArgument(
            f"{where}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
        ) from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidArgument(f"{where}: not valid YAML: {' '.join(str(e).split())}") from e
    return parse_queues(data, where)
