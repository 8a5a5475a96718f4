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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controller.core.errors import InvalidArgument, NotFound

KNOWN_KEYS = frozenset({"version", "name", "description", "gpu", "firmware", "bios", "health_gate"})


@dataclass(frozen=True)
class Profile:
    name: str
    gpu: dict[str, Any]
    raw: dict[str, Any]

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
    profile = Profile(name=name, gpu=dict(gpu), raw=dict(data))
    validate_gpu_section(profile, origin)
    return profile


def validate_gpu_section(profile: Profile, origin: str) -> None:
    from agent.gpu_profile import GpuProfile, ProfileError  # the agent's own validator

    try:
        GpuProfile.from_yaml(profile.gpu_yaml())
    except ProfileError as e:
        raise InvalidArgument(f"{origin}: gpu: {e}") from e


class ProfileCatalog:
    def __init__(self, profiles: dict[str, Profile] | None = None) -> None:
        self._profiles = dict(profiles or {})

    @classmethod
    def load(cls, directory: Path | None) -> ProfileCatalog:
        profiles: dict[str, Profile] = {}
        if directory is not None:
            for path in sorted(directory.glob("*.yaml")):
                try:
                    data = yaml.safe_load(path.read_text())
                except yaml.YAMLError as e:
                    raise InvalidArgument(f"{path.name}: not valid YAML: {e}") from e
                profile = parse_profile(data, path.name)
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
