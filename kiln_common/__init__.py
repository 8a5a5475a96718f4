"""What the agent and the controller both use, so that neither imports the other.

``gpu_profile``: the GPU profile schema and its validator (the controller
checks node profiles on load, the agent applies them). ``tls``: client-side
TLS for dialling the controller's gRPC port (the agent and the ``kiln`` CLI).
``values``: immutable value classes as cheap to build as plain ones.
Nothing here imports ``agent`` or ``controller``.
"""
