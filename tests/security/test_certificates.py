"""Client certificates from the fleet CA as identities, under mutual TLS.

An operator's certificate carries its role (OU, or a SAN URI
``kiln:role:ROLE``); a certificate without a role is an agent's, bound to
the node it names, and may call nothing but ``AgentService``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from sec_fleet import SecuredController, refusal
from sec_pki import RoleCa
from tls_certs import CertFiles

from agent.client import Agent
from agent.nvml import open_backend
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc
from kiln_common.tls import channel_credentials

DENIED = grpc.StatusCode.PERMISSION_DENIED


@dataclass(frozen=True)
class Pki:
    ca: RoleCa
    server: CertFiles
    admin: CertFiles  # URI kiln:role:admin
    operator: CertFiles  # OU=operator
    viewer: CertFiles  # OU=viewer plus an OU that is no role
    two_roles: CertFiles  # OU=viewer and URI kiln:role:admin
    bad_role: CertFiles  # URI kiln:role:root
    node_a: CertFiles  # an agent: CN=cert-a, no role


def creds(pki: Pki, who: CertFiles) -> grpc.ChannelCredentials:
    made = channel_credentials(pki.ca.ca_path, who.cert, who.key)
    assert made is not None
    return made


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca = RoleCa(tmp_path_factory.mktemp("pki"))
    return Pki(
        ca=ca,
        server=ca.server(),
        admin=ca.person("alice", uris=("kiln:role:admin",)),
        operator=ca.person("bob", ous=("operator",)),
        viewer=ca.person("carol", ous=("Datacentre West", "viewer")),
        two_roles=ca.person("mallory", ous=("viewer",), uris=("kiln:role:admin",)),
        bad_role=ca.person("trent", uris=("kiln:role:root",)),
        node_a=ca.client("cert-a"),
    )


@pytest.fixture(scope="module")
def ctl(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredController]:
    controller = SecuredController(
        tmp_path_factory.mktemp("mtls"),
        channel_credentials=creds(pki, pki.admin),
        config={
            "tls_cert": pki.server.cert,
            "tls_key": pki.server.key,
            "tls_client_ca": pki.ca.ca_path,
        },
    )
    try:
        yield controller
    finally:
        controller.stop()


def as_(ctl: SecuredController, pki: Pki, who: CertFiles) -> grpc.Channel:
    return grpc.secure_channel(ctl.address, creds(pki, who))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("who", "identity", "role"),
    [
        pytest.param("admin", "alice", "admin", id="uri-san"),
        pytest.param("operator", "bob", "operator", id="ou"),
        pytest.param("viewer", "carol", "viewer", id="ou-among-others"),
        pytest.param("node_a", "cert-a", "agent", id="no-role-is-an-agent"),
    ],
)
def test_a_certificate_names_its_caller_and_role(
    ctl: SecuredController, pki: Pki, who: str, identity: str, role: str
) -> None:
    with as_(ctl, pki, getattr(pki, who)) as channel:
        me = fleet_pb2_grpc.FleetServiceStub(channel).WhoAmI(fleet_pb2.WhoAmIRequest(), timeout=20)
    assert (me.identity, me.role, me.method) == (identity, role, "certificate")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("who", "expected"),
    [
        pytest.param("two_roles", "names several roles (admin, viewer)", id="two-roles"),
        pytest.param("bad_role", "names unknown role 'root'", id="unknown-role"),
    ],
)
def test_a_certificate_with_a_confusing_role_is_unauthenticated(
    ctl: SecuredController, pki: Pki, who: str, expected: str
) -> None:
    with as_(ctl, pki, getattr(pki, who)) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        code, details = refusal(lambda: stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=20))
    assert code is grpc.StatusCode.UNAUTHENTICATED
    assert expected in details


@pytest.mark.timeout(60)
def test_an_agent_certificate_cannot_call_fleet_service(ctl: SecuredController, pki: Pki) -> None:
    with as_(ctl, pki, pki.node_a) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        code, details = refusal(lambda: stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=20))
    assert code is DENIED
    assert details == (
        "ListNodes needs role viewer, operator, provisioner or admin; "
        "'cert-a' (agent) may not call it"
    )


@pytest.mark.timeout(60)
def test_roles_from_certificates_are_enforced(ctl: SecuredController, pki: Pki) -> None:
    ctl.call("EnrollNode", _enrol("cert-drain"))  # as alice, the admin
    drain = fleet_pb2.DrainNodeRequest(name="cert-drain", reason="fan")
    with as_(ctl, pki, pki.viewer) as channel:
        code, details = refusal(
            lambda: fleet_pb2_grpc.FleetServiceStub(channel).DrainNode(drain, timeout=20)
        )
    assert code is DENIED and "'carol' (viewer)" in details
    with as_(ctl, pki, pki.operator) as channel:
        stub = fleet_pb2_grpc.FleetServiceStub(channel)
        assert stub.DrainNode(drain, timeout=20).name == "cert-drain"
        code, _ = refusal(
            lambda: stub.CreateToken(fleet_pb2.CreateTokenRequest(name="x", role="admin"))
        )
    assert code is DENIED
    entries = ctl.audit(method="DrainNode")
    assert [(e.who, e.role, e.code) for e in entries] == [
        ("carol", "viewer", "PERMISSION_DENIED"),
        ("bob", "operator", "OK"),
    ]


def _enrol(name: str) -> fleet_pb2.EnrollNodeRequest:
    from sec_fleet import BMC_PASSWORD, dead_bmc

    return fleet_pb2.EnrollNodeRequest(
        name=name, bmc_url=dead_bmc(), username="admin", password=BMC_PASSWORD
    )


@pytest.mark.timeout(60)
async def test_an_agent_certificate_registers_its_own_node_only(
    ctl: SecuredController, pki: Pki
) -> None:
    for name in ("cert-a", "cert-victim"):
        await asyncio.to_thread(ctl.call, "EnrollNode", _enrol(name))
    register = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="cert-victim"))
    async with grpc.aio.secure_channel(ctl.address, creds(pki, pki.node_a)) as channel:
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(iter([register]))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(call.read(), 20)
    assert caught.value.code() is DENIED
    assert caught.value.details() == "certificate for 'cert-a' cannot register node 'cert-victim'"

    agent = Agent(
        ctl.address,
        "cert-a",
        open_backend("fake:h100"),
        backend="fake:h100",
        backoff=(0.1, 1.0),
        channel_credentials=creds(pki, pki.node_a),
    )
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 20)
    finally:
        await agent.stop()
        await asyncio.wait_for(task, 10)

    refused = await asyncio.to_thread(ctl.audit, method="Connect")
    assert [(e.who, e.role, e.code) for e in refused] == [("cert-a", "agent", "PERMISSION_DENIED")]
    assert "cannot register node 'cert-victim'" in refused[0].detail


@pytest.mark.timeout(60)
def test_an_admin_certificate_makes_tokens_in_its_name(ctl: SecuredController, pki: Pki) -> None:
    made = ctl.call("CreateToken", fleet_pb2.CreateTokenRequest(name="from-cert", role="viewer"))
    assert made.token.created_by == "alice"
    [entry] = ctl.audit(method="CreateToken", who="alice")
    assert (entry.role, entry.code) == ("admin", "OK")
