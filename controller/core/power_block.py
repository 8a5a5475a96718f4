"""The power block's guard at the BMC gateway: no power-on of a blocked node.

A node whose power is blocked (a Critical coolant leak on its tray, see
``controller.core.leaks``) must not be powered on by anyone in the core.
``Nodes.power`` refuses on, cycle and restart itself (reading the store);
``PowerBlockGate`` wraps the ``BmcGateway`` the rest of the core is given, so
a caller that drives the gateway directly (the preparation's reboot after
BIOS settings) is refused the same way.
"""

from __future__ import annotations

from controller.core.gateway_layer import GatewayLayer
from controller.core.model import BmcTarget
from controller.core.nodes import POWER_ON_ACTIONS, Nodes, power_blocked
from controller.core.ports import BmcGateway


class PowerBlockGate(GatewayLayer):
    """The ``BmcGateway`` for the core's own users, refusing on, cycle and
    restart of a node whose power is blocked (read from the in-memory view
    of the fleet) with ``FailedPrecondition``; everything else passes
    through. ``Nodes.power`` checks the store itself; this catches the rest
    (the preparation's reboot after BIOS settings)."""

    def __init__(self, inner: BmcGateway, nodes: Nodes) -> None:
        super().__init__(inner)
        self._nodes = nodes

    def _check(self, target: BmcTarget, action: str) -> None:
        view = self._nodes.view
        node = view.get(target.node) if view.ready else None
        if action in POWER_ON_ACTIONS and node is not None and node.power_block:
            raise power_blocked(target.node, node.power_block, action)

    async def set_power(self, target: BmcTarget, action: str) -> str:
        self._check(target, action)
        return await self._inner.set_power(target, action)
