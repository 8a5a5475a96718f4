"""The table: every RPC of Kiln's services, and the roles that may call it.

Default deny: an RPC of ``kiln.v1.FleetService`` or ``kiln.v1.AgentService``
without a row here is refused to everyone (``tests/security`` fails when a
service gains an RPC without a row). ``mutating`` calls are recorded in the
audit log, whatever their outcome; refusals of any call are recorded too.

Roles (README, "Securing a fleet"):

- viewer: reads and the event stream;
- operator: what a viewer may, plus power, drain/undrain, allocate/release
  (and fault injection on a simulated fleet);
- provisioner: what a viewer may, plus enrol nodes, issue agent tokens, and
  allocate — releasing only the allocations it created
  (``Fleet.release`` checks the owner);
- admin: everything but registering as an agent: tokens, the audit log,
  BMC credentials;
- agent: ``AgentService`` only (and ``WhoAmI``), for the node its
  certificate or token names.

The row of an RPC that only a simulated controller serves is in
``SIMULATION_ONLY`` as well: elsewhere it answers UNIMPLEMENTED.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.identity import Role

FLEET_SERVICE = "kiln.v1.FleetService"
AGENT_SERVICE = "kiln.v1.AgentService"
SERVICES = (FLEET_SERVICE, AGENT_SERVICE)

VIEWER, OPERATOR, PROVISIONER = Role.VIEWER, Role.OPERATOR, Role.PROVISIONER
ADMIN, AGENT = Role.ADMIN, Role.AGENT
READERS = frozenset({VIEWER, OPERATOR, PROVISIONER, ADMIN})


@dataclass(frozen=True)
class Rule:
    roles: frozenset[Role]
    mutating: bool = False


def _rule(*roles: Role, mutating: bool = False) -> Rule:
    return Rule(frozenset(roles), mutating)


READ = Rule(READERS)

FLEET_RULES: dict[str, Rule] = {
    # reads
    "ListNodes": READ,
    "GetNode": READ,
    "ListRacks": READ,
    "ExportTopology": READ,
    "GetAllocation": READ,
    "ListAllocations": READ,
    "WatchEvents": READ,
    "ListChecks": READ,
    "GetAllocationReport": READ,
    "WhoAmI": Rule(READERS | {AGENT}),
    # the fleet
    "EnrollNode": _rule(PROVISIONER, ADMIN, mutating=True),
    "PowerNode": _rule(OPERATOR, ADMIN, mutating=True),
    "PowerNodes": _rule(OPERATOR, ADMIN, mutating=True),
    # Provisioners install OS images on nodes they bring into the fleet.
    "ProvisionNodes": _rule(OPERATOR, PROVISIONER, ADMIN, mutating=True),
    "BringUpRack": _rule(OPERATOR, PROVISIONER, ADMIN, mutating=True),
    "DrainNode": _rule(OPERATOR, ADMIN, mutating=True),
    "RemoveNode": _rule(OPERATOR, PROVISIONER, ADMIN, mutating=True),
    "UndrainNode": _rule(OPERATOR, ADMIN, mutating=True),
    "CreateAllocation": _rule(OPERATOR, PROVISIONER, ADMIN, mutating=True),
    # A provisioner releases only its own (Fleet.release checks the owner).
    "ReleaseAllocation": _rule(OPERATOR, PROVISIONER, ADMIN, mutating=True),
    "InjectFault": _rule(OPERATOR, ADMIN, mutating=True),  # simulated fleets only
    "ClearLeak": _rule(OPERATOR, ADMIN, mutating=True),
    "RunChecks": _rule(OPERATOR, ADMIN, mutating=True),
    # identity, audit, credentials
    "CreateToken": _rule(ADMIN, mutating=True),
    "ListTokens": _rule(ADMIN),
    "RevokeToken": _rule(ADMIN, mutating=True),
    "ListAudit": _rule(ADMIN),
    "SetNodeCredentials": _rule(ADMIN, mutating=True),
    "IssueAgentToken": _rule(PROVISIONER, ADMIN, mutating=True),
}

AGENT_RULES: dict[str, Rule] = {
    "Connect": _rule(AGENT),
}

RULES: dict[str, Rule] = {
    **{f"/{FLEET_SERVICE}/{name}": rule for name, rule in FLEET_RULES.items()},
    **{f"/{AGENT_SERVICE}/{name}": rule for name, rule in AGENT_RULES.items()},
}

SIMULATION_ONLY = frozenset({f"/{FLEET_SERVICE}/InjectFault"})


def rule_for(method: str) -> Rule | None:
    """The row of ``/package.Service/Method``; None: nobody may call it."""
    return RULES.get(method)


def is_kiln_method(method: str) -> bool:
    return method.startswith(tuple(f"/{s}/" for s in SERVICES))


def short_name(method: str) -> str:
    """``/kiln.v1.FleetService/PowerNode`` → ``PowerNode``."""
    return method.rsplit("/", 1)[-1]


_ORDER = (VIEWER, OPERATOR, PROVISIONER, ADMIN, AGENT)


def needed(rule: Rule) -> str:
    """The roles of ``rule`` in words: ``operator or admin``."""
    names = [str(r) for r in _ORDER if r in rule.roles]
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " or " + names[-1]
