"""A controller with authentication on, and the calls the security tests make.

``SecuredController`` runs a real controller (``peers.ControllerThread``) on
127.0.0.1 with ``auth=True`` and a bootstrap admin token file; ``call``
makes one FleetService call with a bearer token (or none) and ``refusal``
returns the status and message a refused call ends with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from peers import ControllerThread

from controller.server import ControllerConfig
from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2, fleet_pb2_grpc


def dead_bmc() -> str:
    """A loopback BMC URL where nothing listens (every BMC call fails fast)."""
    return f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/1"


BMC_PASSWORD = "bmc-Pa55word-never-shown"


@dataclass
class SecuredController:
    state_dir: Path
    channel_credentials: grpc.ChannelCredentials | None = None
    config: dict[str, Any] = field(default_factory=dict)
    address: str = ""
    admin: str = ""

    def __post_init__(self) -> None:
        token_file = self.state_dir / "admin.token"
        self.thread = ControllerThread(
            ControllerConfig(
                listen="127.0.0.1:0",
                state_dir=self.state_dir,
                reconcile_interval=0.2,
                auth=True,
                bootstrap_token_file=token_file,
                **self.config,
            )
        )
        self.address = self.thread.start()
        self.admin = token_file.read_text().strip()
        if self.channel_credentials is None:
            self.channel = grpc.insecure_channel(self.address)
        else:
            self.channel = grpc.secure_channel(self.address, self.channel_credentials)
        self.stub = fleet_pb2_grpc.FleetServiceStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.thread.stop()

    def call(self, rpc: str, request: Any, token: str | None = None) -> Any:
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        return getattr(self.stub, rpc)(request, metadata=metadata, timeout=20)

    def stream(self, rpc: str, request: Any, token: str | None = None) -> list[Any]:
        return list(self.call(rpc, request, token))

    def token(self, name: str, role: str, ttl_s: float = 0.0) -> str:
        """A new token of ``role``, made by the bootstrap admin."""
        made = self.call(
            "CreateToken",
            fleet_pb2.CreateTokenRequest(name=name, role=role, ttl_s=ttl_s),
            self.admin,
        )
        return str(made.secret)

    def enroll(self, name: str, token: str | None = None) -> Any:
        return self.call(
            "EnrollNode",
            fleet_pb2.EnrollNodeRequest(
                name=name,
                bmc_url=dead_bmc(),
                username="admin",
                password=BMC_PASSWORD,
                rack="r1",
            ),
            token or self.admin,
        )

    def audit(self, **filters: Any) -> list[Any]:
        reply = self.call("ListAudit", fleet_pb2.ListAuditRequest(**filters), self.admin)
        return list(reply.entries)


def refusal(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """The status code and details ``call`` is refused with (it must be)."""
    try:
        result = call()
        if hasattr(result, "__iter__") and not hasattr(result, "DESCRIPTOR"):
            list(result)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    raise AssertionError("the call was not refused")
