"""Fixtures shared by every test package.

Some tests run a controller on a background thread. CPython 3.11 can fail
with "AST constructor recursion depth mismatch" when two threads compile
code at once (gh-106905), and hypothesis imports (and pytest rewrites) some
modules lazily when its first test runs; importing them here, before any
thread starts, keeps the main thread from compiling while a controller runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis.internal.conjecture.providers  # noqa: F401
import pytest
from peers import ControllerThread, postgres_server


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server for the whole session (started on demand)."""
    with postgres_server() as url:
        yield url


@pytest.fixture
def controller_addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A controller on a fresh SQLite database, serving on 127.0.0.1:PORT."""
    from controller.server import ControllerConfig

    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path_factory.mktemp("controller"),
            reconcile_interval=0.2,
        )
    )
    address = controller.start()
    try:
        yield address
    finally:
        controller.stop()
