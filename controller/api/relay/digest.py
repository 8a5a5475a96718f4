"""Agents' health reports, digested by the relay worker that receives them.

At a fleet's pace the controller's one interpreter spends most of its time
on agents' reports, and a good part of each on work that needs nothing of
the controller's state: parsing the message, checking it against the
request limits (``controller.api.limits``) and converting it to the core's
typed report, then packing that (``core/health.py`` ``pack_report``) to
hold it. A relay worker, a process of its own, does those steps for each
``AgentService.Connect`` message that is a health report and forwards the
packed report (``frames.REPORTS``); the controller unpacks it (one step,
about a tenth of the four) and hands it on as it would the report it had
made itself (``agent_service.py``). The worker packs the message's values
as it reads them (``convert.health_values``, ``pack_values``): the same
bytes' worth as packing the typed report, without making it (69 against
89 us a report, ``bench/report_digest.py``).

The stream's handler gets the packed report itself, as ``bytes`` in place
of the ``AgentMessage`` (a parsed message is never ``bytes``). Bytes are
never tracked by the cyclic garbage collector, and that matters here: each
stream's last message stays referenced by the frames waiting for the next
one, ten seconds at a fleet's pace, and every object that lives that long
is walked by every young collection (a typed report kept there, about 35
objects a stream, made the young collections of a 25,000-node fleet at its
real pace 4-8 times longer in a first version).

A message that does not parse, is not a report, or is over a limit goes to
the controller as it came (``frames.MESSAGES``), which answers it exactly
as it answers a direct call: the worker still decides nothing.
"""

from __future__ import annotations

from controller.api.convert import health_values
from controller.api.limits import Checker
from controller.core.errors import KilnError
from controller.core.health import PackedReport, pack_values
from kiln.v1 import agent_pb2

_AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"]
CONNECT = f"/{_AGENT_SERVICE.full_name}/{_AGENT_SERVICE.methods_by_name['Connect'].name}"


class ReportDigest:
    """The worker's side: ``packed(raw)`` is the report an agent's message
    carries, packed, or None to forward the message as it came."""

    def __init__(self) -> None:
        self._checker = Checker()

    def packed(self, raw: bytes) -> PackedReport | None:
        try:
            message = agent_pb2.AgentMessage.FromString(raw)
        except Exception:  # DecodeError, or nested too deep: the controller refuses it
            return None
        if message.WhichOneof("body") != "health":
            return None
        try:
            self._checker.check(message)
        except KilnError:  # over a limit: the controller refuses it, naming the field
            return None
        # The values packed straight from the message (no typed report between).
        return pack_values(health_values(message.health))
