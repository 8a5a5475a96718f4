"""kiln.v1.FleetService: thin — convert, await the core, convert back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeAlias

import grpc

from controller.api import convert
from controller.api.auth.call_audit import current_audit
from controller.api.auth.identity import current_caller
from controller.api.errors import streaming, unary
from controller.core.errors import InvalidArgument
from controller.core.fleet import Fleet, TopologyFormat
from controller.core.model import PowerScope, ProvisionScope
from kiln.v1 import fleet_pb2, fleet_pb2_grpc, types_pb2

Ctx: TypeAlias = grpc.aio.ServicerContext


def _action(value: int) -> str:
    action = convert.POWER_ACTION.get(value)
    if action is None:
        raise InvalidArgument(
            "a power action is required (status, on, off, force_off, cycle, restart)"
        )
    return action


class FleetService(fleet_pb2_grpc.FleetServiceServicer):
    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._node_wire = convert.NodeWire()  # nodes and reports in wire form, once each

    @unary
    async def EnrollNode(
        self, request: fleet_pb2.EnrollNodeRequest, context: Ctx
    ) -> fleet_pb2.Node:
        node = await self._fleet.enroll(convert.enroll_spec(request))
        return convert.node_pb(node)

    @unary
    async def ListNodes(
        self, request: fleet_pb2.ListNodesRequest, context: Ctx
    ) -> fleet_pb2.ListNodesResponse:
        page = await self._fleet.list_nodes_page(
            convert.node_filter(request),
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return self._node_wire.page_pb(page.items, page.next_token)

    @unary
    async def GetNode(self, request: fleet_pb2.GetNodeRequest, context: Ctx) -> fleet_pb2.Node:
        return self._node_wire.node_pb(await self._fleet.get_node(request.name))

    @unary
    async def PowerNode(
        self, request: fleet_pb2.PowerNodeRequest, context: Ctx
    ) -> fleet_pb2.PowerNodeResponse:
        result = await self._fleet.power(request.name, _action(request.action))
        return fleet_pb2.PowerNodeResponse(
            name=result.node, power=convert.power_pb(result.power), bmc_health=result.bmc_health
        )

    @streaming
    async def PowerNodes(
        self, request: fleet_pb2.PowerNodesRequest, context: Ctx
    ) -> AsyncIterator[fleet_pb2.PowerProgress]:
        scope = PowerScope(names=tuple(request.names), rack=request.rack, all_nodes=request.all)
        progress = self._fleet.power_many(
            scope, _action(request.action), concurrency=request.concurrency or 64
        )
        async for result, done, total in progress:
            yield convert.power_progress_pb(result, done, total)

    @streaming
    async def ProvisionNodes(
        self, request: fleet_pb2.ProvisionNodesRequest, context: Ctx
    ) -> AsyncIterator[fleet_pb2.ProvisionProgress]:
        progress = self._fleet.provision_many(
            ProvisionScope(names=tuple(request.names), rack=request.rack),
            request.image,
            image_server=request.image_server,
            concurrency=request.concurrency,
            by=current_caller(),
        )
        async for line in progress:
            yield convert.provision_progress_pb(line)

    @streaming
    async def BringUpRack(
        self, request: fleet_pb2.BringUpRackRequest, context: Ctx
    ) -> AsyncIterator[fleet_pb2.BringUpProgress]:
        progress = self._fleet.bring_up_rack(convert.bring_up_request(request), current_caller())
        async for line in progress:
            yield convert.bring_up_line_pb(line)

    @unary
    async def DrainNode(self, request: fleet_pb2.DrainNodeRequest, context: Ctx) -> fleet_pb2.Node:
        return convert.node_pb(await self._fleet.drain(request.name, request.reason))

    @unary
    async def SetNodeCredentials(
        self, request: fleet_pb2.SetNodeCredentialsRequest, context: Ctx
    ) -> fleet_pb2.Node:
        node = await self._fleet.set_credentials(request.name, request.username, request.password)
        return convert.node_pb(node)

    @unary
    async def RemoveNode(
        self, request: fleet_pb2.RemoveNodeRequest, context: Ctx
    ) -> fleet_pb2.RemoveNodeResponse:
        allocation = await self._fleet.remove_node(
            request.name, force=request.force, reason=request.reason
        )
        self._node_wire.forget(request.name)
        return fleet_pb2.RemoveNodeResponse(name=request.name, allocation=allocation)

    @unary
    async def RunChecks(
        self, request: fleet_pb2.RunChecksRequest, context: Ctx
    ) -> fleet_pb2.RunChecksResponse:
        started = await self._fleet.run_checks(
            list(request.nodes), rack=request.rack, level=request.level
        )
        return fleet_pb2.RunChecksResponse(started=started)

    @unary
    async def ListChecks(
        self, request: fleet_pb2.ListChecksRequest, context: Ctx
    ) -> fleet_pb2.ListChecksResponse:
        runs = await self._fleet.list_checks(request.node, limit=request.limit)
        return fleet_pb2.ListChecksResponse(runs=[convert.check_run_pb(r) for r in runs])

    @unary
    async def ClearLeak(self, request: fleet_pb2.ClearLeakRequest, context: Ctx) -> fleet_pb2.Node:
        node = await self._fleet.clear_leak(request.name, request.reason, by=current_caller())
        return convert.node_pb(node)

    @unary
    async def UndrainNode(
        self, request: fleet_pb2.UndrainNodeRequest, context: Ctx
    ) -> fleet_pb2.Node:
        return convert.node_pb(await self._fleet.undrain(request.name))

    @unary
    async def ListRacks(
        self, request: fleet_pb2.ListRacksRequest, context: Ctx
    ) -> fleet_pb2.ListRacksResponse:
        racks = await self._fleet.list_racks()
        return fleet_pb2.ListRacksResponse(racks=[convert.rack_pb(r) for r in racks])

    @unary
    async def ExportTopology(
        self, request: fleet_pb2.ExportTopologyRequest, context: Ctx
    ) -> fleet_pb2.ExportTopologyResponse:
        k8s = request.format == fleet_pb2.TOPOLOGY_FORMAT_K8S_LABELS
        fmt = TopologyFormat.K8S_LABELS if k8s else TopologyFormat.SLURM
        return fleet_pb2.ExportTopologyResponse(text=await self._fleet.export_topology(fmt))

    @unary
    async def CreateAllocation(
        self, request: fleet_pb2.CreateAllocationRequest, context: Ctx
    ) -> fleet_pb2.Allocation:
        spec = convert.spec_from_pb(request.spec)
        allocation = await self._fleet.create_allocation(
            request.key, spec, by=current_caller(), audit=current_audit()
        )
        return convert.allocation_pb(allocation)

    @unary
    async def GetAllocation(
        self, request: fleet_pb2.GetAllocationRequest, context: Ctx
    ) -> fleet_pb2.Allocation:
        return convert.allocation_pb(await self._fleet.get_allocation(request.id))

    @unary
    async def ListAllocations(
        self, request: fleet_pb2.ListAllocationsRequest, context: Ctx
    ) -> fleet_pb2.ListAllocationsResponse:
        page = await self._fleet.list_allocations_page(
            convert.allocation_filter(request),
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return fleet_pb2.ListAllocationsResponse(
            allocations=[convert.allocation_pb(a) for a in page.items],
            next_page_token=page.next_token,
        )

    @unary
    async def GetAllocationReport(
        self, request: fleet_pb2.GetAllocationReportRequest, context: Ctx
    ) -> fleet_pb2.AllocationReport:
        return convert.allocation_report_pb(await self._fleet.allocation_report(request.id))

    @unary
    async def ReleaseAllocation(
        self, request: fleet_pb2.ReleaseAllocationRequest, context: Ctx
    ) -> fleet_pb2.Allocation:
        released = await self._fleet.release(request.id, by=current_caller(), audit=current_audit())
        return convert.allocation_pb(released)

    @streaming
    async def WatchEvents(
        self, request: fleet_pb2.WatchEventsRequest, context: Ctx
    ) -> AsyncIterator[types_pb2.Event]:
        after = convert.sequence_number(request.after_seq)
        if request.from_now:
            after = await self._fleet.latest_event_seq()
        async for event in self._fleet.watch_events(
            after,
            follow=request.follow,
            node=request.node,
            allocation=request.allocation,
        ):
            yield convert.event_pb(event)

    @unary
    async def InjectFault(
        self, request: fleet_pb2.InjectFaultRequest, context: Ctx
    ) -> fleet_pb2.InjectFaultResponse:
        outcome = await self._fleet.inject_fault(request.node, request.fault_json)
        message = outcome.message or "; ".join(outcome.failures or outcome.changed)
        return fleet_pb2.InjectFaultResponse(ok=outcome.ok, message=message)

    # -- identity, tokens, audit -----------------------------------------------

    @unary
    async def WhoAmI(
        self, request: fleet_pb2.WhoAmIRequest, context: Ctx
    ) -> fleet_pb2.WhoAmIResponse:
        caller = current_caller()
        return fleet_pb2.WhoAmIResponse(
            identity=caller.name, role=str(caller.role), method=str(caller.via)
        )

    @unary
    async def CreateToken(
        self, request: fleet_pb2.CreateTokenRequest, context: Ctx
    ) -> fleet_pb2.CreateTokenResponse:
        token, secret = await self._fleet.create_token(
            request.name, request.role, ttl_s=request.ttl_s, by=current_caller()
        )
        return fleet_pb2.CreateTokenResponse(token=convert.token_pb(token), secret=secret)

    @unary
    async def ListTokens(
        self, request: fleet_pb2.ListTokensRequest, context: Ctx
    ) -> fleet_pb2.ListTokensResponse:
        tokens = await self._fleet.list_tokens(include_revoked=request.include_revoked)
        return fleet_pb2.ListTokensResponse(tokens=[convert.token_pb(t) for t in tokens])

    @unary
    async def RevokeToken(
        self, request: fleet_pb2.RevokeTokenRequest, context: Ctx
    ) -> fleet_pb2.Token:
        return convert.token_pb(await self._fleet.revoke_token(request.name, by=current_caller()))

    @unary
    async def ListAudit(
        self, request: fleet_pb2.ListAuditRequest, context: Ctx
    ) -> fleet_pb2.ListAuditResponse:
        entries = await self._fleet.list_audit(
            since=request.since, who=request.who, method=request.method, limit=request.limit
        )
        return fleet_pb2.ListAuditResponse(entries=[convert.audit_entry_pb(e) for e in entries])

    @unary
    async def IssueAgentToken(
        self, request: fleet_pb2.IssueAgentTokenRequest, context: Ctx
    ) -> fleet_pb2.IssueAgentTokenResponse:
        token = await self._fleet.issue_agent_token(request.node, by=current_caller())
        return fleet_pb2.IssueAgentTokenResponse(node=request.node, token=token)
