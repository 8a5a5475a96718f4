"""Queue configuration: quotas and borrowing limits, validated on load."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core.errors import InvalidArgument
from controller.core.queues import load_queues, parse_queues
from controller.placement import QueueConfig


def test_queues_load_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(
        "version: v1\nqueues:\n  - {name: research, gpu_quota: 512, borrowing_limit: 64}\n"
        "  - {name: prod}\n"
    )
    assert load_queues(path) == [
        QueueConfig(name="research", gpu_quota=512, borrowing_limit=64),
        QueueConfig(name="prod", gpu_quota=None, borrowing_limit=0),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"version": "v2", "queues": []}, "version: v1"),
        ({"version": "v1", "queues": [{"gpu_quota": 1}]}, "needs a name"),
        ({"version": "v1", "queues": [{"name": "a", "quota": 1}]}, "unknown keys"),
        ({"version": "v1", "queues": [{"name": "a", "gpu_quota": -1}]}, "gpu_quota"),
        ({"version": "v1", "queues": [{"name": "a", "borrowing_limit": "x"}]}, "borrowing"),
        ({"version": "v1", "queues": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"version": "v1", "extra": 1}, "unknown keys"),
    ],
    ids=[
        "bad-version",
        "no-name",
        "unknown-key",
        "negative-quota",
        "bad-borrow",
        "duplicate",
        "unknown-top-key",
    ],
)
def test_bad_queue_config_is_refused_clearly(data: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_queues(data, "queues.yaml")


def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read queues"):
        load_queues(tmp_path / "missing.yaml")
