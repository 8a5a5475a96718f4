"""Small builders of API messages for the CLI's rendering tests."""

from __future__ import annotations

from typing import Any

from kiln.v1 import fleet_pb2, types_pb2


def make_node(name: str = "gb200-r01-t01", **fields: Any) -> Any:
    """A Node message with plausible defaults; ``fields`` override them."""
    values: dict[str, Any] = {
        "name": name,
        "rack": "r01",
        "leaf": "leaf-1",
        "spine": "spine-1",
        "bmc_url": "redfish://127.0.0.1:8000",
        "bmc_username": "admin",
        "state": types_pb2.NODE_STATE_READY,
        "power": types_pb2.POWER_STATE_ON,
        "bmc_health": "ok",
        "agent_connected": True,
        "gpu_model": "GB200",
        "gpu_count": 4,
        "schedulable": True,
    }
    values.update(fields)
    return fleet_pb2.Node(**values)


def make_gpu_health(index: int, **fields: Any) -> Any:
    """A GpuHealth sample; optional readings are absent unless given."""
    return types_pb2.GpuHealth(index=index, uuid=f"GPU-{index:04d}", **fields)


def make_progress(node: str, done: int, total: int, error: str = "") -> Any:
    """One PowerNodes progress message: ok unless ``error`` is given."""
    return fleet_pb2.PowerProgress(
        node=node,
        ok=not error,
        power=types_pb2.POWER_STATE_UNKNOWN if error else types_pb2.POWER_STATE_ON,
        error=error,
        done=done,
        total=total,
    )
