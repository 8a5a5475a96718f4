from __future__ import annotations

import pytest

from controller.bmc import BmcCredentials, TlsOptions, parse_bmc_url
from controller.core.errors import InvalidArgument


@pytest.mark.parametrize(
    ("url", "protocol", "scheme", "host", "port", "path", "canonical"),
    [
        pytest.param(
            "redfish://10.0.0.5/redfish/v1/Systems/1", "redfish", "https", "10.0.0.5", 443,
            "/redfish/v1/Systems/1", "redfish://10.0.0.5:443/redfish/v1/Systems/1",
            id="redfish-default",
        ),
        pytest.param(
            "redfish+http://bmc-7.rack3:8000/redfish/v1/Systems/node-7/", "redfish", "http",
            "bmc-7.rack3", 8000, "/redfish/v1/Systems/node-7",
            "redfish+http://bmc-7.rack3:8000/redfish/v1/Systems/node-7", id="redfish-http-port",
        ),
        pytest.param(
            "ipmi://127.0.0.1", "ipmi", "udp", "127.0.0.1", 623, "", "ipmi://127.0.0.1:623",
            id="ipmi-default",
        ),
        pytest.param(
            "IPMI://[fd00::5]:6230", "ipmi", "udp", "fd00::5", 6230, "", "ipmi://[fd00::5]:6230",
            id="ipmi-ipv6",
        ),
    ],
)  # fmt: skip
def test_parse_valid(
    url: str, protocol: str, scheme: str, host: str, port: int, path: str, canonical: str
) -> None:
    a = parse_bmc_url(url)
    assert (a.protocol, a.scheme, a.host, a.port, a.system_path) == (
        protocol, scheme, host, port, path,
    )  # fmt: skip
    assert a.url == canonical
    assert parse_bmc_url(a.url) == a


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("10.0.0.5", "must start with", id="no-scheme"),
        pytest.param("http://10.0.0.5/redfish/v1/Systems/1", "scheme 'http'", id="bad-scheme"),
        pytest.param("redfish://10.0.0.5", "path must be", id="redfish-no-path"),
        pytest.param("redfish://10.0.0.5/redfish/v1/Systems", "path must be", id="no-system-id"),
        pytest.param("ipmi://10.0.0.5/x", "must not have a path", id="ipmi-path"),
        pytest.param("ipmi://10.0.0.5:99999", "port", id="port-range"),
        pytest.param("ipmi://10.0.0.5:abc", "invalid port", id="port-text"),
        pytest.param("ipmi://bad_host!", "invalid host", id="bad-host"),
        pytest.param("redfish:///redfish/v1/Systems/1", "no host", id="no-host"),
        pytest.param("ipmi://10.0.0.5?x=1", "query", id="query"),
    ],
)
def test_parse_invalid(url: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_bmc_url(url)
    assert fragment in str(info.value)


def test_embedded_credentials_are_rejected_without_echoing_them() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_bmc_url("redfish://root:hunter2@10.0.0.5/redfish/v1/Systems/1")
    assert "credentials" in str(info.value)
    assert "hunter2" not in str(info.value)
    assert "root" not in str(info.value)


def test_credentials_never_show_password() -> None:
    creds = BmcCredentials("admin", "hunter2")
    assert "hunter2" not in repr(creds)
    assert "hunter2" not in str(creds)
    assert "hunter2" not in f"{creds!r} {creds}"
    assert "admin" in repr(creds)


def test_tls_options_verify_value() -> None:
    assert TlsOptions().requests_verify is True
    assert TlsOptions(verify=False).requests_verify is False
    assert TlsOptions(ca_bundle="ca.pem").requests_verify == "ca.pem"
