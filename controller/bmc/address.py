"""BMC addresses, credentials and TLS options.

A node's BMC is data: one URL naming the protocol, host, port and (for
Redfish) the system resource, plus credentials stored separately. Which
schemes exist, and what each means, is the table in
``controller/bmc/registry.py``; today it accepts:

* ``redfish://HOST[:PORT]/redfish/v1/Systems/ID`` -- Redfish over HTTPS (443)
* ``redfish+http://HOST[:PORT]/redfish/v1/Systems/ID`` -- Redfish over HTTP (80)
* ``ipmi://HOST[:PORT]`` -- IPMI 2.0 over LAN (UDP 623)

URLs carrying credentials (``user:pass@host``) are rejected: credentials live
in :class:`BmcCredentials`, which never shows its password.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from controller.bmc import registry
from controller.core.errors import InvalidArgument

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


@dataclass(frozen=True)
class BmcAddress:
    """Where a BMC answers. ``protocol`` and ``scheme`` (the transport: https,
    http, udp) are those of a registry entry; ``system_path`` is empty for IPMI."""

    protocol: str
    scheme: str
    host: str
    port: int
    system_path: str = ""

    @property
    def url(self) -> str:
        """The canonical Kiln BMC URL (default ports are spelled out)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{registry.entry_for(self).scheme}://{host}:{self.port}{self.system_path}"

    @property
    def base_url(self) -> str:
        """The HTTP(S) origin of a Redfish service, e.g. ``https://10.0.0.5:443``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True)
class BmcCredentials:
    """A BMC user name and password. ``repr``/``str`` never show the password."""

    username: str
    password: str = field(repr=False)

    def __repr__(self) -> str:
        return f"BmcCredentials(username={self.username!r}, password='***')"

    __str__ = __repr__


@dataclass(frozen=True)
class TlsOptions:
    """How to check a Redfish BMC's certificate.

    ``verify=False`` disables checking (lab use only); ``ca_bundle`` names a PEM
    file of trusted CAs (or the BMC's self-signed certificate) and implies
    verification.
    """

    verify: bool = True
    ca_bundle: str | None = None

    @property
    def requests_verify(self) -> bool | str:
        """The value for requests/sushy ``verify=``."""
        if self.ca_bundle:
            return self.ca_bundle
        return self.verify


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not _HOSTNAME.match(host):
        raise InvalidArgument(f"BMC URL has an invalid host name {host!r}")


def parse_bmc_url(url: str) -> BmcAddress:
    """Parse a Kiln BMC URL into a :class:`BmcAddress`.

    Raises:
        InvalidArgument: the URL is malformed, uses a scheme the registry
            lacks, embeds credentials, or has a path its protocol rejects
            (Redfish needs a system path, IPMI takes none). The message never
            repeats user information found in the URL.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgument("BMC URL is empty")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidArgument(f"BMC URL must start with {_scheme_choices()}")
    entry = registry.lookup(scheme)
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        # Say what is wrong without echoing the secret.
        raise InvalidArgument(
            "BMC URL must not embed credentials (user:password@); "
            "pass them as BMC credentials instead"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise InvalidArgument(f"BMC URL has an invalid port in {authority!r}") from e
    host = parts.hostname or ""
    if not host:
        raise InvalidArgument("BMC URL has no host")
    _check_host(host)
    if port is None:
        port = entry.default_port
    if not 0 < port < 65536:
        raise InvalidArgument(f"BMC URL port {port} is out of range")
    if parts.query or parts.fragment:
        raise InvalidArgument("BMC URL must not have a query or fragment")
    system_path = entry.check_path(parts.path.rstrip("/"))
    return BmcAddress(entry.protocol, entry.transport, host, port, system_path)


def _scheme_choices() -> str:
    """ "redfish://, redfish+http:// or ipmi://": the canonical spellings."""
    names = [f"{entry.scheme}://" for entry in registry.entries()]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
