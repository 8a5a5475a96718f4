"""A whole simulated fleet session, and not one password or token in the clear.

Everything is real and on 127.0.0.1: a Mosquitto broker that wants a
password and speaks TLS, a sushy-tools Redfish emulator with HTTP basic
auth, a ``kiln-controller`` process (``--auth``, ``-v``, MQTT), the ``kiln``
CLI as one process per command (tables and ``-o json``), a ``kiln-agent``
process on its node's token, and an MQTT subscriber of its own. The session
makes a token of every role, enrols a node with an old BMC password the BMC
refuses, replaces it with ``kiln nodes set-credentials``, powers, lists,
shows, audits, watches events, is refused (a viewer powering off, a revoked
token, a forged one) and connects the agent.

Then every secret used (each token whole and its secret part, both BMC
passwords, both broker passwords) is searched for in the controller's and
the agent's output, each CLI command's stdout and stderr, every MQTT topic
and payload, every gRPC answer the test got itself, the SQLite files (while
the controller ran and after it stopped) and the peers' own logs. A token
may appear only in the one answer that made it; the token files the session
wrote are not searched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiomqtt
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tls_certs import TestCa

from controller.sim.mosquitto import BrokerCertificates, Mosquitto
from controller.sim.ports import free_port
from controller.sim.redfish_emulator import RedfishEmulator, SimSystem
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

REPO = Path(__file__).resolve().parents[2]

BROKER_USER, BROKER_PASSWORD = "kiln-controller", "mqtt-Ctl-Pw-5521-never-shown"
READER_USER, READER_PASSWORD = "kiln-reader", "mqtt-Reader-Pw-7730-never-shown"
BMC_USER = "operator"
OLD_BMC, NEW_BMC = "bmc-Old-Pw-1199-never-shown", "bmc-New-Pw-2288-never-shown"
NODE = "sec-rf-1"
UUID = "5ec5ec00-0000-4000-8000-000000000001"


def secret_parts(token: str) -> list[str]:
    """What must never be found: the whole token, and its secret part alone."""
    assert token.startswith("kiln.") and token.count(".") == 2, "not a Kiln token"
    return [token, token.rsplit(".", 1)[-1]]


def database_bytes(state_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(state_dir.glob("kiln.db*")))


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of every Kiln process: nothing of the caller's Kiln settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


@dataclass
class Session:
    """What the session saw, by place, and the processes it must stop."""

    tmp: Path
    address: str = ""
    seen: dict[str, bytes] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)

    def record(self, place: str, data: bytes | str) -> None:
        assert place not in self.seen, f"two places named {place!r}"
        self.seen[place] = data.encode() if isinstance(data, str) else data

    def answer(self, place: str, message: Any) -> Any:
        """Record a gRPC answer the test got itself: its bytes and its text form."""
        self.record(place, message.SerializeToString() + b"\n" + str(message).encode())
        return message

    def refusal(self, place: str, error: grpc.aio.AioRpcError) -> grpc.StatusCode:
        self.record(
            place,
            "\n".join(
                [
                    str(error.code()),
                    error.details() or "",
                    error.debug_error_string() or "",
                    repr(error.trailing_metadata()),
                ]
            ),
        )
        return error.code()

    async def kiln(
        self,
        place: str,
        *argv: str,
        token_file: Path | None = None,
        env_token: str | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """One ``kiln`` command as its own process; its stdout and stderr recorded."""
        command = [sys.executable, "-m", "controller.cli.main", "--controller", self.address]
        if token_file is not None:
            command += ["--token-file", str(token_file)]
        env = clean_env(KILN_CONFIG=str(self.tmp / "no-config.toml"))
        if env_token is not None:
            env["KILN_TOKEN"] = env_token
        done = await asyncio.to_thread(
            subprocess.run,
            [*command, *argv],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )
        self.record(f"kiln {place}: stdout", done.stdout)
        self.record(f"kiln {place}: stderr", done.stderr)
        return done

    def spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        """A long-running process, stdout and stderr into ``TMP/<name>.log``."""
        log = (self.tmp / f"{name}.log").open("wb")
        self.logs.append(log)
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=REPO,
        )
        self.procs.append(proc)
        return proc

    async def stop(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGTERM, and wait (SIGKILL after 20 s)."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(proc.wait, 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)
            return -9

    async def stop_all(self) -> None:
        for proc in reversed(self.procs):  # the agent before the controller
            with contextlib.suppress(Exception):
                await self.stop(proc)
        for log in self.logs:
            log.close()


async def wait_serving(address: str, proc: subprocess.Popen[bytes], log: Path, ready: Path) -> None:
    """Until health says SERVING and ``ready`` (the bootstrap token file) exists."""
    deadline = time.monotonic() + 30
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING and ready.exists():
                    return
            assert proc.poll() is None, f"the controller exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the controller never served"
            await asyncio.sleep(0.2)


async def read_mqtt(
    ca: Path, port: int, payloads: list[tuple[str, bytes]], subscribed: asyncio.Event
) -> None:
    """Every message on ``kiln/v1/#``, as (topic, payload), until cancelled."""
    async with aiomqtt.Client(
        "127.0.0.1",
        port,
        username=READER_USER,
        password=READER_PASSWORD,
        tls_context=ssl.create_default_context(cafile=str(ca)),
    ) as client:
        await client.subscribe("kiln/v1/#", qos=1)
        subscribed.set()
        async for message in client.messages:
            payloads.append((str(message.topic), bytes(message.payload)))  # type: ignore[arg-type]


def mqtt_events(payloads: Iterable[tuple[str, bytes]]) -> list[dict[str, Any]]:
    return [json.loads(p) for topic, p in payloads if topic == "kiln/v1/events"]


def leaks(
    seen: Mapping[str, bytes], secrets: Mapping[str, tuple[str, frozenset[str]]]
) -> list[str]:
    """Every (secret, place) where a secret is found outside the places it may be."""
    found = []
    for label, (value, allowed) in secrets.items():
        needle = value.encode()
        for place, data in seen.items():
            if place not in allowed and needle in data:
                at = data.index(needle)
                context = data[max(0, at - 80) : at + len(needle) + 40]
                found.append(f"{label} in {place}: …{context!r}…")
    return found


def write_secret(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.timeout(240)
async def test_a_full_fleet_session_leaves_no_secret_in_the_clear(tmp_path: Path) -> None:
    pki, keep, state = tmp_path / "pki", tmp_path / "secrets", tmp_path / "state"
    for d in (pki, keep):
        d.mkdir()
    ca = TestCa(pki)
    broker_cert = ca.server("broker")
    tls = BrokerCertificates(ca.ca_path, broker_cert.cert, broker_cert.key)
    s = Session(tmp_path)
    port = free_port()
    s.address = f"127.0.0.1:{port}"
    admin_file = keep / "bootstrap-admin.token"
    mqtt_password_file = write_secret(keep / "mqtt.pass", BROKER_PASSWORD)
    old_file = write_secret(keep / "bmc-old.pass", OLD_BMC)
    agent_file = keep / "agent.token"
    tokens: dict[str, str] = {}
    payloads: list[tuple[str, bytes]] = []
    peer_logs: dict[str, str] = {}
    emulator = RedfishEmulator(
        [SimSystem(name=NODE, uuid=UUID, power_state="On")],
        username=BMC_USER,
        password=NEW_BMC,  # changed on the BMC: Kiln still has OLD_BMC
        workdir=tmp_path / "redfish",
    )
    broker = Mosquitto(users={BROKER_USER: BROKER_PASSWORD, READER_USER: READER_PASSWORD}, tls=tls)
    async with broker, emulator:
        subscribed = asyncio.Event()
        reader = asyncio.create_task(read_mqtt(ca.ca_path, broker.port, payloads, subscribed))
        try:
            await asyncio.wait_for(subscribed.wait(), 15)
            controller = s.spawn(
                "controller",
                [
                    sys.executable, "-m", "controller.main",
                    "--listen", s.address,
                    "--state-dir", str(state),
                    "--reconcile-interval", "0.3",
                    "--auth",
                    "--bootstrap-token-file", str(admin_file),
                    "--mqtt", f"{broker.host}:{broker.port}",
                    "--mqtt-username", BROKER_USER,
                    "--mqtt-password-file", str(mqtt_password_file),
                    "--mqtt-tls-ca", str(ca.ca_path),
                    "-v",
                ],
            )  # fmt: skip
            await wait_serving(s.address, controller, tmp_path / "controller.log", admin_file)
            tokens["bootstrap-admin"] = admin_file.read_text().strip()
            assert admin_file.stat().st_mode & 0o777 == 0o600

            # -- tokens of every role, made by the bootstrap admin ----------------
            me = await s.kiln("whoami (bootstrap)", "whoami", token_file=admin_file)
            assert me.stdout == "bootstrap-admin (admin, by token)\n", me
            files = {}
            for name, role in (
                ("s-admin", "admin"),
                ("s-provisioner", "provisioner"),
                ("s-doomed", "operator"),
            ):
                files[name] = keep / f"{name}.token"
                made = await s.kiln(
                    f"create {name}",
                    *("tokens", "create", name, "--role", role, "--out", str(files[name])),
                    token_file=admin_file,
                )
                assert made.returncode == 0 and "written to" in made.stdout, made
                tokens[name] = files[name].read_text().strip()
            made = await s.kiln(  # the table form: the secret alone on stdout
                "create s-operator",
                *("tokens", "create", "s-operator", "--role", "operator"),
                token_file=admin_file,
            )
            assert made.returncode == 0 and "shown this once" in made.stderr, made
            tokens["s-operator"] = made.stdout.strip()
            files["s-operator"] = write_secret(keep / "s-operator.token", tokens["s-operator"])
            made = await s.kiln(  # the JSON form: the secret in the answer's "secret"
                "create s-viewer",
                *("-o", "json", "tokens", "create", "s-viewer", "--role", "viewer"),
                *("--ttl", "1h"),
                token_file=admin_file,
            )
            assert made.returncode == 0, made
            tokens["s-viewer"] = json.loads(made.stdout)["secret"]
            admin, operator, viewer = files["s-admin"], files["s-operator"], tokens["s-viewer"]

            # -- a node enrolled with the BMC's old password ---------------------
            enrolled = await s.kiln(
                "enroll",
                *("nodes", "enroll", NODE, "--bmc", emulator.system_url(NODE)),
                *("--username", BMC_USER, "--password-file", str(old_file), "--rack", "r1"),
                *("--agent-token-file", str(agent_file)),
                token_file=files["s-provisioner"],
            )
            assert enrolled.returncode == 0, enrolled
            assert agent_file.stat().st_mode & 0o777 == 0o600
            tokens["agent"] = agent_file.read_text().strip()
            refused = await s.kiln(
                "power status (old password)",
                *("nodes", "power", NODE, "status"),
                token_file=operator,
            )
            assert refused.returncode == 1 and "refused the credentials" in refused.stderr

            replaced = await s.kiln(  # the new password from standard input
                "set-credentials",
                *("nodes", "set-credentials", NODE, "--username", BMC_USER),
                *("--password-file", "-"),
                token_file=admin,
                stdin=NEW_BMC + "\n",
            )
            assert replaced.returncode == 0, replaced
            assert f"BMC credentials replaced (user {BMC_USER})" in replaced.stdout
            power = await s.kiln(
                "power status", "nodes", "power", NODE, "status", token_file=operator
            )
            assert power.returncode == 0 and " on " in power.stdout, power
            power = await s.kiln(
                "power status json",
                *("-o", "json", "nodes", "power", NODE, "status"),
                env_token=tokens["s-operator"],
            )
            assert power.returncode == 0 and '"power": "on"' in power.stdout, power

            # -- the agent, on its node's token ----------------------------------
            agent = s.spawn(
                "agent",
                [
                    sys.executable, "-m", "agent.main",
                    "--controller", s.address,
                    "--node-name", NODE,
                    "--nvml", "fake:h200",
                    "--token-file", str(agent_file),
                    "-v",
                ],
            )  # fmt: skip

            # -- reading, as a viewer (the token in $KILN_TOKEN) ----------------
            for place, argv in (
                ("nodes list", ["nodes", "list"]),
                ("nodes list json", ["-o", "json", "nodes", "list"]),
                ("nodes list verbose", ["-vv", "nodes", "list"]),
                ("nodes show", ["nodes", "show", NODE]),
                ("whoami (viewer)", ["whoami"]),
            ):
                done = await s.kiln(place, *argv, env_token=viewer)
                assert done.returncode == 0, done
            denied = await s.kiln(
                "power off (viewer)", "nodes", "power", NODE, "off", env_token=viewer
            )
            assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr, denied
            me = await s.kiln("whoami (agent)", "whoami", token_file=agent_file)
            assert me.stdout == f"{NODE} (agent, by token)\n", me

            # -- a revoked token, and a forged one -------------------------------
            revoked = await s.kiln("revoke", "tokens", "revoke", "s-doomed", token_file=admin)
            assert revoked.stdout == "token s-doomed revoked\n", revoked
            for place, argv in (
                ("whoami (revoked)", ["whoami"]),
                ("power status (revoked)", ["nodes", "power", NODE, "status"]),
            ):
                done = await s.kiln(place, *argv, token_file=files["s-doomed"])
                assert done.returncode == 1, done
                assert "UNAUTHENTICATED: token 's-doomed' was revoked" in done.stderr, done
            forged_id = tokens["s-admin"].split(".")[1]
            tokens["forged"] = f"kiln.{forged_id}.{'F0rgedSecret' * 4}"
            done = await s.kiln("whoami (forged)", "whoami", env_token=tokens["forged"])
            assert done.returncode == 1 and "UNAUTHENTICATED" in done.stderr, done

            # -- the agent connected ---------------------------------------------
            async with grpc.aio.insecure_channel(s.address) as channel:
                stub = fleet_pb2_grpc.FleetServiceStub(channel)

                def bearer(token: str) -> tuple[tuple[str, str], ...]:
                    return (("authorization", f"Bearer {token}"),)

                root = bearer(tokens["s-admin"])
                deadline = time.monotonic() + 45
                while True:
                    node = await stub.GetNode(
                        fleet_pb2.GetNodeRequest(name=NODE), metadata=root, timeout=10
                    )
                    if node.agent_connected and len(node.gpus) == 8:
                        break
                    assert agent.poll() is None, (tmp_path / "agent.log").read_text()
                    assert time.monotonic() < deadline, f"the agent never connected: {node}"
                    await asyncio.sleep(0.2)
                s.answer("grpc GetNode", node)

                # -- the admin's reads, by CLI and directly --------------------------
                for place, argv in (
                    ("nodes show json", ["-o", "json", "nodes", "show", NODE]),
                    ("tokens list", ["tokens", "list", "--all"]),
                    ("tokens list json", ["-o", "json", "tokens", "list", "--all"]),
                    ("audit list", ["audit", "list"]),
                    ("audit list json", ["-o", "json", "audit", "list"]),
                    ("events watch", ["events", "watch", "--no-follow"]),
                    ("events watch json", ["-o", "json", "events", "watch", "--no-follow"]),
                ):
                    done = await s.kiln(place, *argv, token_file=admin)
                    assert done.returncode == 0, done
                for place, rpc, request in (
                    ("ListNodes", "ListNodes", fleet_pb2.ListNodesRequest()),
                    ("ListTokens", "ListTokens", fleet_pb2.ListTokensRequest(include_revoked=True)),
                    ("ListAudit", "ListAudit", fleet_pb2.ListAuditRequest()),
                    ("WhoAmI", "WhoAmI", fleet_pb2.WhoAmIRequest()),
                ):
                    s.answer(
                        f"grpc {place}",
                        await getattr(stub, rpc)(request, metadata=root, timeout=10),
                    )
                events = [
                    s.answer(f"grpc WatchEvents #{e.seq}", e)
                    async for e in stub.WatchEvents(
                        fleet_pb2.WatchEventsRequest(follow=False), metadata=root
                    )
                ]
                power_off = fleet_pb2.PowerNodeRequest(name=NODE, action=types_pb2.POWER_ACTION_OFF)
                for place, token in (
                    ("viewer", tokens["s-viewer"]),
                    ("revoked", tokens["s-doomed"]),
                    ("forged", tokens["forged"]),
                    ("agent", tokens["agent"]),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await stub.PowerNode(power_off, metadata=bearer(token), timeout=10)
                    code = s.refusal(f"grpc PowerNode refused ({place})", caught.value)
                    assert code in (
                        grpc.StatusCode.PERMISSION_DENIED,
                        grpc.StatusCode.UNAUTHENTICATED,
                    )
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.SetNodeCredentials(  # an operator may not
                        fleet_pb2.SetNodeCredentialsRequest(
                            name=NODE, username=BMC_USER, password=OLD_BMC
                        ),
                        metadata=bearer(tokens["s-operator"]),
                        timeout=10,
                    )
                assert s.refusal("grpc SetNodeCredentials refused", caught.value) == (
                    grpc.StatusCode.PERMISSION_DENIED
                )

            # -- every event reached the subscriber ------------------------------
            last = events[-1].seq
            deadline = time.monotonic() + 20
            while not any(e["seq"] >= last for e in mqtt_events(payloads)):
                assert time.monotonic() < deadline, f"MQTT never got event {last}"
                await asyncio.sleep(0.1)
            running_db = database_bytes(state)  # the write-ahead log not yet folded in

            assert await s.stop(agent) == 0, (tmp_path / "agent.log").read_text()[-3000:]
            assert await s.stop(controller) == 0, (tmp_path / "controller.log").read_text()
            await asyncio.sleep(0.5)  # what the controller published as it stopped
        finally:
            await s.stop_all()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await reader
            peer_logs["mosquitto"] = broker.log_tail(limit=10**7)
            peer_logs["redfish emulator"] = emulator.log_tail(limit=10**7)

    # -- what was seen, everywhere -------------------------------------------------
    s.record("controller output", (tmp_path / "controller.log").read_bytes())
    s.record("agent output", (tmp_path / "agent.log").read_bytes())
    for i, (topic, payload) in enumerate(payloads):
        s.record(f"mqtt #{i} {topic}", topic.encode() + b"\n" + payload)
    s.record("database while running", running_db)
    s.record("database after stop", database_bytes(state))
    for name, text in peer_logs.items():
        s.record(f"{name} log", text)

    made_in = {  # the one answer that made each token; no other place may hold it
        "s-operator": "kiln create s-operator: stdout",
        "s-viewer": "kiln create s-viewer: stdout",
    }
    secrets: dict[str, tuple[str, frozenset[str]]] = {}
    for name, token in tokens.items():
        allowed = frozenset([made_in[name]] if name in made_in else [])
        whole, secret = secret_parts(token)
        secrets[f"token {name}"] = (whole, allowed)
        secrets[f"secret part of token {name}"] = (secret, allowed)
    for label, password in (
        ("old BMC password", OLD_BMC),
        ("new BMC password", NEW_BMC),
        ("controller's MQTT password", BROKER_PASSWORD),
        ("reader's MQTT password", READER_PASSWORD),
    ):
        secrets[label] = (password, frozenset())

    # Not vacuous: each place was filled, and holds what the session did.
    for name, place in made_in.items():
        assert tokens[name].encode() in s.seen[place]
    assert len(tokens) == 8 and len(set(tokens.values())) == 8
    controller_out = s.seen["controller output"].decode()
    assert f"as {BROKER_USER}, TLS" in controller_out, controller_out[-3000:]
    assert "wrote a new admin token" in controller_out
    assert b"fernet:" in s.seen["database after stop"]
    assert b"scrypt$" in s.seen["database after stop"]
    assert f"node {NODE}: registered".encode() in s.seen["agent output"]
    audit = json.loads(s.seen["kiln audit list json: stdout"])["entries"]
    assert any(
        e["method"] == "SetNodeCredentials" and e["who"] == "s-admin" and e["code"] == "OK"
        for e in audit
    ), audit
    assert any(
        e["method"] == "PowerNode" and e["who"] == "s-viewer" and e["code"] == "PERMISSION_DENIED"
        for e in audit
    ), audit
    enrol = next(e for e in audit if e["method"] == "EnrollNode")
    assert enrol["who"] == "s-provisioner" and "[redacted]" in enrol["arguments_json"], enrol
    kinds = [e["kind"] for e in mqtt_events(payloads)]
    assert {"node.enrolled", "node.credentials", "node.agent", "audit.call"} <= set(kinds), kinds
    assert any(t.startswith(f"kiln/v1/nodes/{NODE}/") for t, _ in payloads)
    tokens_listed = s.seen["kiln tokens list: stdout"].decode()
    for name in ("bootstrap-admin", "s-admin", "s-viewer", "s-doomed", f"agent:{NODE}"):
        assert name in tokens_listed
    assert b"sec-rf-1" in s.seen["kiln nodes list: stdout"]
    assert len(s.seen) > 60

    found = leaks(s.seen, secrets)
    assert not found, "secrets in the clear:\n" + "\n".join(found)
