"""Agent streams served by worker processes (``--agent-relays``).

The controller's one interpreter serves every agent stream, every API call
and every scheduling pass. At fleet size the agents' reports alone take
most of its core, and about half of a report's CPU is the gRPC stream
itself. With ``--agent-relays N`` the agent port (``--agent-listen``) is
served by N worker processes instead (``worker.py``): each terminates the
agents' gRPC connections and TLS and forwards every call's messages, raw,
over a socket pair to the controller, in batches (``frames.py``). The
controller runs each forwarded call through the same request limits,
authentication, audit and ``AgentService`` as a direct one
(``relayed.py``), with a context that stands in for gRPC's, and sends its
answers back. ``supervisor.py`` starts the workers once the controller is
active, restarts one that dies (its agents reconnect, as after any
dropped connection) and stops them with the controller.
"""
