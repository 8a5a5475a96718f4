"""The audit entry of the call being served, for the servicer to hand to
the core (``controller.core.audit.CallAudit``): the interceptor sets it
before a mutating unary call's servicer runs. Outside such a call (a
read, a stream, a test calling the core) there is none."""

from __future__ import annotations

import contextvars

from controller.core.audit import CallAudit

_AUDIT: contextvars.ContextVar[CallAudit | None] = contextvars.ContextVar(
    "kiln_call_audit", default=None
)


def current_audit() -> CallAudit | None:
    """The served call's entry, written with its change; None outside one."""
    return _AUDIT.get()


def set_audit(audit: CallAudit | None) -> contextvars.Token[CallAudit | None]:
    return _AUDIT.set(audit)


def reset_audit(token: contextvars.Token[CallAudit | None]) -> None:
    try:
        _AUDIT.reset(token)
    except ValueError:  # reset from another context
        pass
