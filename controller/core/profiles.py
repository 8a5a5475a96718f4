"""Named node profiles the controller prepares nodes to.

A profile file is versioned YAML::

    version: v1
    name: h200-mig-balanced
    gpu:            # the agent's GPU profile, see docs/gpu-profiles.md
      persistence_mode: true
      ...

The catalog loads every ``*.yaml`` in a directory when the controller starts
and rejects a malformed file with a message naming the file and the problem.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from controller.core.errors import InvalidArgument, NotFound

KNOWN_KEYS = frozenset(
    {"version", "name", "description", "gpu", "firmware", "bios", "health_gate", "checks"}
)
CHECK_LEVELS = ("quick", "medium", "long")  # controller.checks.LEVELS


@dataclass(frozen=True)
class FirmwareTarget:
    """One line of a firmware baseline: a component pinned to a version."""

    component: str  # the BMC's FirmwareInventory member id or name
    version: str
    image: str  # URL the BMC fetches the image from


@dataclass(frozen=True)
class HealthGate:
    """What a node's GPUs must show before the node is handed to a job."""

    max_gpu_temp_c: float | None = None
    max_ecc_dbe_volatile: int = 0
    allow_remap_pending: bool = False
    require_fabric: bool = False  # NVLink fabric state completed and healthy
    allow_nvlink_down: bool = False
    sample_timeout_s: float = 30.0


@dataclass(frozen=True)
class Profile:
    name: str
    gpu: dict[str, Any]
    raw: dict[str, Any]
    firmware: tuple[FirmwareTarget, ...] = ()
    bios: dict[str, Any] = field(default_factory=dict)
    health_gate: HealthGate | None = None
    checks: str = ""  # a level of the check suite to pass before hand-off ("" none)

    def gpu_yaml(self) -> str:
        body = {"version": "v1", "name": self.name, **self.gpu}
        return yaml.safe_dump(body, sort_keys=False)


def parse_profile(data: Any, origin: str) -> Profile:
    """Raises InvalidArgument naming ``origin`` and what is wrong."""
    if not isinstance(data, dict):
        raise InvalidArgument(f"{origin}: a profile must be a mapping")
    if data.get("version") != "v1":
        raise InvalidArgument(f"{origin}: unsupported profile version {data.get('version')!r}")
    unknown = set(data) - KNOWN_KEYS
    if unknown:
        raise InvalidArgument(f"{origin}: unknown keys {sorted(unknown)}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{origin}: a profile needs a name")
    gpu = data.get("gpu") or {}
    if not isinstance(gpu, dict):
        raise InvalidArgument(f"{origin}: 'gpu' must be a mapping")
    profile = Profile(
        name=name,
        gpu=dict(gpu),
        raw=dict(data),
        firmware=parse_firmware(data.get("firmware"), origin),
        bios=parse_bios(data.get("bios"), origin),
        health_gate=parse_gate(data.get("health_gate"), origin),
        checks=parse_checks(data.get("checks"), origin),
    )
    validate_gpu_section(profile, origin)
    return profile


def parse_checks(data: Any, origin: str) -> str:
    if data in (None, ""):
        return ""
    if data not in CHECK_LEVELS:
        raise InvalidArgument(
            f"{origin}: checks: {data!r} is not a check level ({', '.join(CHECK_LEVELS)})"
        )
    return str(data)


def parse_firmware(data: Any, origin: str) -> tuple[FirmwareTarget, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        raise InvalidArgument(
            f"{origin}: 'firmware' must be a list of {{{{component, version, image}}}}"
        )
    targets = []
    for i, entry in enumerate(data):
        where = f"{origin}: firmware[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"component", "version", "image"}:
            raise InvalidArgument(f"{where}: needs exactly component, version and image")
        if not all(isinstance(entry[k], str) and entry[k] for k in entry):
            raise InvalidArgument(f"{where}: component, version and image must be strings")
        if not entry["image"].startswith(("http://", "https://")):
            raise InvalidArgument(f"{where}: image must be an http(s) URL")
        targets.append(FirmwareTarget(entry["component"], str(entry["version"]), entry["image"]))
    return tuple(targets)


def parse_bios(data: Any, origin: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise InvalidArgument(f"{origin}: 'bios' must map attribute names to values")
    bad = [k for k, v in data.items() if not isinstance(v, str | int | bool)]
    if bad:
        raise InvalidArgument(f"{origin}: bios: {bad[0]} must be a string, number or boolean")
    return dict(data)


def parse_gate(data: Any, origin: str) -> HealthGate | None:
    if data is None:
        return None
    known = {f.name for f in fields(HealthGate)}
    if not isinstance(data, dict) or set(data) - known:
        raise InvalidArgument(
            f"{origin}: health_gate: unknown keys {sorted(set(data) - known)}"
            if isinstance(data, dict)
            else f"{origin}: health_gate must be a mapping"
        )
    try:
        return HealthGate(**data)
    except TypeError as e:
        raise InvalidArgument(f"{origin}: health_gate: {e}") from e


def validate_gpu_section(profile: Profile, origin: str) -> None:
    from kiln_common.gpu_profile import GpuProfile, ProfileError  # the validator agents apply

    try:
        GpuProfile.from_yaml(profile.gpu_yaml())
    except ProfileError as e:
        raise InvalidArgument(f"{origin}: gpu: {e}") from e


def _file_name(path: Path) -> str:
    return path.name


def _read_yaml(path: Path, where: str) -> Any:
    """The YAML document in ``path``. Raises InvalidArgument naming ``where``."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise InvalidArgument(f"{where}: cannot read it: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise InvalidArgument(
            f"{where}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
        ) from e
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidArgument(f"{where}: not valid YAML: {_one_line(e)}") from e


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


class ProfileCatalog:
    def __init__(self, profiles: dict[str, Profile] | None = None) -> None:
        self._profiles = dict(profiles or {})

    @classmethod
    def load(
        cls, directory: Path | None, *, origin: Callable[[Path], str] | None = None
    ) -> ProfileCatalog:
        """Every ``*.yaml`` profile in ``directory`` (None: an empty catalog).

        Messages name each file as ``origin(path)`` (default: its name).

        Raises:
            InvalidArgument: the directory is missing or not a directory; a
                file cannot be read, is not UTF-8 or YAML, or is not a valid
                profile; two files define the same profile name.
        """
        profiles: dict[str, Profile] = {}
        if directory is None:
            return cls(profiles)
        if not directory.is_dir():
            problem = "is not a directory" if directory.exists() else "does not exist"
            raise InvalidArgument(f"profiles directory {directory} {problem}")
        name_of = origin or _file_name
        defined_in: dict[str, str] = {}
        for path in sorted(directory.glob("*.yaml")):
            where = name_of(path)
            profile = parse_profile(_read_yaml(path, where), where)
            if profile.name in defined_in:
                raise InvalidArgument(
                    f"{where}: profile name {profile.name!r} is already defined by "
                    f"{defined_in[profile.name]}"
                )
            defined_in[profile.name] = path.name
            profiles[profile.name] = profile
        return cls(profiles)

    def add(self, profile: Profile) -> None:
        self._profiles[profile.name] = profile

    def names(self) -> list[str]:
        return sorted(self._profiles)

    def get(self, name: str) -> Profile:
        try:
            return self._profiles[name]
        except KeyError:
            raise NotFound(kind="profile", name=name) from None

    def gpu_yaml(self, name: str) -> str:
        return self.get(name).gpu_yaml()
