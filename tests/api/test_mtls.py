"""Mutual TLS on the controller's gRPC port: real handshakes on 127.0.0.1.

One throw-away CA (``tls_certs``) signs the controller's certificate (IP SAN
127.0.0.1) and client certificates whose CN (or DNS SAN) names a node, plus
one for an operator. The controller requires client certificates; agents may
only register the node their certificate names.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from peers import ControllerThread
from tls_certs import CertFiles, TestCa

from agent.client import Agent
from agent.main import main as agent_main
from agent.nvml import open_backend
from controller.api.peer_identity import (
    CertificateMismatch,
    CertificateNames,
    authorize_node,
    certificate_names,
)
from controller.cli.main import main as kiln_main
from controller.main import main as controller_main
from controller.server import ControllerConfig
from controller.sim.ports import free_port
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc
from kiln_common.tls import channel_credentials


@dataclass(frozen=True)
class Pki:
    ca: Path
    server: CertFiles
    operator: CertFiles
    node_a: CertFiles  # CN = "tls-a"
    node_b_by_san: CertFiles  # CN = "rack1-slot2", DNS SAN = "tls-b"
    stranger: CertFiles  # signed by another CA, CN = "tls-a"
    stranger_ca: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca = TestCa(tmp_path_factory.mktemp("pki"))
    other = TestCa(tmp_path_factory.mktemp("other-pki"), common_name="not kiln")
    return Pki(
        ca=ca.ca_path,
        server=ca.server(),
        operator=ca.client("operator"),
        node_a=ca.client("tls-a"),
        node_b_by_san=ca.client("rack1-slot2", dns=("tls-b",)),
        stranger=other.client("tls-a"),
        stranger_ca=other.ca_path,
    )


@pytest.fixture(scope="module")
def address(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One controller for the module, serving mutual TLS on 127.0.0.1."""
    controller = ControllerThread(
        ControllerConfig(
            listen="127.0.0.1:0",
            state_dir=tmp_path_factory.mktemp("controller"),
            reconcile_interval=0.2,
            tls_cert=pki.server.cert,
            tls_key=pki.server.key,
            tls_client_ca=pki.ca,
        )
    )
    addr = controller.start()
    try:
        yield addr
    finally:
        controller.stop()


def creds(ca: Path, cert: CertFiles | None) -> grpc.ChannelCredentials:
    made = channel_credentials(ca, cert.cert if cert else None, cert.key if cert else None)
    assert made is not None
    return made


def tls_argv(pki: Pki, who: CertFiles) -> list[str]:
    return ["--tls-ca", str(pki.ca), "--tls-cert", str(who.cert), "--tls-key", str(who.key)]


def enroll(address: str, pki: Pki, name: str) -> None:
    """Enrol ``name`` as the operator (a loopback BMC URL where nothing listens)."""
    with grpc.secure_channel(address, creds(pki.ca, pki.operator)) as channel:
        fleet_pb2_grpc.FleetServiceStub(channel).EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name=name,
                bmc_url=f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/1",
                username="admin",
                password="pw",
                rack="r1",
            ),
            timeout=10,
        )


def get_node(address: str, pki: Pki, name: str) -> fleet_pb2.Node:
    with grpc.secure_channel(address, creds(pki.ca, pki.operator)) as channel:
        return fleet_pb2_grpc.FleetServiceStub(channel).GetNode(
            fleet_pb2.GetNodeRequest(name=name), timeout=10
        )


# --- the transport ---------------------------------------------------------


def test_health_answers_serving_over_mutual_tls(address: str, pki: Pki) -> None:
    with grpc.secure_channel(address, creds(pki.ca, pki.operator)) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    "how", ["plaintext", "no-client-cert", "cert-from-another-ca", "server-unverifiable"]
)
def test_clients_the_controller_must_refuse(address: str, pki: Pki, how: str) -> None:
    if how == "plaintext":
        channel = grpc.insecure_channel(address)
    elif how == "no-client-cert":
        channel = grpc.secure_channel(address, creds(pki.ca, None))
    elif how == "cert-from-another-ca":
        channel = grpc.secure_channel(address, creds(pki.ca, pki.stranger))
    else:  # the client does not trust the controller's CA
        channel = grpc.secure_channel(address, creds(pki.stranger_ca, pki.stranger))
    with channel, pytest.raises(grpc.RpcError) as caught:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


# --- the CLI ----------------------------------------------------------------


def run_kiln(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = kiln_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_with_the_operator_certificate_enrolls_and_lists(
    address: str, pki: Pki, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    password = tmp_path / "pw"
    password.write_text("pw\n")
    bmc = f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/1"
    base = ["--controller", address, *tls_argv(pki, pki.operator)]
    code, _, err = run_kiln(
        capsys,
        *base,
        "nodes",
        "enroll",
        "cli-n1",
        "--bmc",
        bmc,
        "--username",
        "admin",
        "--password-file",
        str(password),
    )
    assert code == 0, err
    code, out, err = run_kiln(capsys, *base, "nodes", "list")
    assert code == 0, err
    assert "cli-n1" in [line.split()[0] for line in out.splitlines()[1:]]


def test_cli_takes_the_tls_files_from_the_environment(
    address: str, pki: Pki, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_TLS_CA", str(pki.ca))
    monkeypatch.setenv("KILN_TLS_CERT", str(pki.operator.cert))
    monkeypatch.setenv("KILN_TLS_KEY", str(pki.operator.key))
    code, out, err = run_kiln(capsys, "--controller", address, "nodes", "list")
    assert (code, err) == (0, "")
    assert out.splitlines()[0].split()[:3] == ["NAME", "RACK", "STATE"]


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        pytest.param("plaintext", "cannot reach controller at {addr} (UNAVAILABLE)", id="plain"),
        pytest.param("no-cert", "cannot reach controller at {addr} over TLS", id="no-cert"),
        pytest.param(
            "wrong-ca",
            "TLS handshake with controller at {addr} failed (CERTIFICATE_VERIFY_FAILED)",
            id="wrong-ca",
        ),
        pytest.param("missing-key", "cannot read TLS private key", id="missing-key"),
        pytest.param("cert-no-key", "a TLS client certificate and its key", id="cert-no-key"),
    ],
)
def test_cli_tls_failures_are_one_clear_line(
    address: str, pki: Pki, capsys: pytest.CaptureFixture[str], how: str, expected: str
) -> None:
    tls = {
        "plaintext": [],
        "no-cert": ["--tls-ca", str(pki.ca)],
        "wrong-ca": [*tls_argv(pki, pki.operator)[2:], "--tls-ca", str(pki.stranger_ca)],
        "missing-key": [*tls_argv(pki, pki.operator)[:4], "--tls-key", "/nonexistent/key.pem"],
        "cert-no-key": tls_argv(pki, pki.operator)[:4],
    }[how]
    code, out, err = run_kiln(capsys, "--controller", address, *tls, "nodes", "list")
    assert code == (2 if how in ("missing-key", "cert-no-key") else 1)
    assert out == ""
    assert err.startswith("kiln: error: " + expected.format(addr=address)), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_process_handshake_failure_prints_one_line(address: str, pki: Pki) -> None:
    """grpc-core logs handshake failures itself; the CLI's stderr stays one line."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller.cli.main",
            "--controller",
            address,
            "--tls-ca",
            str(pki.stranger_ca),
            "nodes",
            "list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines == [
        f"kiln: error: TLS handshake with controller at {address} failed "
        "(CERTIFICATE_VERIFY_FAILED); check --tls-ca, --tls-cert and --tls-key"
    ], done.stderr


# --- agents -----------------------------------------------------------------


class Agents:
    """Agents a test starts on its loop; ``stop_all`` stops and awaits them."""

    def __init__(self) -> None:
        self._running: list[tuple[Agent, asyncio.Task[None]]] = []

    def start(self, agent: Agent) -> Agent:
        self._running.append((agent, asyncio.create_task(agent.run())))
        return agent

    async def stop_all(self) -> None:
        for agent, _ in self._running:
            await agent.stop()
        tasks = [task for _, task in self._running]
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


@pytest.fixture
async def agents() -> AsyncIterator[Agents]:
    running = Agents()
    try:
        yield running
    finally:
        await running.stop_all()


@pytest.mark.parametrize(
    ("node", "cert"),
    [
        pytest.param("tls-a", "node_a", id="by-cn"),
        pytest.param("tls-b", "node_b_by_san", id="by-san"),
    ],
)
async def test_agent_with_its_own_certificate_registers(
    address: str, pki: Pki, agents: Agents, node: str, cert: str
) -> None:
    await asyncio.to_thread(enroll, address, pki, node)
    agent = agents.start(
        Agent(
            address,
            node,
            open_backend("fake:h200"),
            backend="fake:h200",
            backoff=(0.1, 1.0),
            channel_credentials=creds(pki.ca, getattr(pki, cert)),
        )
    )
    await asyncio.wait_for(agent.registered.wait(), 20)
    shown = await asyncio.to_thread(get_node, address, pki, node)
    assert shown.agent_connected
    assert len(shown.gpus) == 8
    assert all("H200" in g.model for g in shown.gpus)


async def test_agent_with_another_nodes_certificate_is_refused(
    address: str, pki: Pki, agents: Agents, caplog: pytest.LogCaptureFixture
) -> None:
    await asyncio.to_thread(enroll, address, pki, "victim")
    # The raw call: the status and message the controller answers with.
    async with grpc.aio.secure_channel(address, creds(pki.ca, pki.node_a)) as channel:
        register = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="victim"))
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(iter([register]))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(call.read(), 10)
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.details() == "certificate for 'tls-a' cannot register node 'victim'"

    # A whole agent: refused, never registered, and the node stays disconnected.
    caplog.set_level(logging.INFO, logger="agent.client")
    agent = agents.start(
        Agent(
            address,
            "victim",
            open_backend("fake:h200"),
            backoff=(0.1, 1.0),
            channel_credentials=creds(pki.ca, pki.node_a),
        )
    )
    deadline = time.monotonic() + 15
    while "PERMISSION_DENIED" not in caplog.text:
        assert time.monotonic() < deadline, caplog.text
        await asyncio.sleep(0.05)
    assert not agent.registered.is_set()
    shown = await asyncio.to_thread(get_node, address, pki, "victim")
    assert not shown.agent_connected and len(shown.gpus) == 0


# --- the rule itself, and the controller's options ---------------------------


@pytest.mark.parametrize(
    ("names", "node", "allowed"),
    [
        pytest.param(None, "n1", True, id="no-certificate"),
        pytest.param(CertificateNames("n1", ()), "n1", True, id="cn"),
        pytest.param(CertificateNames("x", ("a", "n1")), "n1", True, id="dns-san"),
        pytest.param(CertificateNames("n1", ()), "n10", False, id="prefix-is-not-a-match"),
        pytest.param(CertificateNames("N1", ()), "n1", False, id="case-matters"),
        pytest.param(CertificateNames("", ()), "n1", False, id="nameless"),
        pytest.param(CertificateNames("", ()), "", False, id="empty-node"),
    ],
)
def test_authorize_node(names: CertificateNames | None, node: str, allowed: bool) -> None:
    if allowed:
        authorize_node(names, node)
    else:
        with pytest.raises(CertificateMismatch, match="cannot register node"):
            authorize_node(names, node)


def test_certificate_names_from_an_auth_context() -> None:
    assert certificate_names({"transport_security_type": [b"insecure"]}) is None
    names = certificate_names(
        {
            "x509_pem_cert": [b"-----BEGIN CERTIFICATE-----"],
            "x509_common_name": [b"n1"],
            "x509_subject_alternative_name": [b"n1.example", b"127.0.0.1"],
            "peer_dns": [b"n1.example"],
        }
    )
    assert names == CertificateNames("n1", ("n1.example",))
    assert "127.0.0.1" not in names  # IP SANs do not name nodes


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param(["--tls-key", "{key}"], "TLS needs both --tls-cert and --tls-key", id="key"),
        pytest.param(["--tls-client-ca", "{ca}"], "TLS needs both", id="ca-only"),
        pytest.param(
            ["--tls-cert", "{cert}", "--tls-key", "{other_key}"],
            "does not belong to certificate",
            id="mismatched-key",
        ),
        pytest.param(
            ["--tls-cert", "{key}", "--tls-key", "{key}"],
            "is not a PEM certificate",
            id="key-as-cert",
        ),
        pytest.param(
            ["--tls-cert", "{cert}", "--tls-key", "{key}", "--tls-client-ca", "{missing}"],
            "cannot read TLS CA certificate",
            id="missing-ca",
        ),
    ],
)
def test_controller_rejects_bad_tls_options(
    pki: Pki,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    expected: str,
) -> None:
    paths = {
        "cert": pki.server.cert,
        "key": pki.server.key,
        "other_key": pki.operator.key,
        "ca": pki.ca,
        "missing": tmp_path / "missing.pem",
    }
    argv = [f.format(**paths) for f in flags]
    code = controller_main([*argv, "--state-dir", str(tmp_path / "state")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("kiln-controller: error: ") and expected in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "state").exists()  # nothing opened


def test_controller_process_with_a_missing_key_exits_2(pki: Pki, tmp_path: Path) -> None:
    missing = tmp_path / "server-key.pem"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller.main",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--state-dir",
            str(tmp_path / "state"),
            "--tls-cert",
            str(pki.server.cert),
            "--tls-key",
            str(missing),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"kiln-controller: error: cannot read TLS private key {missing}: No such file or directory"
    ]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param(["--tls-cert", "{cert}"], "certificate and its key", id="cert-no-key"),
        pytest.param(["--tls-ca", "{missing}"], "cannot read TLS CA certificate", id="no-ca"),
    ],
)
def test_agent_rejects_bad_tls_options(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], expected: str
) -> None:
    paths = {"cert": pki.node_a.cert, "missing": tmp_path / "missing.pem"}
    argv = [f.format(**paths) for f in flags]
    code = agent_main(["--controller", f"127.0.0.1:{free_port()}", "--nvml", "fake:h200", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("kiln-agent: error: ") and expected in err, err
    assert err.count("\n") == 1
