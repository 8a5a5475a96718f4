"""Kiln's one error tree.

Every error carries a message template filled from keyword arguments, in the
manner of sushy's exceptions. The API layer maps each family to one gRPC
status code (see ``controller.api.errors``); nothing below the API layer knows
about gRPC. Messages never contain secrets: callers pass host names, node names
and reasons, never passwords or tokens.
"""

from __future__ import annotations

from typing import Any, ClassVar


class KilnError(Exception):
    """Base of every error Kiln raises on purpose."""

    template: ClassVar[str] = "%(detail)s"

    def __init__(self, detail: str | None = None, **fields: Any) -> None:
        if detail is not None:
            fields.setdefault("detail", detail)
        self.fields = fields
        try:
            message = self.template % fields
        except (KeyError, TypeError, ValueError):
            message = str(fields.get("detail", self.__class__.__name__))
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self)


class InvalidArgument(KilnError):
    """The request itself is wrong; retrying it unchanged cannot succeed."""


class NotFound(KilnError):
    template = "%(kind)s %(name)r not found%(hint)s"

    def __init__(self, detail: str | None = None, **fields: Any) -> None:
        fields.setdefault("hint", "")
        super().__init__(detail, **fields)


class Unauthenticated(KilnError):
    """The call carries no credentials, or ones that are unknown, expired or revoked."""


class PermissionDenied(KilnError):
    """The caller is authenticated but may not do this."""


class AlreadyExists(KilnError):
    template = "%(kind)s %(name)r already exists"


class FailedPrecondition(KilnError):
    """The system is not in a state where the operation can run."""


class NotSupported(FailedPrecondition):
    template = "%(operation)s is not supported by this %(what)s"

    def __init__(self, operation: str, what: str = "BMC", **fields: Any) -> None:
        super().__init__(operation=operation, what=what, **fields)


class Unavailable(KilnError):
    """A peer (BMC, agent, broker, database) cannot be reached right now."""


class BmcError(KilnError):
    """A BMC answered, or failed to answer, in a way Kiln cannot use."""

    template = "BMC %(host)s: %(reason)s"


class BmcUnreachable(BmcError, Unavailable):
    template = "BMC %(host)s is unreachable: %(reason)s"


class BmcAuthenticationFailed(BmcError):
    template = "BMC %(host)s refused the credentials for user %(username)r"


class BmcTimeout(BmcError, Unavailable):
    template = "BMC %(host)s did not finish %(operation)s within %(seconds)ss"


class DuplicateKey(AlreadyExists):
    """A store refused a second record with a unique key (a lost race)."""

    template = "%(detail)s"
