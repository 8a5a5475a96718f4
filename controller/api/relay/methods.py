"""The methods a relay worker forwards, and each one's shape.

Every method of Kiln's two services (``kiln.v1.FleetService`` and
``kiln.v1.AgentService``), read from their descriptors: a worker must
know whether a call streams its requests or its answers before the first
message reaches the controller. What the controller then does with the
call (serves it, refuses it) is decided there, as for a direct call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from kiln.v1 import agent_pb2, fleet_pb2


class Shape(NamedTuple):
    request_streaming: bool
    response_streaming: bool


FORWARDED: Mapping[str, Shape] = {
    f"/{service.full_name}/{method.name}": Shape(method.client_streaming, method.server_streaming)
    for service in (
        fleet_pb2.DESCRIPTOR.services_by_name["FleetService"],
        agent_pb2.DESCRIPTOR.services_by_name["AgentService"],
    )
    for method in service.methods
}
