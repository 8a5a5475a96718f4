"""SIGHUP reloads the controller's certificate, key and client CA without
dropping agent streams; the agent's certificate expiry shows in `kiln nodes show`.

Everything is real: certificates from `kiln certs`, a `kiln-controller`
process serving mutual TLS, a `kiln-agent` process (NVML fake) holding its
stream across the reloads, the CLI and plain TLS handshakes to see which
certificate is served.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509

from controller.sim.ports import free_port

NODE = "tls-n1"


def kiln(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


class Pki:
    """Certificates made by `kiln certs` in ``root``/A (and a second CA in B)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.a = root / "A"
        ok(kiln("certs", "init", "--dir", str(self.a)))
        self.issue(self.a, "controller", "ctl", "--san", "127.0.0.1")
        self.issue(self.a, "agent", NODE)
        self.issue(self.a, "operator", "ops", "--role", "admin")

    def issue(self, ca: Path, *args: str) -> None:
        ok(kiln("certs", "issue", *args, "--dir", str(ca), "--force"))

    def cli(self, ca: Path, operator: str = "ops") -> list[str]:
        return [
            "--tls-ca",
            str(self.a / "ca.pem"),  # the controller's certificate is always from A
            "--tls-cert",
            str(ca / f"operator-{operator}.pem"),
            "--tls-key",
            str(ca / f"operator-{operator}.key"),
        ]


def served_serial(port: int, pki: Pki) -> int:
    """The serial of the certificate a new handshake gets."""
    context = ssl.create_default_context(cafile=str(pki.a / "ca.pem"))
    context.load_cert_chain(pki.a / "operator-ops.pem", pki.a / "operator-ops.key")
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def certificate_serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def wait_for(what: str, check: Callable[[], bool], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Pki, str, Path, subprocess.Popen[str]]]:
    pki = Pki(tmp_path / "pki")
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes((pki.a / "ca.pem").read_bytes())
    port = free_port()
    log = tmp_path / "controller.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log.open("w") as out:
        controller = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "controller.main",
                "--listen",
                f"127.0.0.1:{port}",
                "--state-dir",
                str(tmp_path / "state"),
                "--tls-cert",
                str(pki.a / "controller-ctl.pem"),
                "--tls-key",
                str(pki.a / "controller-ctl.key"),
                "--tls-client-ca",
                str(client_ca),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    agent: subprocess.Popen[str] | None = None
    try:
        address = f"127.0.0.1:{port}"
        wait_for("the controller serves", lambda: "listening on" in log.read_text())
        enroll = [*pki.cli(pki.a), "--controller", address, "nodes", "enroll", NODE]
        enroll += ["--bmc", "redfish+http://127.0.0.1:9/redfish/v1/Systems/1"]
        ok(kiln(*enroll, "--username", "admin", "--password-file", "-", stdin="pw\n"))
        with (tmp_path / "agent.log").open("w") as out:
            agent = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent.main",
                    "--controller",
                    address,
                    "--node-name",
                    NODE,
                    "--nvml",
                    "fake:h200",
                    "--tls-ca",
                    str(pki.a / "ca.pem"),
                    "--tls-cert",
                    str(pki.a / f"agent-{NODE}.pem"),
                    "--tls-key",
                    str(pki.a / f"agent-{NODE}.key"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        wait_for("the agent registers", lambda: "agent registered" in log.read_text())
        yield pki, address, log, controller
    finally:
        for proc in (agent, controller):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.mark.timeout(180)
def test_sighup_reloads_certificate_and_client_ca_and_keeps_agent_streams(
    fleet: tuple[Pki, str, Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    pki, address, log, controller = fleet
    port = int(address.rpartition(":")[2])
    show = [*pki.cli(pki.a), "--controller", address, "nodes", "show", NODE]
    shown = ok(kiln(*show))
    agent_cert = x509.load_pem_x509_certificate((pki.a / f"agent-{NODE}.pem").read_bytes())
    expiry = agent_cert.not_valid_after_utc.strftime("%Y-%m-%d %H:%M UTC")
    assert f"expires {expiry}" in shown, shown

    # 1. A renewed controller certificate: new handshakes get it at once.
    first = served_serial(port, pki)
    assert first == certificate_serial(pki.a / "controller-ctl.pem")
    pki.issue(pki.a, "controller", "ctl", "--san", "127.0.0.1")
    renewed = certificate_serial(pki.a / "controller-ctl.pem")
    assert renewed != first and served_serial(port, pki) == first  # not before SIGHUP
    controller.send_signal(signal.SIGHUP)
    wait_for("the reload is logged", lambda: "SIGHUP: TLS reloaded" in log.read_text())
    assert served_serial(port, pki) == renewed

    # 2. A new CA added to the client CA bundle: its operators get in.
    b = tmp_path / "pki" / "B"
    ok(kiln("certs", "init", "--dir", str(b), "--name", "Kiln fleet CA 2"))
    pki.issue(b, "operator", "ops2", "--role", "viewer")
    listed = kiln(*pki.cli(b, "ops2"), "--controller", address, "nodes", "list")
    assert listed.returncode != 0  # not yet trusted
    bundle = tmp_path / "client-ca.pem"
    bundle.write_bytes((pki.a / "ca.pem").read_bytes() + (b / "ca.pem").read_bytes())
    controller.send_signal(signal.SIGHUP)
    wait_for("the second reload", lambda: log.read_text().count("SIGHUP: TLS reloaded") == 2)
    assert NODE in ok(kiln(*pki.cli(b, "ops2"), "--controller", address, "nodes", "list"))

    # 3. A broken file is refused on one line; the current files stay in use.
    (pki.a / "controller-ctl.pem").write_text("not a certificate\n")
    controller.send_signal(signal.SIGHUP)
    wait_for("the refusal", lambda: "TLS not reloaded" in log.read_text())
    assert served_serial(port, pki) == renewed

    # The agent's stream was never dropped: one registration, still connected.
    text = log.read_text()
    assert text.count("agent registered") == 1, text
    assert re.search(r"^agent:\s+connected$", ok(kiln(*show)), re.MULTILINE)
    assert controller.poll() is None


def test_certificate_expiry_reads_for_people() -> None:
    from controller.cli.nodes import cert_expiry

    now = 1_800_000_000.0
    assert cert_expiry(0.0, now) == "-"
    assert cert_expiry(now - 1, now).startswith("EXPIRED 2027-01-15")
    assert cert_expiry(now + 30 * 86400, now).endswith("(in 30 days)")
    assert cert_expiry(now + 5 * 3600, now).endswith("(in 5 hours)")
