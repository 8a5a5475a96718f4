"""The frames between the controller and its relay workers.

The frames and the socket pairs are ``controller.link``'s: a tagged tuple
of plain values each, over socket pairs the controller creates and the
worker alone inherits. A worker has two links, each with the frames below
for its own calls: the agents' streams (``AgentService.Connect``) on one,
every other call on the other, so that an operator's call is never read
behind the reports queued before it (a link's frames go in order, and the
controller stops reading a link whose calls are behind:
``relayed.HIGH``). Call numbers are the worker's, one series for both.

Worker to controller:

* ``(READY,)`` once its port is bound; ``(FAILED, reason)`` when it cannot be;
* ``(OPEN, call, method, metadata, auth, peer, timeout[, request])`` a new
  call: its method's path (one of ``methods.FORWARDED``), its metadata
  pairs, its auth context when the port asks for client certificates
  (``x509_pem_cert``, ``x509_common_name``, ``peer_dns``...; else ``{}``),
  its peer address, the seconds left before its deadline (None: none) and,
  for a method of one request message, that message (then no
  ``MESSAGES`` or ``HALF_CLOSE`` follow for the call);
* ``(MESSAGES, [(call, raw), ...])`` the calls' messages, as received, in order;
* ``(REPORTS, [(call, packed), ...])`` agents' health reports the worker
  has already parsed, checked against the request limits and converted
  (``digest.py``): each is ``core/health.py``'s packed report, what the
  controller would have made of the message. A message that does not pass
  goes as it came, in ``MESSAGES``, for the controller to refuse in its own
  words. A call's messages and reports keep their order across the two;
* ``(HALF_CLOSE, call)`` the client has sent its last message;
* ``(GONE, call)`` the call ended on the client's side (cancelled,
  disconnected) before the controller ended it;
* ``(SENT, call, count)`` the worker has handed ``count`` more of the
  controller's messages for the call to gRPC: the controller sends at most
  ``WINDOW`` a call beyond those (flow control, as gRPC's own would hold
  a server stream whose client reads slowly).

Controller to worker:

* ``(OUT, call, raw)`` a message to send to the client;
* ``(END, call, code, details)`` end the call with this status (a
  ``grpc.StatusCode``'s number; 0 is OK).
"""

from __future__ import annotations

import asyncio
from typing import Any

from controller.link import MAX_FRAME, FrameError, encode, read_frame

__all__ = ["MAX_FRAME", "FrameError", "FrameWriter", "encode", "read_frame"]

READY = 0
FAILED = 1
OPEN = 2
MESSAGES = 3
HALF_CLOSE = 4
GONE = 5
OUT = 6
END = 7
SENT = 8
REPORTS = 9

WINDOW = 64  # a call's messages the controller sends ahead of the worker's SENT

BATCH_BYTES = 8 * 1024 * 1024  # a MESSAGES frame's messages, at most (one may be larger)
HIGH_WATER = 4096  # messages queued for the link before ``room`` waits
HIGH_WATER_BYTES = 64 * 1024 * 1024  # or their bytes


class FrameWriter:
    """Frames out, in order, written by one task: messages (or reports)
    queued back to back go in one ``MESSAGES`` (``REPORTS``) frame, up to
    ``BATCH_BYTES``, and a caller may wait for room (``room``) while too
    many messages or bytes are waiting, which stops it reading more."""

    def __init__(self, writer: asyncio.StreamWriter, *, high_water: int = HIGH_WATER) -> None:
        self._writer = writer
        self._queued: list[tuple[Any, ...]] = []
        self._pending = 0  # messages queued, not yet written
        self._pending_bytes = 0
        self._batch: list[tuple[int, bytes]] | None = None  # the last frame queued, a batch
        self._batch_kind = MESSAGES
        self._batch_bytes = 0  # of that batch
        self._high_water = high_water
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    def send(self, frame: tuple[Any, ...]) -> None:
        if self.closed:
            return
        self._queued.append(frame)
        self._batch = None
        self._wake.set()

    def message(self, call: int, raw: bytes) -> None:
        """A call's message as received (``MESSAGES``)."""
        self._add(MESSAGES, call, raw)

    def report(self, call: int, packed: bytes) -> None:
        """A call's health report, digested (``REPORTS``)."""
        self._add(REPORTS, call, packed)

    def _add(self, kind: int, call: int, data: bytes) -> None:
        if self.closed:
            return
        size = len(data)
        batch = self._batch
        fits = self._batch_bytes + size <= BATCH_BYTES
        if batch is not None and self._batch_kind == kind and fits:
            batch.append((call, data))
            self._batch_bytes += size
        else:
            self._batch = [(call, data)]
            self._batch_kind, self._batch_bytes = kind, size
            self._queued.append((kind, self._batch))
        self._pending += 1
        self._pending_bytes += size
        if self._pending >= self._high_water or self._pending_bytes >= HIGH_WATER_BYTES:
            self._room.clear()
        self._wake.set()

    async def room(self) -> None:
        """Wait while too many messages are queued for the link."""
        if not self._room.is_set():
            await self._room.wait()

    async def run(self) -> None:
        """Write what is queued until the link closes (then return)."""
        writer = self._writer
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                queued, self._queued, self._batch = self._queued, [], None
                self._pending = self._pending_bytes = self._batch_bytes = 0
                # One write, one send, for all that waited (a system call a
                # frame was 9 % of the controller's loop at 250 allocations
                # a second through the relay).
                writer.write(b"".join([encode(frame) for frame in queued]))
                self._room.set()
                await writer.drain()
        except (ConnectionError, RuntimeError):
            pass  # the other side went away
        finally:
            self.closed = True
            self._room.set()
            writer.close()
