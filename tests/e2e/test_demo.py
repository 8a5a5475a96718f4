"""`kiln demo`, the README's main job, runs to the end on a smaller fleet."""

from __future__ import annotations

import argparse

from controller.cli.demo import demo


async def test_demo_runs_end_to_end_with_the_thermal_scenario() -> None:
    lines: list[str] = []
    args = argparse.Namespace(
        racks=1,
        hgx=2,
        serve=False,
        listen="127.0.0.1:0",
        power_delay=False,
        timeout=120.0,
        no_thermal=False,
    )
    assert await demo(args, lines.append) == 0, "\n".join(lines)
    text = "\n".join(lines)
    assert "18 nodes in 1 NVLink domain(s)" in text
    assert "gang of 2 HGX H200 nodes" in text and "same allocation: True" in text
    assert "refused     1000 nodes → FAILED_PRECONDITION" in text
    assert "lifecycle   ready 20" in text
    assert "allocation.notice" in text and "allocation.node_replaced" in text
    assert "PowerState=Off" in text
    assert lines[-3].startswith("next ") and "kiln demo --serve" in lines[-3]


def test_demo_serve_keeps_the_fleet_up_for_the_cli() -> None:
    import json
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller.cli.main",
            "demo",
            "--serve",
            "--racks",
            "1",
            "--hgx",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        address = ""
        seen: list[str] = []
        deadline = time.monotonic() + 120
        while not address and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "demo exited before serving"
            seen.append(line)
            match = re.fullmatch(r"127\.0\.0\.1:\d+", line.strip())
            address = match.group(0) if match else ""
        assert address, "demo --serve never printed its address"
        # Steps only: the log lines went to the file the demo named.
        assert not [s for s in seen if s.startswith(("WARNING", "INFO", "ERROR"))], seen
        log_line = next(s for s in seen if s.startswith("log "))
        assert os.path.exists(log_line.split()[-1])
        dashboard = next(s for s in seen if s.startswith("dashboard "))
        url = re.search(r"http://127\.0\.0\.1:\d+/", dashboard)
        assert url, dashboard
        import urllib.request

        with urllib.request.urlopen(url.group(0), timeout=30) as page:  # loopback only
            html = page.read().decode()
        assert "r01" in html and 'class="tray' in html
        listed = subprocess.run(
            [sys.executable, "-m", "controller.cli.main", "-o", "json", "nodes", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KILN_CONTROLLER": address},
        )
        assert listed.returncode == 0, listed.stderr
        nodes = json.loads(listed.stdout)["nodes"]
        assert len(nodes) == 19 and all(n["state"] == "ready" for n in nodes)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
