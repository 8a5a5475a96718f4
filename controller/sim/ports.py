"""Loopback port helpers for simulated peers and tests."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1", kind: int = socket.SOCK_STREAM) -> int:
    """Return a port that was free on ``host`` a moment ago (TCP by default, UDP with
    ``kind=socket.SOCK_DGRAM``)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
