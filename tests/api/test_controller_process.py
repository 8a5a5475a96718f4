"""`kiln-controller` as operators run it: a real process, its flags, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.sim.ports import free_port


def test_controller_process_serves_then_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "queues.yaml").write_text("version: v1\nqueues:\n  - {name: research}\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller.main",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
            "--queues",
            str(tmp_path / "queues.yaml"),
            "--reconcile-interval",
            "0.3",
            "--power-sync-interval",
            "5",
            "--agent-silent-after",
            "5",
            "--bmc-thermal-interval",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                    # NOT_SERVING: the port is bound, the controller still starting
                    assert time.monotonic() < deadline, "controller never served"
                    time.sleep(0.2)
                except grpc.RpcError:
                    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                    assert time.monotonic() < deadline, "controller never answered"
                    time.sleep(0.2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert (tmp_path / "state" / "kiln.db").exists()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert f"listening on 127.0.0.1:{port}" in out and "Traceback" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_queue_file_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "queues.yaml"
    bad.write_text("version: v1\nqueues:\n  - {name: a, gpu_quota: -3}\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller.main",
            "--queues",
            str(bad),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("kiln-controller: error: queues.yaml")
    assert "gpu_quota" in done.stderr and "Traceback" not in done.stderr


async def test_fallback_timing_reaches_the_policy_runner(tmp_path: Path) -> None:
    from controller.server import ControllerConfig, ControllerServer

    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path,
            agent_silent_after=3.0,
            bmc_thermal_interval=1.5,
        )
    )
    await server.start()
    try:
        assert server.fleet is not None
        assert server.fleet.policies.silent_after == 3.0
        assert server.fleet.policies.bmc_sample_interval == 1.5
    finally:
        await server.stop()
