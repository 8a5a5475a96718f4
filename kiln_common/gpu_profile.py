"""Declarative, versioned GPU profile (clocks, power, persistence, MIG layout).

In the spirit of NVIDIA's mig-parted ``v1`` spec. A profile is validated
completely on load; unknown versions and unknown keys are rejected with a
message naming the offending path. Whether a MIG profile name ("1g.18gb")
exists on a given GPU is checked against the device at apply time, because
names differ by board and driver.

Semantics: ``null`` power limit / clock range means the driver default
(unlocked, default limit). GPUs that no ``mig`` entry selects keep their MIG
configuration; the first entry that selects a GPU wins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["SUPPORTED_VERSIONS", "GpuProfile", "LockedClocks", "MigEntry", "ProfileError"]

SUPPORTED_VERSIONS = ("v1",)
_TOP_KEYS = {"version", "name", "persistence_mode", "power_limit_w", "locked_clocks", "mig"}
_CLOCK_KEYS = {"sm_mhz", "mem_mhz"}
_MIG_KEYS = {"device-filter", "devices", "mig-enabled", "mig-devices"}
_MIG_NAME = re.compile(r"^[1-8]g\.\d+gb(\+me|\+me\.all|-me|\+gfx)?$")


class ProfileError(ValueError):
    """The profile document is invalid; the message names the offending path."""


def _fail(path: str, problem: str) -> ProfileError:
    return ProfileError(f"gpu profile: {path}: {problem}")


def _check_keys(d: Mapping[str, Any], allowed: set[str], path: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise _fail(path, f"unknown key(s) {', '.join(map(repr, unknown))}")


def _range(value: Any, path: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise _fail(path, "expected [min, max] in MHz or null")
    lo, hi = int(value[0]), int(value[1])
    if lo <= 0 or lo > hi:
        raise _fail(path, f"need 0 < min <= max, got [{lo}, {hi}]")
    return lo, hi


@dataclass(frozen=True)
class LockedClocks:
    """Locked SM / memory clock ranges in MHz; None = unlocked (driver default)."""

    sm_mhz: tuple[int, int] | None = None
    mem_mhz: tuple[int, int] | None = None


@dataclass(frozen=True)
class MigEntry:
    """One MIG rule: which GPUs (PCI device filter, indices) get which layout."""

    device_filter: tuple[int, ...] = ()
    devices: tuple[int, ...] | None = None  # None = all
    mig_enabled: bool = False
    mig_devices: tuple[tuple[str, int], ...] = ()

    def selects(self, index: int, pci_device_id: int) -> bool:
        """Whether this entry applies to GPU ``index`` with ``pci_device_id``."""
        if self.device_filter and pci_device_id not in self.device_filter:
            return False
        return self.devices is None or index in self.devices

    @property
    def layout(self) -> dict[str, int]:
        """Requested instances per profile name (counts > 0 only)."""
        return {name: n for name, n in self.mig_devices if n > 0}

    @classmethod
    def from_dict(cls, d: Any, path: str) -> MigEntry:
        if not isinstance(d, Mapping):
            raise _fail(path, "expected a mapping")
        _check_keys(d, _MIG_KEYS, path)
        filters = d.get("device-filter", [])
        if isinstance(filters, str | int):
            filters = [filters]
        if not isinstance(filters, list):
            raise _fail(f"{path}.device-filter", "expected a list of PCI device ids")
        parsed: list[int] = []
        for f in filters:
            try:
                parsed.append(int(f, 16) if isinstance(f, str) else int(f))
            except ValueError:
                raise _fail(f"{path}.device-filter", f"bad PCI device id {f!r}") from None
        devices = d.get("devices", "all")
        dev_tuple: tuple[int, ...] | None
        if devices == "all":
            dev_tuple = None
        elif isinstance(devices, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in devices
        ):
            dev_tuple = tuple(devices)
        else:
            raise _fail(f"{path}.devices", "expected 'all' or a list of GPU indices")
        enabled = d.get("mig-enabled")
        if not isinstance(enabled, bool):
            raise _fail(f"{path}.mig-enabled", "required, true or false")
        layout = d.get("mig-devices", {}) or {}
        if not isinstance(layout, Mapping):
            raise _fail(f"{path}.mig-devices", "expected a mapping of profile name to count")
        pairs: list[tuple[str, int]] = []
        for name, count in layout.items():
            if not isinstance(name, str) or not _MIG_NAME.match(name):
                raise _fail(f"{path}.mig-devices", f"bad MIG profile name {name!r}")
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise _fail(f"{path}.mig-devices.{name}", "expected a count >= 0")
            pairs.append((name, count))
        if pairs and not enabled and any(n for _, n in pairs):
            raise _fail(f"{path}.mig-devices", "instances requested with mig-enabled: false")
        return cls(tuple(parsed), dev_tuple, enabled, tuple(sorted(pairs)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.device_filter:
            out["device-filter"] = [f"0x{f:08X}" for f in self.device_filter]
        out["devices"] = "all" if self.devices is None else list(self.devices)
        out["mig-enabled"] = self.mig_enabled
        if self.mig_devices:
            out["mig-devices"] = dict(self.mig_devices)
        return out


@dataclass(frozen=True)
class GpuProfile:
    """A validated GPU profile. Immutable; build with :meth:`from_dict` / :meth:`from_yaml`."""

    name: str
    version: str = "v1"
    persistence_mode: bool = False
    power_limit_w: int | None = None
    locked_clocks: LockedClocks = field(default_factory=LockedClocks)
    mig: tuple[MigEntry, ...] = ()

    def mig_entry_for(self, index: int, pci_device_id: int) -> MigEntry | None:
        """The first MIG entry selecting this GPU, or None (leave MIG alone)."""
        for entry in self.mig:
            if entry.selects(index, pci_device_id):
                return entry
        return None

    @classmethod
    def from_yaml(cls, text: str) -> GpuProfile:
        """Parse and validate a YAML profile; ProfileError when invalid."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ProfileError(f"gpu profile: not valid YAML: {e}") from e
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, d: Any) -> GpuProfile:
        """Validate a profile given as a dict; ProfileError when invalid."""
        if not isinstance(d, Mapping):
            raise ProfileError("gpu profile: expected a mapping at the top level")
        version = d.get("version")
        if version not in SUPPORTED_VERSIONS:
            raise _fail("version", f"unsupported {version!r}; supported: {SUPPORTED_VERSIONS}")
        _check_keys(d, _TOP_KEYS, "profile")
        name = d.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _fail("name", "required, a non-empty string")
        persistence = d.get("persistence_mode", False)
        if not isinstance(persistence, bool):
            raise _fail("persistence_mode", "expected true or false")
        power = d.get("power_limit_w")
        bad_power = not isinstance(power, int) or isinstance(power, bool) or power <= 0
        if power is not None and bad_power:
            raise _fail("power_limit_w", "expected a positive integer (watts) or null")
        clocks_d = d.get("locked_clocks") or {}
        if not isinstance(clocks_d, Mapping):
            raise _fail("locked_clocks", "expected a mapping")
        _check_keys(clocks_d, _CLOCK_KEYS, "locked_clocks")
        clocks = LockedClocks(
            sm_mhz=_range(clocks_d.get("sm_mhz"), "locked_clocks.sm_mhz"),
            mem_mhz=_range(clocks_d.get("mem_mhz"), "locked_clocks.mem_mhz"),
        )
        mig_d = d.get("mig") or []
        if not isinstance(mig_d, list):
            raise _fail("mig", "expected a list of entries")
        mig = tuple(MigEntry.from_dict(e, f"mig[{i}]") for i, e in enumerate(mig_d))
        return cls(
            name=name,
            version=version,
            persistence_mode=persistence,
            power_limit_w=power,
            locked_clocks=clocks,
            mig=mig,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form; ``from_dict(p.to_dict()) == p``."""
        sm, mem = self.locked_clocks.sm_mhz, self.locked_clocks.mem_mhz
        return {
            "version": self.version,
            "name": self.name,
            "persistence_mode": self.persistence_mode,
            "power_limit_w": self.power_limit_w,
            "locked_clocks": {
                "sm_mhz": list(sm) if sm else None,
                "mem_mhz": list(mem) if mem else None,
            },
            "mig": [e.to_dict() for e in self.mig],
        }

    def to_yaml(self) -> str:
        """YAML form of :meth:`to_dict`."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
