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

The limits are checked on the values read (``within_limits``), not by
walking the message again with ``limits.Checker``: a report's strings and
repeated fields are few, and the walk read each of them a second time from
the message (about a third of the digest). The check only says whether the
report is certainly within them; the one over any goes as it came, and the
controller's ``Checker`` refuses it, naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.api.convert import GPU_HEALTH_ORDER, health_values
from controller.api.limits import limit_for
from controller.core.health import REPORT_FIELDS, PackedReport, pack_values
from kiln.v1 import agent_pb2, types_pb2

_AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"]
CONNECT = f"/{_AGENT_SERVICE.full_name}/{_AGENT_SERVICE.methods_by_name['Connect'].name}"

# The fields of a report that have a limit (``limits.Checker`` checks these
# and no others: ``tests/api/test_relay_digest.py`` holds the two lists equal).
CHECKED = {
    "kiln.v1.NodeHealth": ("source", "gpus", "bmc_temps_c", "drift"),
    "kiln.v1.GpuHealth": ("uuid", "xids", "nvlink_down", "clique", "errors"),
}
_REPORT = types_pb2.NodeHealth.DESCRIPTOR.fields_by_name
_GPU = types_pb2.GpuHealth.DESCRIPTOR.fields_by_name
_SOURCE, _GPUS, _BMC_TEMPS = (limit_for(_REPORT[n]) for n in ("source", "gpus", "bmc_temps_c"))
_DRIFT, _DRIFT_EACH = limit_for(_REPORT["drift"]), limit_for(_REPORT["drift"], item=True)
_UUID, _XIDS, _LINKS_DOWN, _CLIQUE = (
    limit_for(_GPU[n]) for n in ("uuid", "xids", "nvlink_down", "clique")
)
_ERRORS, _ERRORS_EACH = limit_for(_GPU["errors"]), limit_for(_GPU["errors"], item=True)
# Where each is in the values (``convert.health_values``).
_SOURCE_AT, _GPUS_AT, _DRIFT_AT = (REPORT_FIELDS.index(n) for n in ("source", "gpus", "drift"))
_UUID_AT, _XIDS_AT, _LINKS_DOWN_AT, _CLIQUE_AT, _ERRORS_AT = (
    GPU_HEALTH_ORDER.index(n) for n in CHECKED["kiln.v1.GpuHealth"]
)


def within_limits(values: Sequence[Any], bmc_temps: int) -> bool:
    """Whether a report's values (``convert.health_values``) are within
    every limit ``limits.Checker`` holds a report to; ``bmc_temps`` is the
    message's count of BMC temperatures (the values keep the finite ones)."""
    gpus = values[_GPUS_AT]
    drift = values[_DRIFT_AT]
    if (
        len(values[_SOURCE_AT]) > _SOURCE
        or len(gpus) > _GPUS
        or bmc_temps > _BMC_TEMPS
        or len(drift) > _DRIFT
        or (drift and max(map(len, drift)) > _DRIFT_EACH)
    ):
        return False
    for gpu in gpus:
        errors = gpu[_ERRORS_AT]
        if (
            len(gpu[_UUID_AT]) > _UUID
            or len(gpu[_XIDS_AT]) > _XIDS
            or len(gpu[_LINKS_DOWN_AT]) > _LINKS_DOWN
            or len(gpu[_CLIQUE_AT]) > _CLIQUE
            or len(errors) > _ERRORS
            or (errors and max(map(len, errors)) > _ERRORS_EACH)
        ):
            return False
    return True


class ReportDigest:
    """The worker's side: ``packed(raw)`` is the report an agent's message
    carries, packed, or None to forward the message as it came."""

    def packed(self, raw: bytes) -> PackedReport | None:
        try:
            message = agent_pb2.AgentMessage.FromString(raw)
        except Exception:  # DecodeError, or nested too deep: the controller refuses it
            return None
        if message.WhichOneof("body") != "health":
            return None
        health = message.health
        # The values packed straight from the message (no typed report between).
        values = health_values(health)
        if not within_limits(values, len(health.bmc_temps_c)):
            return None  # over a limit: the controller refuses it, naming the field
        return pack_values(values)
