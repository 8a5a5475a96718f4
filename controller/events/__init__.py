"""Events: every state change as a record, published to MQTT via an outbox.

See ``docs/events.md`` for kinds, topics and the JSON schema.
"""

from controller.events.model import EVENT_SCHEMA, Event, EventKind
from controller.events.outbox import EventLog, EventOutbox, MemoryOutbox
from controller.events.publisher import MqttPublisher
from controller.events.topics import DEFAULT_PREFIX, topic_segment, topics_for

__all__ = [
    "DEFAULT_PREFIX",
    "EVENT_SCHEMA",
    "Event",
    "EventKind",
    "EventLog",
    "EventOutbox",
    "MemoryOutbox",
    "MqttPublisher",
    "topic_segment",
    "topics_for",
]
