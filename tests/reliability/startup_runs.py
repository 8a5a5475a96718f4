"""Running the real ``kiln-controller`` entry point as operators and systemd do.

``refused(args)`` runs it to completion and returns what a supervisor sees;
``Controller`` keeps one running for a test and stops it. Everything listens
on 127.0.0.1.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def entry_point() -> list[str]:
    """The installed ``kiln-controller`` script, else the module it runs."""
    script = Path(sys.executable).with_name("kiln-controller")
    if script.exists():
        return [str(script)]
    found = shutil.which("kiln-controller")
    return [found] if found else [sys.executable, "-m", "controller.main"]


@dataclass(frozen=True)
class Exit:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return self.stderr.splitlines()


def run(args: list[str], timeout: float = 60) -> Exit:
    """Run ``kiln-controller ARGS`` until it exits (a hang fails the test)."""
    started = time.monotonic()
    done = subprocess.run([*entry_point(), *args], capture_output=True, text=True, timeout=timeout)
    return Exit(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def health(address: str, timeout: float = 1.0) -> int | None:
    """The overall health status at ``address`` (None: no answer)."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        except grpc.RpcError:
            return None
    return int(reply.status)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Controller:
    """A ``kiln-controller`` process; ``stop()`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, args: list[str], port: int) -> None:
        self.address = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [*entry_point(), "--listen", self.address, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.output: tuple[str, str] | None = None

    def wait_health(self, status: int, within: float = 30) -> None:
        deadline = time.monotonic() + within
        while health(self.address) != status:
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited: {self.finish()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.address} never reported health {status}")
            time.sleep(0.2)

    def wait_exit(self, within: float) -> int:
        try:
            return self.proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {within}s") from None

    def finish(self) -> tuple[str, str]:
        """Stop it if it still runs; its stdout and stderr."""
        if self.output is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.output = self.proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.output = self.proc.communicate()
        return self.output
