"""BMC-layer refinements of Kiln's error tree, and which errors are transient.

Only transient faults are retried: the BMC did not answer (connection refused,
reset, timed out) or answered with a server-side error (5xx, e.g. 503 while
the BMC is busy). Authentication failures and other 4xx answers are final.
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
    breaker. Authentication failures do not either: the BMC answered.
    """
    return is_transient(exc)
