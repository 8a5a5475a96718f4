"""The agent's NVML backends: real pynvml and a faithful per-node fake.

``open_backend(spec)`` picks one: ``"real"`` or ``"fake:h100"`` / ``"fake:h200"``
/ ``"fake:gb200"``.
"""

from __future__ import annotations

from agent.nvml.backend import NvmlBackend
from agent.nvml.fake import FakeNvml
from agent.nvml.faults import FAULT_KINDS, FaultInjector
from agent.nvml.parts import PARTS, PartSpec, part_by_key
from agent.nvml.real import RealNvml

__all__ = [
    "FAULT_KINDS",
    "PARTS",
    "FakeNvml",
    "FaultInjector",
    "NvmlBackend",
    "PartSpec",
    "RealNvml",
    "open_backend",
    "part_by_key",
]


def open_backend(
    spec: str,
    *,
    node_name: str = "node",
    cluster_uuid: str | None = None,
    clique_id: int = 0,
    seed: int = 0,
) -> NvmlBackend:
    """Build an NVML backend from ``spec``; ValueError for a bad spec.

    The backend is not initialised: call ``nvmlInit()`` (in a thread) first.
    ``cluster_uuid``/``clique_id`` place a fake GB200 tray in an NVLink domain
    (trays of one rack share them); HGX parts ignore them.
    """
    if spec == "real":
        return RealNvml()
    kind, sep, part = spec.partition(":")
    if kind != "fake" or not sep:
        raise ValueError(
            f"bad NVML backend spec {spec!r}; expected 'real' or 'fake:<part>' "
            f"with part one of {', '.join(sorted(PARTS))}"
        )
    try:
        part_spec = part_by_key(part)
    except ValueError as e:
        raise ValueError(f"bad NVML backend spec {spec!r}: {e}") from None
    return FakeNvml(
        part_spec, node_name=node_name, cluster_uuid=cluster_uuid, clique_id=clique_id, seed=seed
    )
