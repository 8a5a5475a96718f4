"""MQTT topics an event is published to.

Every event goes to ``<prefix>/events``; an event about a node, allocation or
rule also goes to ``<prefix>/nodes/<node>/events``,
``<prefix>/allocations/<id>/events`` and ``<prefix>/rules/<rule>/events``.
Names are escaped into one safe topic level (see :func:`topic_segment`).
"""

from __future__ import annotations

from controller.events.model import Event

DEFAULT_PREFIX = "kiln/v1"

# Characters that would change a topic's meaning: level separator, wildcards,
# NUL, and the escape character itself. Escaped as %XX, so escaping is
# reversible and two different names never share a topic.
_ESCAPES = {"%": "%25", "/": "%2F", "+": "%2B", "#": "%23", "\x00": "%00"}


def topic_segment(name: str) -> str:
    """Escape ``name`` into a single MQTT topic level without wildcards.

    A leading ``$`` is escaped too (brokers reserve ``$`` topics such as
    ``$SYS``). Raises ValueError for an empty name.
    """
    if not name:
        raise ValueError("an MQTT topic level cannot be empty")
    out = "".join(_ESCAPES.get(c, c) for c in name)
    return "%24" + out[1:] if out.startswith("$") else out


def topics_for(event: Event, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Topics to publish ``event`` on: the specific ones first, then the
    all-events topic. Empty names are treated as absent."""
    topics = []
    if event.node:
        topics.append(f"{prefix}/nodes/{topic_segment(event.node)}/events")
    if event.allocation:
        topics.append(f"{prefix}/allocations/{topic_segment(event.allocation)}/events")
    if event.rule:
        topics.append(f"{prefix}/rules/{topic_segment(event.rule)}/events")
    topics.append(f"{prefix}/events")
    return topics
