"""``kiln certs``: a fleet CA in one command, and certificates the controller reads.

The CLI itself (``controller.cli.main.main``) makes a CA and issues a
controller's, an agent's and operators' certificates into a temporary
directory; they verify against the CA with the usages, names and role the
controller expects, keys are 0600 from the moment they exist, and nothing is
replaced unless asked. Then a real controller serves mutual TLS with them:
a viewer's certificate reads but may not power or drain, an admin's makes
tokens, and an agent's may not call FleetService.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import DNSName, IPAddress, PolicyBuilder, Store
from sec_fleet import BMC_PASSWORD, SecuredController, dead_bmc, refusal

from controller.api.auth.identity import ROLE_URI_PREFIX, certificate_caller, peer_certificate
from controller.cli.main import main as kiln_main
from controller.core.identity import OPERATOR_ROLES, Role
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2
from kiln_common import fleet_ca
from kiln_common.tls import channel_credentials

DENIED = grpc.StatusCode.PERMISSION_DENIED


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


def kiln(*argv: str) -> Result:
    """The real ``kiln`` CLI, in-process: its exit code and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = kiln_main(list(argv))
    return Result(code, out.getvalue(), err.getvalue())


def ok(*argv: str) -> Result:
    result = kiln(*argv)
    assert (result.code, result.err) == (0, ""), result
    return result


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def sans(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def attributes(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(a.value) for a in cert.subject.get_attributes_for_oid(oid)]


def store(ca_dir: Path) -> Store:
    return Store([load(ca_dir / "ca.pem")])


@dataclass(frozen=True)
class Pki:
    """What ``kiln certs`` made in ``dir``."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    def pair(self, stem: str) -> tuple[Path, Path]:
        return self.dir / f"{stem}.pem", self.dir / f"{stem}.key"

    def creds(self, stem: str) -> grpc.ChannelCredentials:
        cert, key = self.pair(stem)
        made = channel_credentials(self.ca, cert, key)
        assert made is not None
        return made


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("fleet") / "ca"
    ok("certs", "init", "--dir", str(directory), "--name", "Test fleet CA")
    ok("certs", "issue", "controller", "--dir", str(directory))
    ok("certs", "issue", "agent", "node-a", "--dir", str(directory))
    for name, role in (("carol", "viewer"), ("alice", "admin"), ("olga", "operator")):
        ok("certs", "issue", "operator", name, "--role", role, "--dir", str(directory))
    return Pki(directory)


@pytest.mark.timeout(60)
def test_init_makes_a_ca_in_kiln_ca_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = ok("certs", "init")
    ca_dir = tmp_path / "kiln-ca"
    assert "kiln-ca/ca.pem" in result.out and "expires " in result.out
    assert (mode(ca_dir), mode(ca_dir / "ca.key"), mode(ca_dir / "ca.pem")) == (0o700, 0o600, 0o644)

    ca = load(ca_dir / "ca.pem")
    assert ca.subject == ca.issuer
    assert attributes(ca, NameOID.COMMON_NAME) == ["Kiln fleet CA"]
    ca.verify_directly_issued_by(ca)
    key = ca.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    days = (ca.not_valid_after_utc - ca.not_valid_before_utc).days
    assert 3650 <= days <= 3651


@pytest.mark.timeout(60)
def test_keys_are_0600_from_the_start_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, int, int]] = []
    real_open = os.open

    def spy(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        opened.append((str(path), flags, mode))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    previous = os.umask(0)
    try:
        ok("certs", "init", "--dir", str(tmp_path))
        ok("certs", "issue", "agent", "n1", "--dir", str(tmp_path))
    finally:
        os.umask(previous)
    for name in ("ca.key", "agent-n1.key"):
        assert mode(tmp_path / name) == 0o600
        [(_, flags, made)] = [o for o in opened if o[0] == str(tmp_path / name)]
        assert made == 0o600
        assert flags & os.O_CREAT and flags & os.O_EXCL
    for name in ("ca.pem", "agent-n1.pem"):
        assert mode(tmp_path / name) == 0o644


@pytest.mark.timeout(60)
def test_the_controller_certificate_serves_the_names_clients_dial(pki: Pki) -> None:
    cert_path, key_path = pki.pair("controller-localhost")
    assert (mode(cert_path), mode(key_path)) == (0o644, 0o600)
    cert = load(cert_path)
    assert eku(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    names = sans(cert)
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 365 <= days <= 366
    for name in (DNSName("localhost"), IPAddress(ipaddress.ip_address("127.0.0.1"))):
        PolicyBuilder().store(store(pki.dir)).build_server_verifier(name).verify(cert, [])


@pytest.mark.timeout(60)
def test_sans_are_ip_addresses_or_dns_names(tmp_path: Path) -> None:
    ok("certs", "init", "--dir", str(tmp_path))
    result = ok(
        "certs",
        "issue",
        "controller",
        "--dir",
        str(tmp_path),
        "--san",
        "ctl.example",
        "--san",
        "10.0.0.5",
        "--san",
        "fd00::1",
        "--days",
        "30",
    )
    cert = load(tmp_path / "controller-ctl.example.pem")
    assert "DNS:ctl.example, IP:10.0.0.5, IP:fd00::1" in result.out
    assert attributes(cert, NameOID.COMMON_NAME) == ["ctl.example"]
    names = sans(cert)
    assert names.get_values_for_type(x509.DNSName) == ["ctl.example"]
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("fd00::1"),
    ]
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 30
    verifier = PolicyBuilder().store(store(tmp_path))
    verifier.build_server_verifier(IPAddress(ipaddress.ip_address("fd00::1"))).verify(cert, [])


@pytest.mark.timeout(60)
def test_an_agent_certificate_names_its_node_and_no_role(pki: Pki) -> None:
    cert_path, key_path = pki.pair("agent-node-a")
    assert mode(key_path) == 0o600
    cert = load(cert_path)
    assert eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert attributes(cert, NameOID.COMMON_NAME) == ["node-a"]
    assert attributes(cert, NameOID.ORGANIZATIONAL_UNIT_NAME) == []
    assert list(sans(cert)) == [x509.DNSName("node-a")]
    verified = PolicyBuilder().store(store(pki.dir)).build_client_verifier().verify(cert, [])
    assert verified.subjects == [x509.DNSName("node-a")]
    caller = certificate_caller(_peer(cert_path))
    assert (caller.name, caller.role) == ("node-a", Role.AGENT)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "role"), [("carol", "viewer"), ("alice", "admin")])
def test_an_operator_certificate_carries_its_role(pki: Pki, name: str, role: str) -> None:
    cert_path, key_path = pki.pair(f"operator-{name}")
    assert mode(key_path) == 0o600
    cert = load(cert_path)
    assert eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert attributes(cert, NameOID.COMMON_NAME) == [name]
    assert attributes(cert, NameOID.ORGANIZATIONAL_UNIT_NAME) == [role]
    assert list(sans(cert)) == [x509.UniformResourceIdentifier(f"{ROLE_URI_PREFIX}{role}")]
    PolicyBuilder().store(store(pki.dir)).build_client_verifier().verify(cert, [])
    caller = certificate_caller(_peer(cert_path))
    assert (caller.name, caller.role) == (name, Role(role))


def _peer(cert: Path) -> Any:
    peer = peer_certificate({"x509_pem_cert": [cert.read_bytes()]})
    assert peer is not None
    return peer


@pytest.mark.timeout(60)
def test_out_names_the_files_and_json_says_what_was_written(tmp_path: Path) -> None:
    ok("certs", "init", "--dir", str(tmp_path / "ca"))
    prefix = tmp_path / "bob"
    result = ok(
        "-o", "json", "certs", "issue", "operator", "bob", "--role", "operator",
        "--dir", str(tmp_path / "ca"), "--out", str(prefix),
    )  # fmt: skip
    written = json.loads(result.out)
    assert (written["cert"], written["key"]) == (f"{prefix}.pem", f"{prefix}.key")
    assert written["names"] == ["URI:kiln:role:operator"]
    assert mode(Path(f"{prefix}.key")) == 0o600
    assert not list((tmp_path / "ca").glob("operator-*"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ("operator", "mallory", "--role", "root"),
            "--role 'root' is no role: use viewer, operator, provisioner or admin",
            id="unknown-role",
        ),
        pytest.param(
            ("operator", "mallory", "--role", "agent"),
            "an agent's certificate carries no role: kiln certs issue agent NODE",
            id="agent-role",
        ),
        pytest.param(
            ("agent", "../etc/passwd"),
            "node name '../etc/passwd' is invalid",
            id="bad-node-name",
        ),
        pytest.param(
            ("operator", "a b", "--role", "viewer"),
            "operator name 'a b' is invalid",
            id="bad-operator-name",
        ),
        pytest.param(
            ("controller", "--san", "not a host"),
            "'not a host' is neither an IP address nor a DNS name",
            id="bad-san",
        ),
        pytest.param(
            ("agent", "n1", "--days", "5000"),
            "would outlive the CA",
            id="outlives-the-ca",
        ),
    ],
)
def test_bad_values_are_one_line_usage_errors(
    pki: Pki, argv: tuple[str, ...], message: str
) -> None:
    before = sorted(p.name for p in pki.dir.iterdir())
    result = kiln("certs", "issue", *argv, "--dir", str(pki.dir))
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("kiln: error: ") and message in result.err
    assert result.err.count("\n") == 1
    assert sorted(p.name for p in pki.dir.iterdir()) == before


@pytest.mark.timeout(60)
def test_the_roles_offered_are_the_controllers() -> None:
    result = kiln("certs", "issue", "operator", "x", "--role", "nobody", "--dir", "/nonexistent")
    names = [str(r) for r in OPERATOR_ROLES]
    assert Role.AGENT not in OPERATOR_ROLES
    assert result.err.endswith(f"use {', '.join(names[:-1])} or {names[-1]}\n")


@pytest.mark.timeout(60)
def test_an_existing_ca_is_kept_unless_forced(tmp_path: Path) -> None:
    ok("certs", "init", "--dir", str(tmp_path))
    first = (tmp_path / "ca.key").read_bytes(), (tmp_path / "ca.pem").read_bytes()
    result = kiln("certs", "init", "--dir", str(tmp_path))
    assert result.code == 1 and result.out == ""
    assert result.err.startswith(f"kiln: error: {tmp_path} already holds a CA")
    assert "--force" in result.err and result.err.count("\n") == 1
    assert ((tmp_path / "ca.key").read_bytes(), (tmp_path / "ca.pem").read_bytes()) == first

    ok("certs", "init", "--dir", str(tmp_path), "--force")
    assert (tmp_path / "ca.key").read_bytes() != first[0]
    assert mode(tmp_path / "ca.key") == 0o600
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


@pytest.mark.timeout(60)
def test_an_issued_certificate_is_kept_unless_forced(tmp_path: Path) -> None:
    ok("certs", "init", "--dir", str(tmp_path))
    ok("certs", "issue", "agent", "n1", "--dir", str(tmp_path))
    first = (tmp_path / "agent-n1.pem").read_bytes()
    result = kiln("certs", "issue", "agent", "n1", "--dir", str(tmp_path))
    assert result.code == 1 and "already exist" in result.err and "--force" in result.err
    assert (tmp_path / "agent-n1.pem").read_bytes() == first
    ok("certs", "issue", "agent", "n1", "--dir", str(tmp_path), "--force")
    assert (tmp_path / "agent-n1.pem").read_bytes() != first
    assert mode(tmp_path / "agent-n1.key") == 0o600


@pytest.mark.timeout(60)
def test_issuing_without_a_ca_says_to_make_one(tmp_path: Path) -> None:
    result = kiln("certs", "issue", "agent", "n1", "--dir", str(tmp_path / "none"))
    assert result.code == 1 and result.out == ""
    assert result.err == (
        f"kiln: error: no fleet CA in {tmp_path / 'none'} ({tmp_path / 'none' / 'ca.pem'} "
        f"not found); make one with: kiln certs init --dir {tmp_path / 'none'}\n"
    )
    assert not (tmp_path / "none").exists()


@pytest.mark.timeout(60)
def test_a_key_that_is_not_the_cas_is_refused(tmp_path: Path) -> None:
    ok("certs", "init", "--dir", str(tmp_path / "a"))
    ok("certs", "init", "--dir", str(tmp_path / "b"))
    (tmp_path / "a" / "ca.key").write_bytes((tmp_path / "b" / "ca.key").read_bytes())
    result = kiln("certs", "issue", "agent", "n1", "--dir", str(tmp_path / "a"))
    assert result.code == 1
    assert "is not the private key of" in result.err
    assert "PRIVATE" not in result.err


@pytest.mark.timeout(120)
def test_help_loads_no_cryptography() -> None:
    probe = (
        "import contextlib, io, json, sys\n"
        "import controller.cli.main as cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    codes = [cli.main(a) for a in (['--help'], ['certs', '--help'],"
        " ['certs', 'issue', 'operator', '--help'])]\n"
        "print(json.dumps([codes, [m for m in ('cryptography', 'grpc', 'controller.core')"
        " if m in sys.modules]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=100, check=True
    )
    assert json.loads(done.stdout) == [[0, 0, 0], []]
    assert fleet_ca.ROLE_URI_PREFIX == ROLE_URI_PREFIX


# A controller serving mutual TLS with what kiln certs made.


@pytest.fixture(scope="module")
def ctl(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredController]:
    cert, key = pki.pair("controller-localhost")
    controller = SecuredController(
        tmp_path_factory.mktemp("certs-ctl"),
        channel_credentials=pki.creds("operator-alice"),
        config={"tls_cert": cert, "tls_key": key, "tls_client_ca": pki.ca},
    )
    assert controller.address.startswith("127.0.0.1:")
    try:
        controller.call(
            "EnrollNode",
            fleet_pb2.EnrollNodeRequest(
                name="node-a", bmc_url=dead_bmc(), username="admin", password=BMC_PASSWORD
            ),
        )  # as alice, whose certificate says admin
        yield controller
    finally:
        controller.stop()


def stub_as(ctl: SecuredController, pki: Pki, stem: str) -> tuple[grpc.Channel, Any]:
    channel = grpc.secure_channel(ctl.address, pki.creds(stem))
    return channel, fleet_pb2_grpc.FleetServiceStub(channel)


@pytest.mark.timeout(60)
def test_a_viewer_certificate_reads_but_may_not_power_or_drain(
    ctl: SecuredController, pki: Pki
) -> None:
    channel, stub = stub_as(ctl, pki, "operator-carol")
    with channel:
        nodes = stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=20)
        assert [n.name for n in nodes.nodes] == ["node-a"]
        power = fleet_pb2.PowerNodeRequest(name="node-a", action=types_pb2.POWER_ACTION_OFF)
        code, details = refusal(lambda: stub.PowerNode(power, timeout=20))
        assert (code, details) == (
            DENIED,
            "PowerNode needs role operator or admin; 'carol' (viewer) may not call it",
        )
        drain = fleet_pb2.DrainNodeRequest(name="node-a", reason="fan")
        code, details = refusal(lambda: stub.DrainNode(drain, timeout=20))
        assert code is DENIED and "'carol' (viewer)" in details
    refused = ctl.audit(who="carol")
    assert {(e.method, e.code) for e in refused} >= {
        ("PowerNode", "PERMISSION_DENIED"),
        ("DrainNode", "PERMISSION_DENIED"),
    }


@pytest.mark.timeout(60)
def test_an_operator_certificate_drains(ctl: SecuredController, pki: Pki) -> None:
    channel, stub = stub_as(ctl, pki, "operator-olga")
    with channel:
        drain = fleet_pb2.DrainNodeRequest(name="node-a", reason="fan")
        assert stub.DrainNode(drain, timeout=20).name == "node-a"
        stub.UndrainNode(fleet_pb2.UndrainNodeRequest(name="node-a"), timeout=20)


@pytest.mark.timeout(60)
def test_an_agent_certificate_cannot_call_fleet_service(ctl: SecuredController, pki: Pki) -> None:
    channel, stub = stub_as(ctl, pki, "agent-node-a")
    with channel:
        code, details = refusal(lambda: stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=20))
        me = stub.WhoAmI(fleet_pb2.WhoAmIRequest(), timeout=20)
    assert code is DENIED and "'node-a' (agent) may not call it" in details
    assert (me.identity, me.role, me.method) == ("node-a", "agent", "certificate")


@pytest.mark.timeout(60)
def test_the_cli_with_certificates_only(
    ctl: SecuredController, pki: Pki, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``kiln`` dials with the files ``kiln certs`` wrote: the admin makes a
    token, the viewer is told no."""
    for env in ("KILN_TOKEN", "KILN_TLS_CA", "KILN_TLS_CERT", "KILN_TLS_KEY"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("KILN_CONFIG", str(tmp_path / "no-config.toml"))

    def as_(stem: str, *argv: str) -> Result:
        cert, key = pki.pair(stem)
        return kiln(
            "--controller", ctl.address, "--tls-ca", str(pki.ca),
            "--tls-cert", str(cert), "--tls-key", str(key), *argv,
        )  # fmt: skip

    assert as_("operator-alice", "whoami").out == "alice (admin, by certificate)\n"
    made = as_("operator-alice", "tokens", "create", "ci", "--role", "provisioner")
    assert made.code == 0 and made.out.startswith("kiln.")
    [entry] = ctl.audit(method="CreateToken", who="alice")
    assert (entry.role, entry.code) == ("admin", "OK")

    assert as_("operator-carol", "whoami").out == "carol (viewer, by certificate)\n"
    refused = as_("operator-carol", "nodes", "drain", "node-a", "--reason", "fan")
    assert refused.code == 1
    assert refused.err.startswith("kiln: error: PERMISSION_DENIED: DrainNode needs role")
