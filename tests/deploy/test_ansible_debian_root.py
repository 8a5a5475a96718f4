"""``site.yml`` applied for real, twice, to a throw-away Debian root.

A minimal Debian root of this machine's release is built once per session
with ``debootstrap`` (``debian_root.py``), and a wheel of this checkout with
``pip wheel``. ``ansible-playbook`` then runs the whole playbook (broker,
controller and agent on one host) against the root through
``community.general.chroot``: apt installs Python's venv and Mosquitto from
Debian's archive inside the root, pip installs the wheel and its dependencies
from the package registry into ``/opt/kiln/venv``, users, files, certificates
and systemd units are written, and the units are enabled (a chroot runs no
systemd, so nothing is started: the roles enable only). The second run must
change nothing.

Afterwards: the agent package imports with the root's own Python; the
agent's unit names the controller and the TLS files the playbook was given,
as the installed ``kiln-agent`` parses it; the units pass ``systemd-analyze
verify`` against the root; and the agent, started inside the root with its
unit's exact command line, registers over mutual TLS with a real controller
on 127.0.0.1 and reports its (fake) GPUs.

Needs root (chroot), ``debootstrap``, ``systemd-analyze`` and Ansible with
the ``community.general`` collection (pip ``ansible``). Where one is missing
the tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from ansible_tree import ANSIBLE, exec_start
from debian_root import ROOT_CA_BUNDLE, build_root, in_root
from peers import ControllerThread
from tls_certs import CertFiles, TestCa

from controller.server import ControllerConfig
from controller.sim.ports import free_port
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

REPO = ANSIBLE.parent
HOST = "kiln-test-01"
VENV = "/opt/kiln/venv"
AGENT_DIR = "/etc/kiln/agent"
# the recap line of one host: "kiln-test-01 : ok=33 changed=0 unreachable=0 failed=0 ..."
RECAP = re.compile(rf"^{re.escape(HOST)}\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$", re.MULTILINE)


def need(condition: bool, why: str) -> None:
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{why} (.ci/run installs it)")
    pytest.skip(why)


def ansible_tool(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    need(found is not None, f"{name} is not installed (pip install ansible)")
    assert found is not None
    return found


@dataclass(frozen=True)
class Run:
    code: int
    output: str
    seconds: float

    def recap(self) -> dict[str, int]:
        m = RECAP.search(self.output)
        assert m, self.output[-3000:]
        return {k: int(v) for k, v in (p.split("=") for p in m["counts"].split())}

    def changed_tasks(self) -> list[str]:
        """The TASK headers followed by a "changed:" line."""
        out, task = [], ""
        for line in self.output.splitlines():
            if line.startswith(("TASK [", "RUNNING HANDLER [")):
                task = line.rstrip("* ")
            elif line.startswith("changed:"):
                out.append(task)
        return out


@dataclass(frozen=True)
class Applied:
    root: Path
    work: Path
    ca: TestCa
    node: CertFiles
    controller_port: int
    metrics_port: int
    first: Run
    second: Run
    root_build_seconds: float


@pytest.fixture(scope="session")
def debian_root() -> Iterator[tuple[Path, float]]:
    """A fresh minimal Debian root under a temporary directory, removed at the end."""
    need(hasattr(os, "geteuid") and os.geteuid() == 0, "a chroot needs root")
    need(shutil.which("debootstrap") is not None, "debootstrap is not installed (apt)")
    base = Path(tempfile.mkdtemp(prefix="kiln-debian-root-"))
    root = base / "root"
    started = time.monotonic()
    try:
        build_root(root, base / "debootstrap.log")
    except subprocess.CalledProcessError:
        log = (base / "debootstrap.log").read_text(encoding="utf-8", errors="replace")
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"debootstrap failed:\n{log[-3000:]}")
    try:
        yield root, time.monotonic() - started
    finally:
        shutil.rmtree(base, ignore_errors=True)


def build_wheel(out: Path) -> Path:
    """A wheel of this checkout (its working tree: tracked files and new ones git
    does not ignore), built from a copy so that no build/ is left behind."""
    src = out / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        if (REPO / name).is_file():  # not a file deleted in the working tree
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out / "dist"),
            str(src),
        ],
        capture_output=True,
        timeout=300,
        check=True,
    )
    (wheel,) = (out / "dist").glob("kiln-*.whl")
    return wheel


def playbook(inventory: Path, work: Path) -> Run:
    # A clean environment: nothing of this machine's pip settings (PIP_*)
    # reaches the root's pip; only what the inventory gives it.
    env = {
        "PATH": os.pathsep.join(
            [str(Path(sys.executable).parent), "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"]
        ),
        "HOME": str(work / "home"),
        "LANG": "C.UTF-8",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
        "ANSIBLE_HOST_KEY_CHECKING": "false",
        "ANSIBLE_RETRY_FILES_ENABLED": "false",
    }
    started = time.monotonic()
    done = subprocess.run(
        [ansible_tool("ansible-playbook"), "-i", str(inventory), "site.yml"],
        cwd=ANSIBLE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
        check=False,
    )
    return Run(done.returncode, done.stdout, time.monotonic() - started)


@pytest.fixture(scope="module")
def applied(debian_root: tuple[Path, float], tmp_path_factory: pytest.TempPathFactory) -> Applied:
    root, root_seconds = debian_root
    ansible_tool("ansible-playbook")
    # the chroot connection is in community.general (pip ansible bundles it)
    doc = subprocess.run(
        [ansible_tool("ansible-doc"), "-t", "connection", "community.general.chroot"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    need(doc.returncode == 0, "community.general is not installed (pip install ansible)")

    work = tmp_path_factory.mktemp("playbook")
    (work / "home").mkdir()
    wheel = build_wheel(work)
    ca = TestCa(work)
    node = ca.client(HOST)
    controller_port, metrics_port = free_port(), free_port()
    inventory = work / "hosts.yml"
    host = {
        "ansible_connection": "community.general.chroot",
        "ansible_host": str(root),
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {HOST: host},
                    "children": {
                        group: {"hosts": {HOST: {}}}
                        for group in ("kiln_brokers", "kiln_controllers", "kiln_nodes")
                    },
                    "vars": {
                        "kiln_install_wheel": str(wheel),
                        "kiln_install_pip_extra_args": f"--cert {ROOT_CA_BUNDLE}",
                        "kiln_agent_controller": f"127.0.0.1:{controller_port}",
                        "kiln_agent_nvml": "fake:h200",
                        "kiln_agent_metrics_host": "127.0.0.1",
                        "kiln_agent_metrics_port": metrics_port,
                        "kiln_agent_tls_ca_src": str(ca.ca_path),
                        "kiln_agent_tls_cert_src": str(node.cert),
                        "kiln_agent_tls_key_src": str(node.key),
                    },
                }
            }
        ),
        encoding="utf-8",
    )
    first = playbook(inventory, work)
    assert first.code == 0, first.output[-6000:]
    second = playbook(inventory, work)
    assert second.code == 0, second.output[-6000:]
    return Applied(root, work, ca, node, controller_port, metrics_port, first, second, root_seconds)


@pytest.mark.timeout(1800)
def test_second_run_changes_nothing(applied: Applied) -> None:
    first, second = applied.first.recap(), applied.second.recap()
    print(
        f"root built in {applied.root_build_seconds:.0f}s; playbook runs "
        f"{applied.first.seconds:.0f}s ({first}) and {applied.second.seconds:.0f}s ({second})"
    )
    assert first["failed"] == 0 and first["unreachable"] == 0
    # the first run really installed: the package, the user, the units
    changed = applied.first.changed_tasks()
    for task in (
        "kiln_install : Install Python and venv",
        "kiln_install : Install kiln into the virtualenv",
        "mosquitto : Install Mosquitto",
        "kiln_controller : Create the kiln system user",
        "kiln_controller : Install the kiln-controller systemd unit",
        "kiln_agent : Copy the node's private key",
        "kiln_agent : Install the kiln-agent systemd unit",
        "kiln_agent : Enable kiln-agent",
    ):
        assert f"TASK [{task}]" in changed, changed
    assert second["changed"] == 0, applied.second.changed_tasks()
    assert second["failed"] == 0 and second["ok"] == first["ok"]


@pytest.mark.timeout(1800)
def test_agent_package_imports_with_the_roots_python(applied: Applied) -> None:
    done = in_root(
        applied.root,
        f"{VENV}/bin/python",
        "-c",
        "import sys, agent, agent.main, controller.main, kiln.v1.fleet_pb2; "
        "print(agent.__file__, sys.version_info[:2])",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{VENV}/lib/python3"), done.stdout
    # the venv is the root's Python, not this machine's
    base = in_root(applied.root, f"{VENV}/bin/python", "-c", "import sys; print(sys.base_prefix)")
    assert base.stdout.strip() == "/usr"
    for script in ("kiln-agent", "kiln-controller", "kiln"):
        done = in_root(applied.root, f"{VENV}/bin/{script}", "--help")
        assert done.returncode == 0, (script, done.stderr)


def chroot() -> str:
    found = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert found is not None
    return found


def agent_argv(root: Path) -> list[str]:
    unit = (root / "etc/systemd/system/kiln-agent.service").read_text(encoding="utf-8")
    return shlex.split(exec_start(unit))


@pytest.mark.timeout(1800)
def test_agent_unit_names_the_controller_and_its_certificates(applied: Applied) -> None:
    argv = agent_argv(applied.root)
    assert argv[0] == f"{VENV}/bin/kiln-agent"
    # parsed by the kiln-agent installed in the root
    parse = (
        "import json, sys; from agent.main import build_parser; "
        "a = build_parser().parse_args(sys.argv[1:]); "
        "print(json.dumps({k: None if v is None else str(v) for k, v in vars(a).items()}))"
    )
    done = in_root(applied.root, f"{VENV}/bin/python", "-c", parse, *argv[1:])
    assert done.returncode == 0, done.stderr
    args = json.loads(done.stdout)
    assert args["controller"] == f"127.0.0.1:{applied.controller_port}"
    assert args["node_name"] == HOST
    assert args["nvml"] == "fake:h200"
    assert args["tls_ca"] == f"{AGENT_DIR}/ca.pem"
    assert args["tls_cert"] == f"{AGENT_DIR}/agent.pem"
    assert args["tls_key"] == f"{AGENT_DIR}/agent.key"
    # ... and those files are the ones the playbook was given
    given = {
        "ca.pem": (applied.ca.ca_path, 0o644),
        "agent.pem": (applied.node.cert, 0o644),
        "agent.key": (applied.node.key, 0o600),
    }
    for name, (source, mode) in given.items():
        installed = applied.root / AGENT_DIR.lstrip("/") / name
        assert installed.read_bytes() == source.read_bytes(), name
        assert installed.stat().st_mode & 0o777 == mode, name
        assert installed.stat().st_uid == 0
    assert (applied.root / AGENT_DIR.lstrip("/")).stat().st_mode & 0o777 == 0o700


@pytest.mark.timeout(1800)
def test_units_pass_systemd_analyze_verify_and_are_enabled(applied: Applied) -> None:
    analyze = shutil.which("systemd-analyze")
    need(analyze is not None, "systemd-analyze is not installed (apt: systemd)")
    assert analyze is not None
    units = [f"/etc/systemd/system/{name}.service" for name in ("kiln-agent", "kiln-controller")]
    done = subprocess.run(
        [analyze, "verify", f"--root={applied.root}", "--man=no", *units],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # verify checks, in the root, that every Exec*= command exists and is executable
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.strip() == "", done.stderr
    wants = applied.root / "etc/systemd/system/multi-user.target.wants"
    for name in ("kiln-agent", "kiln-controller", "mosquitto"):
        assert (wants / f"{name}.service").is_symlink(), name
    # the controller's user, and the state directory it owns
    passwd = (applied.root / "etc/passwd").read_text(encoding="utf-8")
    kiln = next(line.split(":") for line in passwd.splitlines() if line.startswith("kiln:"))
    assert kiln[6] == "/usr/sbin/nologin"
    state = applied.root / "var/lib/kiln"
    assert state.stat().st_uid == int(kiln[2]) and state.stat().st_mode & 0o777 == 0o750
    broker = applied.root / "etc/mosquitto/conf.d/kiln.conf"
    assert "listener 1883 127.0.0.1\n" in broker.read_text(encoding="utf-8")


@pytest.mark.timeout(1800)
def test_installed_agent_registers_with_a_controller_over_mutual_tls(applied: Applied) -> None:
    server = applied.ca.server("controller")
    admin = applied.ca.client("kiln-admin")
    controller = ControllerThread(
        ControllerConfig(
            listen=f"127.0.0.1:{applied.controller_port}",
            state_dir=applied.work / "controller-state",
            reconcile_interval=0.2,
            tls_cert=server.cert,
            tls_key=server.key,
            tls_client_ca=applied.ca.ca_path,
        )
    )
    (applied.work / "controller-state").mkdir()
    address = controller.start()
    agent: subprocess.Popen[str] | None = None
    try:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=applied.ca.ca_path.read_bytes(),
            private_key=admin.key.read_bytes(),
            certificate_chain=admin.cert.read_bytes(),
        )
        with grpc.secure_channel(address, credentials) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            stub.EnrollNode(
                fleet_pb2.EnrollNodeRequest(
                    name=HOST,
                    bmc_url=f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/1",
                    username="admin",
                    password="chroot-test-secret",
                    rack="r01",
                ),
                timeout=10,
            )
            # the unit's ExecStart=, exactly, run inside the root
            agent = subprocess.Popen(
                [chroot(), str(applied.root), *agent_argv(applied.root)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
            deadline = time.monotonic() + 60
            node = stub.GetNode(fleet_pb2.GetNodeRequest(name=HOST), timeout=10)
            while node.gpu_count == 0 and time.monotonic() < deadline:
                assert agent.poll() is None, agent.communicate()[0]
                time.sleep(0.3)
                node = stub.GetNode(fleet_pb2.GetNodeRequest(name=HOST), timeout=10)
            assert node.gpu_count == 8, node
            assert "H200" in node.gpu_model.upper(), node.gpu_model
    finally:
        if agent is not None:
            agent.terminate()
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(timeout=10)
        controller.stop()
