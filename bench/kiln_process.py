"""A real ``kiln-controller`` process for the benchmarks, and what /proc says of it.

``Controller`` starts ``python -m controller.main`` on a free loopback port
with its log in a file, waits for gRPC health SERVING (with a timeout), and
reads the process's CPU (``utime + stime`` of ``/proc/PID/stat``, all threads)
and memory (``VmRSS``, ``VmHWM``) while it runs. ``stop`` sends SIGTERM and
kills it if it has not exited within a few seconds; use it in ``finally``.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "proto")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from controller.sim.ports import free_port  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
POWER_SYNC_LINE = re.compile(
    r"power sync: (\d+) BMCs in ([\d.]+)s, (\d+) changed, (\d+) not as expected"
)


def interrupt_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, a supervisor) interrupt like Ctrl-C, so that
    the ``finally`` blocks that stop the child processes run."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one (children inherit it)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def with_children(pid: int) -> list[int]:
    """``pid`` and its child processes (a controller's relay workers and BMC readers)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return [pid, *(int(c) for c in children)]


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its children now (a child that has exited
    drops out: read before and after the same window)."""
    total = 0.0
    for each in with_children(pid):
        try:
            total += cpu_seconds(each)
        except OSError:
            pass  # it exited between the listing and the read
    return total


def thread_schedule(pid: int) -> dict[int, tuple[float, float]]:
    """Each thread of process ``pid``: (seconds it ran on a CPU, seconds it
    was runnable but waited for one), since it started
    (``/proc/PID/task/TID/schedstat``). Empty where the kernel keeps no such
    figures."""
    found: dict[int, tuple[float, float]] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            ran, waited, _slices = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue  # gone, or a kernel without schedstats
        found[int(tid)] = (int(ran) / 1e9, int(waited) / 1e9)
    return found


def busiest_threads(
    before: dict[int, tuple[float, float]],
    after: dict[int, tuple[float, float]],
    seconds: float,
    *,
    floor: float = 0.02,
) -> list[tuple[float, float]]:
    """(cores running, cores waiting for a CPU) of each thread that ran at
    least ``floor`` of a core between two ``thread_schedule`` readings,
    busiest first."""
    shares = []
    for tid, (ran, waited) in after.items():
        ran0, waited0 = before.get(tid, (0.0, 0.0))
        if (ran - ran0) / seconds >= floor:
            shares.append(((ran - ran0) / seconds, (waited - waited0) / seconds))
    return sorted(shares, reverse=True)


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process ``pid`` in MiB."""
    values = {"VmRSS": 0.0, "VmHWM": 0.0}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in values:
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Controller:
    """One ``kiln-controller`` process on loopback (no authentication there)."""

    def __init__(self, state_dir: Path, log_path: Path, extra: Sequence[str] = ()) -> None:
        self.state_dir = state_dir
        self.log_path = log_path
        self.extra = list(extra)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.monotonic() just before the process was made
        self._log_offset = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        self.port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), str(ROOT / "proto"), env.get("PYTHONPATH", "")]
        )
        argv = [
            sys.executable, "-m", "controller.main",
            "--listen", self.address,
            "--state-dir", str(self.state_dir),
            *self.extra,
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_serving(self, timeout: float = 120.0) -> float:
        """Block until gRPC health says SERVING; seconds since ``start``.

        Raises RuntimeError when the process exits or ``timeout`` passes first.
        """
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.monotonic() - self.started_at
                except grpc.RpcError:
                    pass
                if not self.alive():
                    raise RuntimeError(f"kiln-controller exited; see {self.log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"kiln-controller not SERVING after {timeout:.0f}s")
                time.sleep(0.02)

    def cpu(self) -> float:
        """CPU seconds of the controller and its helper processes."""
        return tree_cpu_seconds(self.pid)

    def own_cpu(self) -> float:
        """CPU seconds of the controller's own process."""
        return cpu_seconds(self.pid)

    def memory(self) -> tuple[float, float]:
        return memory_mib(self.pid)

    def new_log_lines(self) -> list[str]:
        """Lines the controller logged since the last call (whole lines only)."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._log_offset += end
        return data[:end].decode(errors="replace").splitlines()

    def log_count(self, needle: str) -> int:
        with open(self.log_path, errors="replace") as f:
            return sum(1 for line in f if needle in line)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; the exit code (None: never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def kill_all(procs: Sequence[subprocess.Popen[Any]]) -> None:
    """Terminate each child still running, then kill what is left (no waits beyond 5 s)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


class StoreWriter:
    """Writes a controller's SQLite database directly with the controller's
    own store code (``open_engine`` migrates it; ``SqlTx`` repositories seal
    the BMC passwords with ``STATE_DIR/secret.key``, made here when absent, as
    the controller would). Only while no controller runs on it."""

    def __init__(self, state_dir: Path) -> None:
        from controller.store.engine import default_sqlite_url, open_engine
        from controller.store.secrets import SecretBox

        self.engine = open_engine(default_sqlite_url(state_dir))
        self.secrets = SecretBox.from_key_file(state_dir / "secret.key")

    def batch(self, fill: Callable[[Any], None]) -> None:
        """Run ``fill(tx)`` (a ``controller.store.sql_store.SqlTx``) in one transaction."""
        from controller.store.link import Link
        from controller.store.sql_store import SqlTx

        with self.engine.begin() as connection:
            link = Link(connection)
            tx = SqlTx(link, self.secrets)
            fill(tx)
            link.flush()
            tx.events.flush()  # events go in as one INSERT at the end of a unit
            link.close()

    def close(self) -> None:
        self.engine.dispose()
