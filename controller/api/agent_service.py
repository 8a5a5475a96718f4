"""kiln.v1.AgentService: one bidirectional stream per node agent.

The first message must be a Register. A peer that presented a TLS client
certificate may only register the node its certificate names (see
``controller.api.peer_identity``), and an agent token only its own node;
else the call ends PERMISSION_DENIED.
After it, two things run side by side: reports flowing up (health, command
results; a relay worker's health reports come parsed, checked and packed,
``relay/digest.py``) and commands flowing down from the node's session in the agent hub.
When either side ends, the session is detached and its pending commands fail
as Unavailable.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import grpc

from controller.api import convert
from controller.api.auth.identity import authorize_agent_token, current_caller
from controller.api.errors import message_for, status_for
from controller.api.peer_identity import authorize_node, certificate_expiry, certificate_names
from controller.core.agents import AgentSession, Outgoing
from controller.core.errors import InvalidArgument, KilnError
from controller.core.fleet import Fleet
from controller.core.health import PackedReport, unpack_report
from controller.core.model import AgentCommand, CommandOutcome, ReportInterval
from kiln.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)


def outgoing_pb(item: Outgoing) -> agent_pb2.ControllerMessage:
    """A session's next message to its agent: a command, or a new pace."""
    if isinstance(item, ReportInterval):
        return agent_pb2.ControllerMessage(pace=agent_pb2.Pace(sample_interval_s=item.seconds))
    return command_pb(*item)


def _tell_pace(answer_now: Callable[[bytes], bool], seconds: float) -> bool:
    """A new pace for a relayed call's agent, straight onto the link."""
    return answer_now(outgoing_pb(ReportInterval(seconds)).SerializeToString())


def command_pb(command_id: str, command: AgentCommand) -> agent_pb2.ControllerMessage:
    msg = agent_pb2.Command(id=command_id)
    if command.kind == "apply_profile":
        msg.apply_profile.profile_yaml = command.payload
    elif command.kind == "reset_gpus":
        msg.reset_gpus.SetInParent()
    elif command.kind == "inject_fault":
        msg.inject_fault.fault_json = command.payload
    elif command.kind == "run_check":
        msg.run_check.check_json = command.payload
    elif command.kind == "reset_gpu":
        msg.reset_gpu.indices.extend(int(i) for i in json.loads(command.payload))
    else:
        raise ValueError(f"unknown agent command {command.kind!r}")
    return agent_pb2.ControllerMessage(command=msg)


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    async def Connect(
        self,
        # With --agent-relays, a report comes packed already (relay/digest.py).
        request_iterator: AsyncIterator[agent_pb2.AgentMessage | PackedReport],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        try:
            first = await anext(aiter(request_iterator), None)
            if (
                not isinstance(first, agent_pb2.AgentMessage)
                or first.WhichOneof("body") != "register"
            ):
                raise InvalidArgument("first message must be register")
            reg = first.register
            authorize_node(certificate_names(context.auth_context()), reg.node_name)
            authorize_agent_token(current_caller(), reg.node_name)
            session = await self._fleet.agent_connected(
                reg.node_name,
                [convert.gpu_from_pb(g) for g in reg.gpus],
                reg.applied_profile,
                cert_expires_at=certificate_expiry(context.auth_context()),
            )
        except KilnError as e:
            await context.abort(status_for(e), message_for(e))
            return
        except Exception:  # never a store's or a library's text to the client
            log.exception("agent registration failed")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error registering the agent")
            return
        yield agent_pb2.ControllerMessage(
            registered=agent_pb2.Registered(
                node_name=reg.node_name, sample_interval_s=self._fleet.agent_sample_interval()
            )
        )
        reader = asyncio.create_task(self._read(session, request_iterator))
        reader.add_done_callback(lambda _: session.reading_ended())
        refusals: list[KilnError] = []  # a pushed report's (the reader returns its own)
        take_reports = getattr(context, "take_reports", None)
        if take_reports is not None:  # a relay worker's call (relay/relayed.py)
            take_reports(partial(self._pushed_report, session, refusals))
            # ... whose new paces go straight onto the link, now that
            # ``registered`` has gone (AgentHub.pace).
            session.tell_pace = partial(_tell_pace, context.answer_now)
        # A call can end while this generator waits at a ``yield`` (the agent
        # went away while a message was being sent): gRPC then drops the
        # generator unclosed, and its ``finally`` runs only when the
        # generator is finalized, which waits for the garbage collector if
        # anything in a reference cycle still holds it. The call's end stops
        # the reader and detaches the session at once, whatever holds it.
        context.add_done_callback(lambda _: self._call_ended(session, reader))
        try:
            # The queue is read here, in the call's own task: no task or wait
            # set per message, whose objects would live until the next one
            # (every agent's, at a fleet-wide change of pace) and be walked by
            # the collector meanwhile.
            while (item := await session.queue.get()) is not None and not reader.done():
                yield outgoing_pb(item)
        finally:
            reader.cancel()
            refused: object = None
            try:
                refused = (await asyncio.gather(reader, return_exceptions=True))[0]
            except asyncio.CancelledError:
                pass  # the call was cancelled (the agent went away): clean up all the same
            self._fleet.agent_disconnected(session)
        if not isinstance(refused, KilnError) and refusals:
            refused = refusals[0]
        if isinstance(refused, KilnError):
            await context.abort(status_for(refused), message_for(refused))

    def _call_ended(self, session: AgentSession, reader: asyncio.Task[Any]) -> None:
        """The agent's call is over, however it ended: stop its reader and
        detach it (``Connect``'s cleanup may run again later: each step does
        nothing the second time)."""
        reader.cancel()
        self._fleet.agent_disconnected(session)

    async def _pushed_report(
        self, session: AgentSession, refusals: list[KilnError], packed: PackedReport
    ) -> None:
        """A relayed call's digested report, handed on without waking the
        call's reader; the stream ends as ``_read`` would end it."""
        if session.closed or refusals:
            session.reading_ended()
            return
        try:
            await self._fleet.agent_health(session.node, unpack_report(packed), packed)
        except KilnError as e:
            log.warning("node %s: agent stream refused: %s", session.node, message_for(e))
            refusals.append(e)
            session.reading_ended()
        except Exception:
            log.exception("node %s: agent stream failed", session.node)
            refusals.append(KilnError("internal error on the agent stream"))  # INTERNAL
            session.reading_ended()

    async def _read(
        self,
        session: AgentSession,
        messages: AsyncIterator[agent_pb2.AgentMessage | PackedReport],
    ) -> KilnError | None:
        """Hand the agent's reports to the Fleet until the stream ends.

        Returns the refusal that ends the stream (a malformed or oversized
        message, checked by ``controller.api.limits``), else None.
        """
        try:
            async for msg in messages:
                if session.closed:
                    return None
                if isinstance(msg, bytes):  # packed by a relay worker (relay/digest.py)
                    # No local holds the typed report: it would live until the
                    # next message, walked by every young collection meanwhile.
                    await self._fleet.agent_health(session.node, unpack_report(msg), msg)
                    continue
                body = msg.WhichOneof("body")
                if body == "health":
                    await self._fleet.agent_health(session.node, convert.health_from_pb(msg.health))
                elif body == "result":
                    r = msg.result
                    self._fleet.agent_result(
                        session,
                        r.id,
                        CommandOutcome(
                            ok=r.ok,
                            changed=tuple(r.changed),
                            failures=tuple(r.failures),
                            message=r.message,
                            figures_json=r.figures_json,
                            duration_s=r.duration_s,
                        ),
                    )
        except KilnError as e:
            log.warning("node %s: agent stream refused: %s", session.node, message_for(e))
            return e
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            return None
        except Exception:
            log.exception("node %s: agent stream failed", session.node)
            return KilnError("internal error on the agent stream")  # INTERNAL, no detail
        return None
