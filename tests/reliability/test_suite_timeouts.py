"""The suite cannot hang: every test has a deadline, and grpc.aio's runtime is
not torn down (joining its poller thread) between tests."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_has_a_deadline_that_ends_a_hang() -> None:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < ini["timeout"] <= 600 and ini["timeout_method"] == "thread"


def test_a_hung_test_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(
        "import threading\n\ndef test_hangs():\n    threading.Event().wait()\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-o",
            "timeout=3",  # the project's method, a shorter deadline
            str(tmp_path / "test_hangs.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Timeout" in done.stdout + done.stderr
    assert time.monotonic() - started < 60


def poller_threads() -> set[int | None]:
    return {t.ident for t in threading.enumerate() if "_poll_wrapper" in t.name}


def test_grpc_aio_keeps_its_poller_between_tests() -> None:
    async def serve_once() -> None:
        server = grpc.aio.server()
        server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await server.stop(None)

    before = poller_threads()
    asyncio.run(serve_once())  # a test's own loop, closed at its end
    asyncio.run(serve_once())
    assert before and poller_threads() == before, "the poller was joined and started again"
