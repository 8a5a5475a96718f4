"""The BMC protocols Kiln speaks, as data: one entry per URL scheme.

Each entry says which protocol a scheme selects, over which transport and
default port, how the URL's path is checked, how a driver is made and what
the protocol demands of credentials. ``parse_bmc_url``, ``BmcAddress.url``,
``BmcPool`` and the gateway's ``validate_target`` all read this table and name
no protocol themselves.

Adding a protocol is one driver module (a ``Driver`` plus ``make_driver``,
``check_path`` and ``validate_credentials``) and one entry in ``_ENTRIES``
per transport it runs over. An entry's ``scheme`` is the canonical spelling;
``aliases`` are other spellings accepted for the same protocol and transport.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from controller.bmc import ipmi, redfish
from controller.bmc.handle import Driver
from controller.core.errors import InvalidArgument

if TYPE_CHECKING:
    # address.py imports this module, so its types are for annotations only.
    from controller.bmc.address import BmcAddress, BmcCredentials, TlsOptions


class DriverFactory(Protocol):
    """Makes the (blocking) driver for one BMC endpoint; does no I/O."""

    def __call__(
        self,
        address: BmcAddress,
        credentials: BmcCredentials,
        tls: TlsOptions,
        *,
        request_timeout: float,
        node: str,
    ) -> Driver: ...


@dataclass(frozen=True)
class SchemeEntry:
    """One URL scheme (plus ``aliases`` that mean the same) and the protocol
    behind it.

    ``scheme`` is the canonical spelling, the one ``BmcAddress.url`` writes.
    ``check_path`` receives the URL path without a trailing slash and returns
    the ``system_path`` to keep; ``validate_credentials`` rejects credentials
    the protocol cannot carry. Both raise InvalidArgument and do no I/O.

    Each protocol's blocking calls run in that protocol's own thread pool
    (so one protocol's dead BMCs can never starve another's): ``max_workers``
    caps its size (None: the ``BmcPool``'s ``max_workers``), and
    ``max_in_flight`` is how many blocking calls one BMC endpoint may have
    running at once. Entries of one protocol share its pool and must agree.
    """

    scheme: str
    protocol: str
    transport: str
    default_port: int
    make_driver: DriverFactory
    check_path: Callable[[str], str]
    validate_credentials: Callable[[str, str], None]
    aliases: tuple[str, ...] = ()
    max_workers: int | None = None
    max_in_flight: int = 2


# scheme, protocol, transport, default port; the driver module's three hooks;
# the protocol's thread pool cap and calls in flight per BMC.
# Redfish: HTTP with its own timeouts; two calls per BMC let a read pass a
# slow one. IPMI: pyghmi serializes one session per BMC (so one call per BMC)
# and multiplexes 64 BMCs per UDP socket through one I/O thread.
_ENTRIES = (
    SchemeEntry(
        "redfish", "redfish", "https", 443,
        redfish.make_driver, redfish.check_path, redfish.validate_credentials,
        aliases=("redfish+https",), max_workers=None, max_in_flight=2,
    ),
    SchemeEntry(
        "redfish+http", "redfish", "http", 80,
        redfish.make_driver, redfish.check_path, redfish.validate_credentials,
        max_workers=None, max_in_flight=2,
    ),
    SchemeEntry(
        "ipmi", "ipmi", "udp", 623,
        ipmi.make_driver, ipmi.check_path, ipmi.validate_credentials,
        max_workers=32, max_in_flight=1,
    ),
)  # fmt: skip


def _index(
    entries: tuple[SchemeEntry, ...],
) -> tuple[Mapping[str, SchemeEntry], Mapping[tuple[str, str], SchemeEntry]]:
    """Key the entries by every scheme spelling and by (protocol, transport).

    An ambiguous table raises ValueError, so a bad line fails at import rather
    than when a node is enrolled.
    """
    by_scheme: dict[str, SchemeEntry] = {}
    by_transport: dict[tuple[str, str], SchemeEntry] = {}
    for entry in entries:
        for name in (entry.scheme, *entry.aliases):
            if name != name.lower() or name in by_scheme:
                raise ValueError(f"BMC scheme {name!r} is not lower case or is listed twice")
            by_scheme[name] = entry
        if entry.max_in_flight < 1 or (entry.max_workers is not None and entry.max_workers < 1):
            raise ValueError(f"BMC scheme {entry.scheme!r}: pool sizes must be at least 1")
        for other in by_transport.values():
            if other.protocol == entry.protocol and (
                (other.max_workers, other.max_in_flight) != (entry.max_workers, entry.max_in_flight)
            ):
                raise ValueError(f"the {entry.protocol} schemes disagree on their thread pool")
        key = (entry.protocol, entry.transport)
        if key in by_transport:
            raise ValueError(f"two BMC schemes for {entry.protocol} over {entry.transport}")
        by_transport[key] = entry
    return MappingProxyType(by_scheme), MappingProxyType(by_transport)


SCHEMES, _BY_TRANSPORT = _index(_ENTRIES)
"""Every accepted scheme spelling (aliases included) -> its entry."""


def entries() -> tuple[SchemeEntry, ...]:
    """The registered entries, one per (protocol, transport), in table order."""
    return _ENTRIES


def lookup(scheme: str) -> SchemeEntry:
    """The entry for a URL scheme (case-insensitive).

    Raises:
        InvalidArgument: no protocol is registered under that scheme; the
            message lists the accepted schemes.
    """
    scheme = scheme.lower()
    entry = SCHEMES.get(scheme)
    if entry is None:
        raise InvalidArgument(
            f"BMC URL scheme {scheme!r} is not one of {', '.join(sorted(SCHEMES))}"
        )
    return entry


def entry_for(address: BmcAddress) -> SchemeEntry:
    """The entry a parsed address came from (by its protocol and transport)."""
    return _BY_TRANSPORT[(address.protocol, address.scheme)]
