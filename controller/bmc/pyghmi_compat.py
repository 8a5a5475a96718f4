"""Work-arounds for three faults in pyghmi's shared IPMI session loop.

pyghmi (1.6.x) runs every IPMI session of a process through module-level
state in ``pyghmi.ipmi.private.session``: one I/O thread, a few shared UDP
sockets (64 BMCs per socket) and two global locks. Kiln reproduced three ways
in which BMCs that never answer stop *every* IPMI call in the process, for
minutes or for good:

1. **Lock-order deadlock.** ``Session.wait_for_rsp`` holds
   ``WAITING_SESSIONS`` while a timed-out session resends
   (``_timedout`` -> ``send_payload``, which takes ``KEEPALIVE_SESSIONS``);
   ``send_payload`` holds ``KEEPALIVE_SESSIONS`` while ``_xmit_packet``
   takes ``WAITING_SESSIONS``. Many sessions timing out together (dead BMCs)
   deadlock within seconds. Both names are made one re-entrant lock, so there
   is no order to get wrong.
2. **A blocking read in the I/O thread.** ``_io_sendto`` switches a shared
   socket to blocking mode from the caller's thread while the I/O thread
   drains it with ``recvfrom``; once a second socket exists (more than 64
   sessions) the I/O thread blocks for good on a socket no packet comes to.
   The drain here reads with ``MSG_DONTWAIT``, whatever the socket's mode.
3. **select() and descriptors >= 1024.** The I/O thread waits in
   ``select.select``, which raises for a descriptor numbered 1024 or more --
   normal in a controller holding connections to a thousand Redfish BMCs --
   and the I/O thread dies with every waiter still waiting. The wait here
   uses ``poll``.

Each patch is applied once, at import of ``controller.bmc.ipmi``, and only if
pyghmi still has the names it replaces (a pyghmi that changed them is left
alone and logged). Kiln's own deadlines bound every IPMI call regardless.
"""

from __future__ import annotations

import logging
import select
import socket
from collections.abc import Sequence
from typing import Any

from pyghmi.ipmi.private import session as _session

LOG = logging.getLogger(__name__)
_APPLIED = False


class _PollSelect:
    """Stands in for the ``select`` module inside pyghmi's session module."""

    @staticmethod
    def select(
        rlist: Sequence[Any],
        wlist: Sequence[Any],
        xlist: Sequence[Any],
        timeout: float | None = None,
    ) -> tuple[list[Any], list[Any], list[Any]]:
        poller = select.poll()
        for sock in rlist:
            poller.register(sock, select.POLLIN)
        wait_ms = None if timeout is None else max(0.0, timeout) * 1000.0
        ready = {fd for fd, _events in poller.poll(wait_ms)}
        return [s for s in rlist if s.fileno() in ready], [], []


def _recvfrom_nowait(sock: socket.socket, size: int) -> tuple[bytes, Any] | None:
    try:
        return sock.recvfrom(size, socket.MSG_DONTWAIT)
    except OSError:  # nothing waiting (EAGAIN) or the socket went away
        return None


def apply() -> None:
    """Patch pyghmi's session module (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    _APPLIED = True
    needed = ("KEEPALIVE_SESSIONS", "WAITING_SESSIONS", "select", "_io_recvfrom")
    missing = [name for name in needed if not hasattr(_session, name)]
    if missing:
        LOG.warning("pyghmi lacks %s; its session loop is not patched", ", ".join(missing))
        return
    _session.KEEPALIVE_SESSIONS = _session.WAITING_SESSIONS
    _session.select = _PollSelect
    _session._io_recvfrom = _recvfrom_nowait
