"""Who may do what: identity, the role table, and the one interceptor.

- ``identity``: the caller of a call, from its bearer token or its client
  certificate (``Caller``), and the call's caller for servicers
  (``current_caller``);
- ``roles``: the table of every RPC and the roles that may call it;
- ``arguments``: a request as JSON for the audit log, secrets removed;
- ``interceptor``: ``AuthInterceptor``, which checks every call of Kiln's
  services against the table and records the audit log.
"""
