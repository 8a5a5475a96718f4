"""Launch sushy-tools' Redfish emulator (fake driver) as a loopback subprocess.

Used by tests, benchmarks and ``kiln demo``. Each emulator gets a free port on
127.0.0.1 and a fresh state directory. The fake driver makes power changes
land 1-11 s after the request, like real BMCs; with ``power_delay=False`` this
module, run as ``python -m controller.sim.redfish_emulator --instant``, sets
that delay to zero before handing over to sushy-tools' ``main()``.

``backend="libvirt-test"`` runs sushy-tools' libvirt driver on libvirt's
in-process test driver (``test:///default``, no daemon; needs the
``libvirt-python`` package): the launcher defines one domain per system before
starting, and BIOS attributes, ``BiosVersion``/SimpleUpdate and processors
work there (virtual media does not).

Optional: HTTP Basic auth (htpasswd file, bcrypt cost 4 so requests stay
cheap) and TLS (a self-signed certificate for IP 127.0.0.1).

Leak detectors (``leak_detection=True``, the default): the launcher adds
DMTF leak detectors to sushy-tools' app, two per system on a tray chassis of
the system's own, which a test or the simulation sets with
``set_leak_detector`` (a PATCH only the simulation has); see
``controller.sim.leak_detectors``.

One-time boot and boots: the fake driver reads back every boot override as
``Continuous`` and boots nothing; the launcher adds a ``Once`` override that
a boot ends, and ``Oem.KilnSim.BootCount`` / ``LastBoot`` on each system
(``controller.sim.boot_override``), which the simulated fleet follows.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.sim import boot_override, leak_detectors
from controller.sim.ports import free_port
from controller.sim.process import ProcessPeer

# The repository root, so the launcher module is importable in the child.
_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])


LIBVIRT_TEST_URI = "test:///default"
BACKENDS = ("fake", "libvirt-test")


@dataclass(frozen=True)
class SimSystem:
    """One emulated server. ``power_state`` is "On" or "Off"."""

    name: str
    uuid: str
    power_state: str = "Off"
    bios_version: str = ""  # libvirt-test only: the BiosVersion it starts at ("": 1.0.0)


def make_systems(count: int, prefix: str = "node-", power_state: str = "Off") -> list[SimSystem]:
    """``count`` systems named ``node-00000`` ... with deterministic UUIDs."""
    return [
        SimSystem(f"{prefix}{i:05d}", f"00000000-0000-0000-0000-{i:012d}", power_state)
        for i in range(count)
    ]


def _domain_xml(index: int, system: SimSystem) -> str:
    """A libvirt test-driver domain for ``system`` (its BiosVersion in the
    metadata sushy-tools' libvirt driver keeps firmware versions in)."""
    versions = (
        "<metadata><sushy:bios xmlns:sushy='http://openstack.org/xmlns/libvirt/sushy'>"
        f"<sushy:versions><sushy:version name='BiosVersion' value='{system.bios_version}'/>"
        "</sushy:versions></sushy:bios></metadata>"
        if system.bios_version
        else ""
    )
    return (
        f"<domain type='test'><name>{system.name}</name><uuid>{system.uuid}</uuid>"
        f"{versions}"
        "<memory unit='KiB'>1048576</memory><vcpu>2</vcpu>"
        "<os><type arch='x86_64'>hvm</type><boot dev='hd'/></os>"
        f"<devices><interface type='network'><mac address='{_mac(index)}'/>"
        "<source network='default'/></interface></devices></domain>"
    )


def _mac(index: int) -> str:
    return f"52:54:00:{index >> 16 & 0xFF:02x}:{index >> 8 & 0xFF:02x}:{index & 0xFF:02x}"


def _write_config(
    path: Path,
    port: int,
    state_dir: Path,
    systems: Sequence[SimSystem],
    extra: dict[str, Any],
    backend: str = "fake",
) -> None:
    fake = [
        {
            "uuid": s.uuid,
            "name": s.name,
            "power_state": s.power_state,
            "external_notifier": False,
            "nics": [
                {
                    "mac": _mac(i),
                    "ip": "127.0.0.1",
                }
            ],
        }
        for i, s in enumerate(systems)
    ]
    lines = [
        "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'",
        f"SUSHY_EMULATOR_LISTEN_PORT = {port}",
        f"SUSHY_EMULATOR_STATE_DIR = {str(state_dir)!r}",
    ]
    if backend == "fake":
        lines += ["SUSHY_EMULATOR_FAKE_DRIVER = True", f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake!r}"]
    else:
        lines += [f"SUSHY_EMULATOR_LIBVIRT_URI = {LIBVIRT_TEST_URI!r}"]
    lines += [f"{key} = {value!r}" for key, value in extra.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_htpasswd(path: Path, username: str, password: str) -> None:
    """An Apache-style htpasswd file with a bcrypt hash (cost 4)."""
    import bcrypt

    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"{username}:{digest}\n", encoding="utf-8")
    path.chmod(0o600)


def write_self_signed_cert(cert_path: Path, key_path: Path, host: str = "127.0.0.1") -> None:
    """A self-signed certificate with subjectAltName IP:host (cryptography, else openssl)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={host}", "-addext", f"subjectAltName=IP:{host}",
             "-keyout", str(key_path), "-out", str(cert_path)],
            check=True, capture_output=True,
        )  # fmt: skip
        return
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class RedfishEmulator(ProcessPeer):
    """sushy-tools' emulator in a subprocess on 127.0.0.1; an async context manager."""

    def __init__(
        self,
        systems: Sequence[SimSystem],
        *,
        power_delay: bool = False,
        username: str | None = None,
        password: str | None = None,
        tls: bool = False,
        workdir: Path | None = None,
        backend: str = "fake",
        leak_detection: bool = True,
    ) -> None:
        if (username is None) != (password is None):
            raise ValueError("give both username and password, or neither")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}")
        self.backend = backend
        self.leak_detection = leak_detection
        self.systems = list(systems)
        self.power_delay = power_delay
        self.username = username
        self._password = password
        self.tls = tls
        self._workdir_given = workdir
        self.workdir: Path | None = None
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._log: Any = None

    # --- addresses ------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def cert_path(self) -> Path:
        """The self-signed certificate (TLS mode): trust it with ``TlsOptions(ca_bundle=...)``."""
        assert self.workdir is not None
        return self.workdir / "cert.pem"

    def system_url(self, name: str, scheme: str | None = None) -> str:
        """The Kiln BMC URL of system ``name``."""
        if scheme is None:
            scheme = "redfish" if self.tls else "redfish+http"
        return f"{scheme}://127.0.0.1:{self.port}/redfish/v1/Systems/{name}"

    # --- lifecycle ------------------------------------------------------------
    async def start(self, ready_timeout: float = 20.0) -> None:
        if self._workdir_given is not None:
            self.workdir = Path(self._workdir_given)
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="kiln-redfish-"))
        state_dir = self.workdir / "state"
        if state_dir.exists():
            shutil.rmtree(state_dir)
        state_dir.mkdir()
        extra: dict[str, Any] = {}
        if self.username is not None and self._password is not None:
            auth_file = self.workdir / "htpasswd"
            write_htpasswd(auth_file, self.username, self._password)
            extra["SUSHY_EMULATOR_AUTH_FILE"] = str(auth_file)
        if self.tls:
            key = self.workdir / "key.pem"
            write_self_signed_cert(self.cert_path, key)
            extra["SUSHY_EMULATOR_SSL_CERT"] = str(self.cert_path)
            extra["SUSHY_EMULATOR_SSL_KEY"] = str(key)
        if self.leak_detection:
            extra.update(leak_detectors.tray_config([(s.name, s.uuid) for s in self.systems]))
        self.port = free_port()
        config = self.workdir / "emulator.conf"
        _write_config(config, self.port, state_dir, self.systems, extra, self.backend)
        args = [sys.executable, "-m", "controller.sim.redfish_emulator", "--config", str(config)]
        if self.backend == "libvirt-test":
            domains = self.workdir / "domains.json"
            domains.write_text(
                json.dumps(
                    [
                        {"xml": _domain_xml(i, s), "on": s.power_state == "On"}
                        for i, s in enumerate(self.systems)
                    ]
                )
            )
            args += ["--libvirt-domains", str(domains)]
        if not self.power_delay:
            args.append("--instant")
        self._log = (self.workdir / "emulator.log").open("ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([_SOURCE_ROOT, env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        self._proc = await asyncio.create_subprocess_exec(
            *args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        try:
            await self.wait_ready(ready_timeout)
        except BaseException:
            await self.stop()
            raise

    # --- leak detectors (simulation only) ---------------------------------------
    def tray_chassis(self, name: str) -> str:
        """The UUID of system ``name``'s tray chassis (the one with its leak detectors)."""
        for index, system in enumerate(self.systems):
            if system.name == name:
                return leak_detectors.tray_uuid(index)
        raise KeyError(f"no emulated system {name!r}")

    def leak_detector_path(self, name: str, detector: str = "ColdPlate") -> str:
        """The Redfish path of one of system ``name``'s leak detectors
        (``ColdPlate`` or ``Manifold``)."""
        return leak_detectors.detector_path(self.tray_chassis(name), detector)

    async def set_leak_detector(
        self, name: str, detector: str = "ColdPlate", **fields: Any
    ) -> dict[str, Any]:
        """Set what a leak detector of system ``name`` reports, e.g.
        ``DetectorState="Critical"`` or ``Status={"State": "UnavailableOffline",
        "Health": "Critical"}``; returns the detector's document. A PATCH that
        only the simulation serves (real detectors are read-only).

        Raises RuntimeError with the emulator's answer when it refuses.
        """
        body = json.dumps(fields).encode()
        return await asyncio.to_thread(
            self.request, "PATCH", self.leak_detector_path(name, detector), body
        )

    async def leak_detector(self, name: str, detector: str = "ColdPlate") -> dict[str, Any]:
        """The document of one of system ``name``'s leak detectors, as served."""
        return await asyncio.to_thread(
            self.request, "GET", self.leak_detector_path(name, detector), None
        )

    async def system_power(self, name: str) -> str:
        """System ``name``'s ``PowerState`` ("On", "Off") as the emulator serves it."""
        doc = await asyncio.to_thread(self.request, "GET", f"/redfish/v1/Systems/{name}", None)
        return str(doc.get("PowerState"))

    async def system(self, name: str) -> dict[str, Any]:
        """System ``name``'s document as the emulator serves it (with the
        simulation's ``Oem.KilnSim`` boots, see ``controller.sim.boot_override``)."""
        return await asyncio.to_thread(self.request, "GET", f"/redfish/v1/Systems/{name}", None)

    async def virtual_cd(self, name: str) -> dict[str, Any]:
        """System ``name``'s virtual CD document (``Inserted``, ``Image``)."""
        doc = await self.system(name)
        path = f"/redfish/v1/Systems/{doc['Id']}/VirtualMedia/Cd"
        return await asyncio.to_thread(self.request, "GET", path, None)

    def request(self, method: str, path: str, body: bytes | None = None) -> dict[str, Any]:
        """One request to this emulator on loopback (blocking); the answer's JSON.
        Raises RuntimeError naming the status when it is not a success."""
        headers = {"Content-Type": "application/json"}
        if self.username is not None and self._password is not None:
            token = base64.b64encode(f"{self.username}:{self._password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        req = urllib.request.Request(
            f"{self.base_url}{path}", data=body, method=method, headers=headers
        )
        context = ssl._create_unverified_context() if self.tls else None
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as rsp:
                return dict(json.load(rsp))
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read()[:300]!r}") from None

    def _probe(self) -> bool:
        context = ssl._create_unverified_context() if self.tls else None
        try:
            with urllib.request.urlopen(
                f"{self.base_url}/redfish/v1/", timeout=1.0, context=context
            ) as rsp:
                return bool(rsp.status == 200)
        except urllib.error.HTTPError as e:
            return e.code == 401  # up, and wants credentials
        except (OSError, ValueError):
            return False

    async def wait_ready(self, timeout: float = 20.0) -> None:
        """Wait until the service root answers. Raises RuntimeError on timeout or exit."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self._proc is not None and self._proc.returncode is not None:
                raise RuntimeError(
                    f"sushy-emulator exited with {self._proc.returncode}: {self.log_tail()}"
                )
            if await asyncio.to_thread(self._probe):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"sushy-emulator not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self, limit: int = 2000) -> str:
        if self.workdir is None:
            return ""
        with contextlib.suppress(OSError):
            return (self.workdir / "emulator.log").read_text(errors="replace")[-limit:]
        return ""


class _NoDelay:
    """Stands in for ``random`` in the fake driver: power changes apply at once."""

    @staticmethod
    def randint(a: int, b: int) -> int:
        return 0


def _define_test_domains(path: Path) -> Any:
    """Replace the test driver's sample domain with ours, in this process.

    ``test:///default`` keeps one shared state per process, so the domains
    defined here are what the emulator's own connections see. The connection
    is returned: the caller keeps it open for the life of the process.
    """
    import libvirt

    conn = libvirt.open(LIBVIRT_TEST_URI)
    for dom in conn.listAllDomains():
        if dom.isActive():
            dom.destroy()
        dom.undefine()
    for spec in json.loads(path.read_text()):
        dom = conn.defineXML(spec["xml"])
        if spec["on"]:
            dom.create()
    return conn


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="sushy-emulator launcher")
    parser.add_argument("--instant", action="store_true", help="no power-change delay")
    parser.add_argument("--libvirt-domains", help="JSON list of test-driver domains to define")
    args, rest = parser.parse_known_args(argv)
    keep_open = _define_test_domains(Path(args.libvirt_domains)) if args.libvirt_domains else None
    from sushy_tools.emulator import main as emulator_main
    from sushy_tools.emulator.resources.systems import fakedriver

    if args.instant:
        fakedriver.random = _NoDelay  # type: ignore[assignment]
    # Kiln's addition: leak detectors on a tray chassis per system (only when
    # the config names the trays; the rest is sushy-tools' own).
    leak_detectors.install(emulator_main.app)
    # Kiln's addition: one-time boot overrides and boots (BootCount, LastBoot).
    boot_override.install(emulator_main.app)
    sys.argv = ["sushy-emulator", *rest]
    try:
        return int(emulator_main.main() or 0)
    finally:
        if keep_open is not None:
            keep_open.close()


if __name__ == "__main__":
    sys.exit(_main())
