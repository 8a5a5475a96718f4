"""Work-arounds for faults in pyghmi's shared IPMI session loop.

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

A fourth fault is not patched but worked around by the driver: pyghmi keeps
every session it made in class-level tables and hands a cached one to the
next ``Command`` for the same BMC address and user, even when that session
belongs to a BMC that has since restarted (its session IDs gone) or whose
logout got no answer (left half logged out). The next call on it fails with
"Session no longer connected", or waits out pyghmi's own retries for a
minute, and every retry gets the same dead session back.
:func:`forget_sessions` drops them without a packet sent; the driver calls it
before it builds a ``Command`` (it owns the BMC's only session, so any cached
one is dead).
"""

from __future__ import annotations

import contextlib
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


def forget_sessions(host: str, port: int, username: str) -> int:
    """Drop every session pyghmi caches for ``username`` on the BMC at
    ``host:port`` (the ones a new ``Command`` could be handed): mark it
    broken, stop its keepalives and retries, and remove it from the tables a
    new ``Command`` would find it in. Sends nothing. Returns how many.

    pyghmi's I/O thread may still route a late packet to a dropped session;
    a broken session ignores it.
    """
    cls = _session.Session
    lock = getattr(_session, "WAITING_SESSIONS", None)
    with lock if lock is not None else contextlib.nullcontext():
        found: dict[int, Any] = {}
        handlers = getattr(cls, "bmc_handlers", {})
        for sockaddr in _sockaddrs(host, port):  # a look-up, not a walk of the fleet's
            by_port = handlers.get(sockaddr)
            if by_port is None:
                continue
            for local_port, sess in list(by_port.items()):
                if _same(sess, host, port, username):
                    found[id(sess)] = sess
                    del by_port[local_port]
            if not by_port:
                handlers.pop(sockaddr, None)
        initting = getattr(cls, "initting_sessions", {})
        for key, sess in list(initting.items()):
            if _same(sess, host, port, username):
                found[id(sess)] = sess
                del initting[key]
        for sess in found.values():
            _drop(cls, sess)
    return len(found)


def _sockaddrs(host: str, port: int) -> list[Any]:
    """The keys pyghmi files ``host:port``'s sessions under in
    ``bmc_handlers``: each address it resolves to, IPv4 ones also in their
    IPv6-mapped form (pyghmi uses that form once it has an IPv6 socket)."""
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)
    except OSError:  # does not resolve: pyghmi cannot have filed a session under it
        return []
    keys: list[Any] = []
    for family, _type, _proto, _name, sockaddr in infos:
        keys.append(sockaddr)
        if family == socket.AF_INET:
            keys.append((f"::ffff:{sockaddr[0]}", sockaddr[1], 0, 0))
    return keys


def _same(sess: Any, host: str, port: int, username: str) -> bool:
    userid = getattr(sess, "userid", None)  # bytes once the session is set up
    return (
        getattr(sess, "bmc", None) == host
        and getattr(sess, "port", None) == port
        and userid in (username, username.encode())
    )


def _drop(cls: Any, sess: Any) -> None:
    getattr(cls, "keepalive_sessions", {}).pop(sess, None)
    getattr(cls, "waiting_sessions", {}).pop(sess, None)
    sess.lastpayload = None
    sess.onlogpayload = None
    sess.logged = 0
    sess.logging = False
    if not getattr(sess, "broken", False):
        sess.broken = True
        pool = getattr(cls, "socketpool", {})
        sock = getattr(sess, "socket", None)
        if sock is not None and pool.get(sock, 0) > 0:
            pool[sock] -= 1


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
