"""BMC-layer refinements of Kiln's error tree, and which errors are transient.

Only transient faults are retried: the BMC did not answer (connection refused,
reset, timed out) or answered with a server-side error (5xx, e.g. 503 while
the BMC is busy). Authentication failures and other 4xx answers are final.

An answer Kiln cannot use (``BmcBadResponse``: not JSON, wrong types, missing
fields, over the size cap) is final too -- the same BMC would send the same
answer again -- but unlike a 4xx it counts against the breaker: the node's
BMC health turns "degraded" with the reason at once, and a BMC that sends
nothing else for ``breaker_threshold`` calls in a row is failed fast like one
that does not answer, so its node takes no new work while Kiln cannot read it.
"""

from __future__ import annotations

from controller.core.errors import (
    BmcAuthenticationFailed,
    BmcError,
    BmcTimeout,
    BmcUnreachable,
    NotSupported,
    Unavailable,
)


class BmcServerError(BmcError, Unavailable):
    """The BMC answered with a server-side (5xx) error; worth retrying."""

    template = "BMC %(host)s answered %(status)s: %(reason)s"


class BmcBadResponse(BmcError):
    """The BMC answered, but with something Kiln cannot use: not JSON (or
    not UTF-8, or truncated), nested too deeply, over the response size cap,
    a field of the wrong type, or a required field missing. ``reason`` names
    the resource and what was wrong; it quotes at most a short excerpt of
    the answer, never the whole body."""

    template = "BMC %(host)s sent a bad answer to %(operation)s: %(reason)s"


class BmcBreakerOpen(BmcUnreachable):
    """Failing fast: the per-BMC circuit breaker is open."""

    template = (
        "BMC %(host)s is unreachable: circuit breaker open after %(failures)s "
        "consecutive failures (last: %(reason)s); next probe in %(retry_in).1fs"
    )


class BmcTlsError(BmcUnreachable):
    """TLS set-up failed (e.g. certificate not trusted). A configuration
    problem: not retried, does not open the breaker."""

    template = "BMC %(host)s is unreachable over TLS: %(reason)s"


class BmcBusy(BmcTimeout):
    """A call waited its whole deadline for its turn and never reached the
    BMC: the BMC's own call slots stayed taken, or every worker thread of its
    protocol was busy. Retried like a timeout, but it says nothing new about
    the BMC, so it does not count against the breaker."""

    template = "BMC %(host)s: %(operation)s waited %(seconds).1fs for %(waiting_for)s"


class BmcPoolClosed(BmcError):
    """The pool was closed (the controller is stopping) before the call ran."""

    template = "BMC %(host)s: %(operation)s abandoned: the BMC pool is closed"


class BmcPowerNotHonoured(BmcTimeout):
    """The BMC accepted a power command, twice, and the power never changed."""

    template = (
        "BMC %(host)s: %(command)s not honoured after %(tries)s "
        "(still %(state)s after %(seconds)gs)"
    )


TRANSIENT: tuple[type[BaseException], ...] = (BmcUnreachable, BmcServerError, BmcTimeout)
"""Errors worth a retry. ``BmcBreakerOpen`` is excluded explicitly in ``is_transient``."""


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is a fault that may clear by itself."""
    if isinstance(exc, BmcBreakerOpen | BmcTlsError | BmcAuthenticationFailed | NotSupported):
        return False
    return isinstance(exc, TRANSIENT)


def counts_against_breaker(exc: BaseException) -> bool:
    """True when ``exc`` says the BMC is not answering properly.

    NotSupported and 4xx answers mean the BMC is alive; they do not open the
    breaker. Authentication failures do not either: the BMC answered. A call
    that never got its turn (``BmcBusy``) says nothing about the BMC. A bad
    answer (``BmcBadResponse``) is not retried but does count: it is what
    marks the node's BMC health "degraded" with the reason.
    """
    if isinstance(exc, BmcBadResponse):
        return True
    return is_transient(exc) and not isinstance(exc, BmcBusy)


def says_endpoint_down(exc: BaseException) -> bool:
    """True when ``exc`` says nothing at the BMC's address answers: no
    connection, or no answer in time. Every system served from that
    host:port shares such a failure (one Redfish service for many systems:
    an emulator, a chassis or rack manager). A bad answer, a 5xx, a refusal
    or a call that never got its turn is about what was asked, not the
    address; so is a TLS failure, which is final and never retried."""
    if isinstance(exc, BmcBreakerOpen | BmcBusy | BmcTlsError | BmcPowerNotHonoured):
        return False
    return isinstance(exc, BmcUnreachable | BmcTimeout)
