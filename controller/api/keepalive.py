"""How the controller's gRPC servers notice a peer that is gone without a word.

A node that loses power (or its network) sends no FIN: its agent's stream
stays open on the controller's side, and without keepalive gRPC's servers
ping a quiet connection only after two hours. The controller would then
count the node's agent connected (``AgentHub.is_connected``) long
after the node went dark: it would stay ``usable`` and its health policy
would not read its BMC ("agent silent"), and power sync would trust it as
powered on. So both the controller's server and the agent relay workers'
ping each connection every ``seconds`` (HTTP/2 PING, answered by the peer's
gRPC library, not its application) and close it when a ping is not answered
within ``timeout_s``: a dark node's stream ends within ``seconds +
timeout_s``, and the controller detaches its agent as for any stream that
ends. A peer that answers pings but sends nothing (a quiet agent) keeps its
stream.
"""

from __future__ import annotations

DEFAULT_KEEPALIVE_S = 30.0
KEEPALIVE_TIMEOUT_S = 10.0


def keepalive_options(seconds: float) -> list[tuple[str, int]]:
    """gRPC server options: a PING every ``seconds`` on every connection,
    calls or not, data or not, and the connection closed after
    ``min(seconds, 10)`` s without its answer."""
    if seconds <= 0:
        raise ValueError(f"the keepalive interval must be positive, not {seconds}")
    timeout = min(seconds, KEEPALIVE_TIMEOUT_S)
    return [
        ("grpc.keepalive_time_ms", round(seconds * 1000)),
        ("grpc.keepalive_timeout_ms", round(timeout * 1000)),
        # What this gRPC (1.6x and later) enforces as a ping's deadline: with
        # keepalive_timeout_ms alone a stopped peer held its connection open.
        ("grpc.http2.ping_timeout_ms", round(timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        # gRPC stops pinging after 2 pings with no data frame unless this is 0:
        # a quiet agent's connection would then go unwatched.
        ("grpc.http2.max_pings_without_data", 0),
        # ... nor space its pings over 5 minutes on a connection that sends no data.
        ("grpc.http2.min_time_between_pings_ms", round(seconds * 1000)),
        ("grpc.http2.min_ping_interval_without_data_ms", round(seconds * 1000)),
    ]
