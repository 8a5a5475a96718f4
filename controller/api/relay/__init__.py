"""Kiln's calls served by worker processes (``--agent-relays``).

The controller's one interpreter serves every agent stream, every API call
and every scheduling pass. At fleet size the agents' reports alone take
most of its core, and about half of a report's CPU is the gRPC stream
itself; an allocation's two API calls spend about a third of theirs in
gRPC. With ``--agent-relays N`` the relay port (``--agent-listen``) is
served by N worker processes (``worker.py``): each terminates its clients'
gRPC connections and TLS, agents and API clients alike, and forwards every
call of Kiln's two services (``methods.py``), its messages raw, over a
socket pair to the controller, in batches (``frames.py``). The controller
runs each forwarded call through the same request limits, authentication,
audit and servicer as a direct one (``relayed.py``), with a context that
stands in for gRPC's, and sends its answers back. ``supervisor.py``
starts the workers once the controller is active, restarts one that dies
(its clients reconnect, as after any dropped connection) and stops them
with the controller.
"""
