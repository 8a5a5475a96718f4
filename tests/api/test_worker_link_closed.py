"""A worker process whose controller closes the link before the worker has
sent all it had to send (a busy controller stopping) stops quietly: no
ERROR, no traceback, exit status 0."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WORKERS = {
    "relay": ["-m", "controller.api.relay.worker", "--listen", "127.0.0.1:0"],
    "bmc reader": ["-m", "controller.bmc.reader.worker"],
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker", sorted(WORKERS))
def test_a_worker_stops_quietly_when_the_controller_closed_the_link_first(worker: str) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'proto'}:{ROOT}"}
    process = subprocess.Popen(
        [sys.executable, *WORKERS[worker], "--link-fd", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    theirs.close()
    # The controller's end reads no more, before the worker is up: the
    # worker's first frame (READY) meets a broken pipe, not the link's end.
    ours.shutdown(socket.SHUT_RD)
    try:
        _, err = process.communicate(timeout=50)
    finally:
        ours.close()
    assert process.returncode == 0, err
    assert "Traceback" not in err and " ERROR " not in err, err
