"""BMC addresses, credentials and TLS options.

A node's BMC is data: one URL naming the protocol, host, port and (for
Redfish) the system resource, plus credentials stored separately. Accepted
forms:

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
from typing import Literal
from urllib.parse import urlsplit

from controller.core.errors import InvalidArgument

Protocol = Literal["redfish", "ipmi"]

# scheme -> (protocol, transport scheme, default port)
_SCHEMES: dict[str, tuple[Protocol, str, int]] = {
    "redfish": ("redfish", "https", 443),
    "redfish+https": ("redfish", "https", 443),
    "redfish+http": ("redfish", "http", 80),
    "ipmi": ("ipmi", "udp", 623),
}
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_SYSTEM_PATH = re.compile(r"^/redfish/v1/Systems/[^/?#\s]+$")


@dataclass(frozen=True)
class BmcAddress:
    """Where a BMC answers. ``system_path`` is empty for IPMI."""

    protocol: Protocol
    scheme: str
    host: str
    port: int
    system_path: str = ""

    @property
    def url(self) -> str:
        """The canonical Kiln BMC URL (default ports are spelled out)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.protocol == "ipmi":
            return f"ipmi://{host}:{self.port}"
        prefix = "redfish" if self.scheme == "https" else "redfish+http"
        return f"{prefix}://{host}:{self.port}{self.system_path}"

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
        InvalidArgument: the URL is malformed, uses an unknown scheme, embeds
            credentials, or lacks (Redfish) / has (IPMI) a system path. The
            message never repeats user information found in the URL.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgument("BMC URL is empty")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidArgument("BMC URL must start with redfish://, redfish+http:// or ipmi://")
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise InvalidArgument(
            f"BMC URL scheme {scheme!r} is not one of {', '.join(sorted(_SCHEMES))}"
        )
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        # Say what is wrong without echoing the secret.
        raise InvalidArgument(
            "BMC URL must not embed credentials (user:password@); "
            "pass them as BMC credentials instead"
        )
    protocol, transport, default_port = _SCHEMES[scheme]
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
        port = default_port
    if not 0 < port < 65536:
        raise InvalidArgument(f"BMC URL port {port} is out of range")
    if parts.query or parts.fragment:
        raise InvalidArgument("BMC URL must not have a query or fragment")
    path = parts.path.rstrip("/")
    if protocol == "ipmi":
        if path:
            raise InvalidArgument(f"IPMI BMC URL must not have a path (got {path!r})")
        return BmcAddress("ipmi", transport, host, port, "")
    if not _SYSTEM_PATH.match(path):
        raise InvalidArgument(
            f"Redfish BMC URL path must be /redfish/v1/Systems/<id> (got {path or '/'!r})"
        )
    return BmcAddress("redfish", transport, host, port, path)
