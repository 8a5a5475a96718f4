"""The controller signs in to a real Mosquitto that wants a password and TLS.

The broker (``controller.sim.mosquitto``) has a password file made with
``mosquitto_passwd`` and a TLS listener with a certificate from a test CA;
the controller is configured through its real options.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import grpc
import pytest
from tls_certs import TestCa

from controller.core.errors import InvalidArgument
from controller.options import parse
from controller.server import ControllerServer
from controller.sim.mosquitto import BrokerCertificates, Mosquitto
from kiln.v1 import fleet_pb2, fleet_pb2_grpc

USER, PASSWORD = "kiln-controller", "mqtt-Secret-4417"


@pytest.fixture
def ca(tmp_path: Path) -> TestCa:
    (tmp_path / "pki").mkdir()
    return TestCa(tmp_path / "pki")


@pytest.fixture
async def broker(ca: TestCa) -> AsyncIterator[Mosquitto]:
    server = ca.server("broker")
    tls = BrokerCertificates(ca.ca_path, server.cert, server.key)
    async with Mosquitto(users={USER: PASSWORD, "reader": "reader-pw"}, tls=tls) as b:
        yield b


def options(tmp_path: Path, broker: Mosquitto, ca: TestCa, password: str) -> list[str]:
    password_file = tmp_path / "mqtt.pass"
    password_file.write_text(password + "\n")
    return [
        "--state-dir",
        str(tmp_path / "state"),
        "--listen",
        "127.0.0.1:0",
        "--mqtt",
        f"{broker.host}:{broker.port}",
        "--mqtt-username",
        USER,
        "--mqtt-password-file",
        str(password_file),
        "--mqtt-tls-ca",
        str(ca.ca_path),
    ]


def reader_tls(ca: TestCa) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca.ca_path))


async def enroll(address: str, name: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        await fleet_pb2_grpc.FleetServiceStub(channel).EnrollNode(
            fleet_pb2.EnrollNodeRequest(
                name=name,
                bmc_url="redfish+http://127.0.0.1:9/redfish/v1/Systems/1",
                username="admin",
                password="pw",
            )
        )


@pytest.mark.timeout(60)
async def test_events_reach_a_broker_that_wants_a_password_and_tls(
    tmp_path: Path, broker: Mosquitto, ca: TestCa, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = parse(options(tmp_path, broker, ca, PASSWORD)).config
    assert PASSWORD not in repr(config)
    server = ControllerServer(config)
    async with aiomqtt.Client(
        broker.host,
        broker.port,
        username="reader",
        password="reader-pw",
        tls_context=reader_tls(ca),
    ) as reader:
        await reader.subscribe("kiln/v1/events", qos=1)
        address = await server.start()
        try:
            await enroll(address, "n1")
            kinds = []
            async with asyncio.timeout(20):
                async for message in reader.messages:
                    event = json.loads(bytes(message.payload))  # type: ignore[arg-type]
                    kinds.append(event["kind"])
                    if event["kind"] == "node.enrolled" and event["node"] == "n1":
                        break
        finally:
            await server.stop()
    assert "node.enrolled" in kinds
    assert f"as {USER}, TLS" in caplog.text
    assert PASSWORD not in caplog.text


@pytest.mark.timeout(60)
async def test_a_wrong_password_is_retried_and_logged_without_the_password(
    tmp_path: Path, broker: Mosquitto, ca: TestCa, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "not-the-mqtt-password-99"
    server = ControllerServer(parse(options(tmp_path, broker, ca, wrong)).config)
    await server.start()
    try:
        async with asyncio.timeout(20):
            while "unavailable" not in caplog.text:  # noqa: ASYNC110 (a log, not an event)
                await asyncio.sleep(0.1)
        assert server.publisher is not None and not server.publisher.connected
    finally:
        await server.stop()
    refused = [r.getMessage() for r in caplog.records if "MQTT" in r.getMessage()]
    assert any("authori" in line.lower() for line in refused), refused
    assert wrong not in caplog.text


@pytest.mark.timeout(60)
async def test_plaintext_to_a_tls_broker_never_connects(
    tmp_path: Path, broker: Mosquitto, ca: TestCa
) -> None:
    args = options(tmp_path, broker, ca, PASSWORD)
    plain = args[: args.index("--mqtt-tls-ca")]
    server = ControllerServer(parse(plain).config)
    await server.start()
    try:
        await asyncio.sleep(2)
        assert server.publisher is not None and not server.publisher.connected
    finally:
        await server.stop()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (["--mqtt-username", "u"], "--mqtt-username and --mqtt-password-file go together"),
        (["--mqtt-tls-ca", "{tmp}/missing.pem"], "--mqtt-tls-ca {tmp}/missing.pem: No such file"),
        (["--mqtt-tls-cert", "{tmp}/c.pem"], "--mqtt-tls-cert and --mqtt-tls-key go together"),
        (["--mqtt-password-file", "{tmp}/empty"], "--mqtt-password-file {tmp}/empty: the file"),
        (["--mqtt-password-file", "{tmp}/nope"], "--mqtt-password-file {tmp}/nope: No such file"),
    ],
)
def test_bad_broker_options_are_one_line(tmp_path: Path, extra: list[str], problem: str) -> None:
    (tmp_path / "empty").write_text("")
    args = ["--state-dir", str(tmp_path / "s"), "--mqtt", "127.0.0.1:1883"]
    args += [a.format(tmp=tmp_path) for a in extra]
    if "--mqtt-password-file" in extra:
        args += ["--mqtt-username", "u"]
    with pytest.raises(InvalidArgument) as caught:
        parse(args)
    assert problem.format(tmp=tmp_path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_broker_options_need_a_broker(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="need --mqtt HOST:PORT"):
        parse(["--state-dir", str(tmp_path), "--mqtt-tls"])
