"""Every refusal of a controller with authentication on, on real gRPC calls.

One controller for the module (127.0.0.1, ``auth=True``, plaintext, a
bootstrap admin token); tokens of each role are made with the admin token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sec_fleet import SecuredController, refusal

from agent.client import Agent
from agent.nvml import open_backend
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, types_pb2

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredController]:
    controller = SecuredController(tmp_path_factory.mktemp("secured"))
    try:
        yield controller
    finally:
        controller.stop()


@pytest.fixture(scope="module")
def tokens(ctl: SecuredController) -> dict[str, str]:
    return {
        role: ctl.token(f"t-{role}", role)
        for role in ("viewer", "operator", "provisioner", "admin")
    }


# -- who is refused at the door ----------------------------------------------------


@pytest.mark.timeout(60)
def test_a_call_without_credentials_is_unauthenticated(ctl: SecuredController) -> None:
    code, details = refusal(lambda: ctl.call("ListNodes", fleet_pb2.ListNodesRequest()))
    assert code is UNAUTHENTICATED
    assert "needs credentials" in details


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        pytest.param("Basic dXNlcjpwdw==", "must read 'Bearer <token>'", id="not-bearer"),
        pytest.param("Bearer ", "must read 'Bearer <token>'", id="empty"),
        pytest.param("Bearer not-a-kiln-token", "malformed", id="malformed"),
        pytest.param("Bearer kiln.0123456789ab.made-up-secret", "is not valid", id="unknown-id"),
    ],
)
def test_bad_authorization_metadata_is_unauthenticated(
    ctl: SecuredController, authorization: str, expected: str
) -> None:
    def call() -> object:
        return ctl.stub.ListNodes(
            fleet_pb2.ListNodesRequest(), metadata=(("authorization", authorization),), timeout=20
        )

    code, details = refusal(call)
    assert code is UNAUTHENTICATED and expected in details, details


@pytest.mark.timeout(60)
def test_a_right_id_with_a_wrong_secret_is_unauthenticated(
    ctl: SecuredController, tokens: dict[str, str]
) -> None:
    token_id = tokens["viewer"].split(".")[1]
    forged = f"kiln.{token_id}.{'x' * 43}"
    code, details = refusal(lambda: ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), forged))
    assert (code, details) == (UNAUTHENTICATED, "the bearer token is not valid")


@pytest.mark.timeout(60)
def test_a_revoked_token_is_unauthenticated_at_once(ctl: SecuredController) -> None:
    token = ctl.token("soon-revoked", "viewer")
    ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), token)  # works, and is cached
    revoked = ctl.call("RevokeToken", fleet_pb2.RevokeTokenRequest(name="soon-revoked"), ctl.admin)
    assert revoked.revoked
    code, details = refusal(lambda: ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), token))
    assert (code, details) == (UNAUTHENTICATED, "token 'soon-revoked' was revoked")


@pytest.mark.timeout(60)
def test_an_expired_token_is_unauthenticated(ctl: SecuredController) -> None:
    token = ctl.token("short-lived", "viewer", ttl_s=1.0)
    ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), token)
    time.sleep(1.2)
    code, details = refusal(lambda: ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), token))
    assert (code, details) == (UNAUTHENTICATED, "token 'short-lived' has expired")


# -- what each role may not do ------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_viewer_cannot_power_off(ctl: SecuredController, tokens: dict[str, str]) -> None:
    ctl.enroll("view-n1")
    request = fleet_pb2.PowerNodeRequest(name="view-n1", action=types_pb2.POWER_ACTION_OFF)
    code, details = refusal(lambda: ctl.call("PowerNode", request, tokens["viewer"]))
    assert code is DENIED
    assert details == "PowerNode needs role operator or admin; 't-viewer' (viewer) may not call it"
    listed = ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), tokens["viewer"])
    assert "view-n1" in [n.name for n in listed.nodes]  # but it may read


@pytest.mark.timeout(60)
def test_an_operator_cannot_create_tokens(ctl: SecuredController, tokens: dict[str, str]) -> None:
    request = fleet_pb2.CreateTokenRequest(name="mine", role="admin")
    code, details = refusal(lambda: ctl.call("CreateToken", request, tokens["operator"]))
    assert code is DENIED
    assert details.startswith("CreateToken needs role admin;")
    names = [
        t.name for t in ctl.call("ListTokens", fleet_pb2.ListTokensRequest(), ctl.admin).tokens
    ]
    assert "mine" not in names


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("role", "rpc", "request_", "needed"),
    [
        pytest.param(
            "operator",
            "EnrollNode",
            fleet_pb2.EnrollNodeRequest(name="x"),
            "provisioner or admin",
            id="operator-enrol",
        ),
        pytest.param(
            "provisioner",
            "DrainNode",
            fleet_pb2.DrainNodeRequest(name="x"),
            "operator or admin",
            id="provisioner-drain",
        ),
        pytest.param(
            "viewer",
            "CreateAllocation",
            fleet_pb2.CreateAllocationRequest(),
            "operator, provisioner or admin",
            id="viewer-allocate",
        ),
        pytest.param(
            "operator", "ListAudit", fleet_pb2.ListAuditRequest(), "admin", id="operator-audit"
        ),
        pytest.param(
            "operator",
            "IssueAgentToken",
            fleet_pb2.IssueAgentTokenRequest(node="x"),
            "provisioner or admin",
            id="operator-agent-token",
        ),
        pytest.param(
            "provisioner",
            "SetNodeCredentials",
            fleet_pb2.SetNodeCredentialsRequest(name="x"),
            "admin",
            id="provisioner-credentials",
        ),
    ],
)
def test_roles_are_refused_what_is_not_theirs(
    ctl: SecuredController,
    tokens: dict[str, str],
    role: str,
    rpc: str,
    request_: object,
    needed: str,
) -> None:
    code, details = refusal(lambda: ctl.call(rpc, request_, tokens[role]))
    assert code is DENIED
    assert details.startswith(f"{rpc} needs role {needed};"), details


@pytest.mark.timeout(60)
def test_a_provisioner_releases_only_its_own_allocations(ctl: SecuredController) -> None:
    mine, theirs = ctl.token("pipeline-a", "provisioner"), ctl.token("pipeline-b", "provisioner")
    ctl.enroll("prov-n1", mine)  # GPUs not known yet: allocations queue
    alloc = ctl.call(
        "CreateAllocation",
        fleet_pb2.CreateAllocationRequest(key="job-a", spec=fleet_pb2.AllocationSpec(nodes=1)),
        mine,
    )
    assert alloc.created_by == "pipeline-a"
    release = fleet_pb2.ReleaseAllocationRequest(id=alloc.id)
    code, details = refusal(lambda: ctl.call("ReleaseAllocation", release, theirs))
    assert code is DENIED
    assert "'pipeline-b' may release only its own allocations" in details
    assert ctl.call("ReleaseAllocation", release, mine).state == fleet_pb2.ALLOCATION_STATE_RELEASED


@pytest.mark.timeout(60)
def test_an_agent_token_cannot_call_fleet_service(ctl: SecuredController) -> None:
    ctl.enroll("agent-only")
    agent_token = ctl.call(
        "IssueAgentToken", fleet_pb2.IssueAgentTokenRequest(node="agent-only"), ctl.admin
    ).token
    code, details = refusal(
        lambda: ctl.call("ListNodes", fleet_pb2.ListNodesRequest(), agent_token)
    )
    assert code is DENIED
    assert details.endswith("'agent-only' (agent) may not call it")
    me = ctl.call("WhoAmI", fleet_pb2.WhoAmIRequest(), agent_token)
    assert (me.identity, me.role, me.method) == ("agent-only", "agent", "token")


@pytest.mark.timeout(60)
def test_injectfault_is_unimplemented_on_a_production_controller(
    ctl: SecuredController, tokens: dict[str, str]
) -> None:
    request = fleet_pb2.InjectFaultRequest(node="view-n1", fault_json='{"kind": "heat"}')
    for token in (ctl.admin, tokens["operator"], None):
        code, details = refusal(lambda t=token: ctl.call("InjectFault", request, t))  # type: ignore[misc]
        assert code is grpc.StatusCode.UNIMPLEMENTED
        assert details == "InjectFault exists only on a controller started with --simulation"


# -- agents ---------------------------------------------------------------------------


async def _connect(address: str, node: str, token: str | None) -> grpc.aio.AioRpcError:
    """The controller's refusal of a Connect that sends ``node``'s Register.

    A refusal that comes before the server reads anything can race the
    client's own send of Register; gRPC then reports the failed send
    (INTERNAL, "Internal error from Core") instead of the server's status,
    so that one local outcome is tried again."""
    register = agent_pb2.AgentMessage(register=agent_pb2.Register(node_name=node))
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    for _ in range(5):
        async with grpc.aio.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            call = stub.Connect(iter([register]), metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await asyncio.wait_for(call.read(), 20)
        error = caught.value
        lost_send = error.code() is grpc.StatusCode.INTERNAL and "from Core" in (
            error.details() or ""
        )
        if not lost_send:
            return error
    return error


@pytest.mark.timeout(60)
async def test_an_agent_token_registers_only_its_own_node(ctl: SecuredController) -> None:
    for name in ("agent-a", "agent-b"):
        await asyncio.to_thread(ctl.enroll, name)
    issued = await asyncio.to_thread(
        ctl.call, "IssueAgentToken", fleet_pb2.IssueAgentTokenRequest(node="agent-a"), ctl.admin
    )
    refused = await _connect(ctl.address, "agent-b", issued.token)
    assert refused.code() is DENIED
    assert refused.details() == "agent token for 'agent-a' cannot register node 'agent-b'"

    agent = Agent(
        ctl.address,
        "agent-a",
        open_backend("fake:h200"),
        backend="fake:h200",
        backoff=(0.1, 1.0),
        token=issued.token,
    )
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 20)
    finally:
        await agent.stop()
        await asyncio.wait_for(task, 10)
    node_b = await asyncio.to_thread(
        ctl.call, "GetNode", fleet_pb2.GetNodeRequest(name="agent-b"), ctl.admin
    )
    assert not node_b.agent_connected and len(node_b.gpus) == 0


@pytest.mark.timeout(60)
async def test_agents_need_credentials_and_operators_are_not_agents(
    ctl: SecuredController, tokens: dict[str, str]
) -> None:
    await asyncio.to_thread(ctl.enroll, "agent-c")
    nothing = await _connect(ctl.address, "agent-c", None)
    assert nothing.code() is UNAUTHENTICATED
    admin = await _connect(ctl.address, "agent-c", ctl.admin)
    assert admin.code() is DENIED
    assert admin.details() == "Connect needs role agent; 'bootstrap-admin' (admin) may not call it"


@pytest.mark.timeout(60)
async def test_a_new_agent_token_replaces_the_old(ctl: SecuredController) -> None:
    await asyncio.to_thread(ctl.enroll, "agent-d")
    issue = fleet_pb2.IssueAgentTokenRequest(node="agent-d")
    old = (await asyncio.to_thread(ctl.call, "IssueAgentToken", issue, ctl.admin)).token
    await asyncio.to_thread(ctl.call, "IssueAgentToken", issue, ctl.admin)
    refused = await _connect(ctl.address, "agent-d", old)
    assert refused.code() is UNAUTHENTICATED


@pytest.mark.timeout(60)
def test_an_agent_token_for_an_unknown_node_is_not_issued(ctl: SecuredController) -> None:
    request = fleet_pb2.IssueAgentTokenRequest(node="never-enrolled")
    code, _ = refusal(lambda: ctl.call("IssueAgentToken", request, ctl.admin))
    assert code is grpc.StatusCode.NOT_FOUND


# -- what stays open, and what the callers are told ------------------------------------


@pytest.mark.timeout(60)
def test_health_and_reflection_stay_open(ctl: SecuredController) -> None:
    health = health_pb2_grpc.HealthStub(ctl.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
        health_pb2.HealthCheckResponse.SERVING
    )
    stub = reflection_pb2_grpc.ServerReflectionStub(ctl.channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
    )
    services = {s.name for r in replies for s in r.list_services_response.service}
    assert "kiln.v1.FleetService" in services


@pytest.mark.timeout(60)
def test_whoami_names_each_caller(ctl: SecuredController, tokens: dict[str, str]) -> None:
    for role, token in tokens.items():
        me = ctl.call("WhoAmI", fleet_pb2.WhoAmIRequest(), token)
        assert (me.identity, me.role, me.method) == (f"t-{role}", role, "token")


@pytest.mark.timeout(60)
def test_token_names_and_roles_are_checked(ctl: SecuredController) -> None:
    for name, role, expected in [
        ("ok-name", "agent", "an agent's token comes from IssueAgentToken"),
        ("ok-name", "root", "a token's role is one of"),
        ("has space", "viewer", "a token's name is"),
        ("agent:n1", "viewer", "a token's name is"),
        ("t-viewer", "viewer", "already exists"),
    ]:
        request = fleet_pb2.CreateTokenRequest(name=name, role=role)
        code, details = refusal(lambda r=request: ctl.call("CreateToken", r, ctl.admin))  # type: ignore[misc]
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS)
        assert expected in details, details


@pytest.mark.timeout(60)
def test_the_bootstrap_file_is_private(ctl: SecuredController) -> None:
    path = Path(ctl.state_dir) / "admin.token"
    assert path.stat().st_mode & 0o777 == 0o600
    me = ctl.call("WhoAmI", fleet_pb2.WhoAmIRequest(), ctl.admin)
    assert (me.identity, me.role) == ("bootstrap-admin", "admin")
