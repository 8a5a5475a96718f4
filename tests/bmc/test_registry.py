"""The scheme registry is the one source of BMC protocols: the URL parser,
canonical URLs, the pool's drivers and the credential rules all come from it."""

from __future__ import annotations

import dataclasses
from typing import cast

import pytest

from controller.bmc import BmcCredentials, BmcPool, PowerState, TlsOptions, parse_bmc_url, registry
from controller.bmc.address import BmcAddress
from controller.bmc.gateway import PoolGateway
from controller.bmc.ipmi import IpmiDriver
from controller.bmc.redfish import RedfishDriver
from controller.core.errors import InvalidArgument

# A valid URL path per protocol; a new protocol adds its own here.
SAMPLE_PATH = {"redfish": "/redfish/v1/Systems/1", "ipmi": ""}
DRIVER_TYPE: dict[str, type] = {"redfish": RedfishDriver, "ipmi": IpmiDriver}
IPMI_LIMIT_MESSAGE = "IPMI 2.0 passwords are at most 20 bytes; this one is longer"


def _spellings() -> list[tuple[str, registry.SchemeEntry]]:
    return sorted(registry.SCHEMES.items())


@pytest.mark.parametrize(("scheme", "entry"), _spellings(), ids=[s for s, _ in _spellings()])
def test_every_registered_scheme_parses_to_its_entry(
    scheme: str, entry: registry.SchemeEntry
) -> None:
    address = parse_bmc_url(f"{scheme}://10.0.0.5{SAMPLE_PATH[entry.protocol]}")
    assert (address.protocol, address.scheme, address.port) == (
        entry.protocol,
        entry.transport,
        entry.default_port,
    )
    assert registry.entry_for(address) is entry
    assert address.url.startswith(f"{entry.scheme}://")  # aliases write the canonical one
    assert parse_bmc_url(address.url) == address


@pytest.mark.parametrize("entry", registry.entries(), ids=lambda e: e.scheme)
def test_each_entry_makes_its_protocols_driver_without_io(entry: registry.SchemeEntry) -> None:
    address = parse_bmc_url(f"{entry.scheme}://10.0.0.5{SAMPLE_PATH[entry.protocol]}")
    driver = entry.make_driver(
        address, BmcCredentials("u", "p"), TlsOptions(), request_timeout=1.0, node="n1"
    )
    try:
        assert isinstance(driver, DRIVER_TYPE[entry.protocol])
    finally:
        driver.close()


def test_unknown_scheme_lists_the_registered_ones() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_bmc_url("amt://10.0.0.5")
    assert str(info.value) == (
        f"BMC URL scheme 'amt' is not one of {', '.join(sorted(registry.SCHEMES))}"
    )
    assert "redfish+https" in str(info.value)


def test_missing_scheme_names_the_canonical_spellings() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_bmc_url("10.0.0.5")
    assert str(info.value) == "BMC URL must start with redfish://, redfish+http:// or ipmi://"


@pytest.mark.parametrize(
    ("url", "password", "error"),
    [
        pytest.param("ipmi://10.0.0.5", "p" * 20, None, id="ipmi-20-bytes"),
        pytest.param("ipmi://10.0.0.5", "p" * 21, IPMI_LIMIT_MESSAGE, id="ipmi-21-bytes"),
        pytest.param("IPMI://10.0.0.5:6230", "é" * 11, IPMI_LIMIT_MESSAGE, id="ipmi-utf8-bytes"),
        pytest.param(
            "redfish://10.0.0.5/redfish/v1/Systems/1", "p" * 64, None, id="redfish-long-ok"
        ),
        pytest.param("ipmi://10.0.0.5/x", "pw", "must not have a path", id="bad-url-first"),
    ],
)
def test_validate_target_applies_the_protocols_credential_rules(
    url: str, password: str, error: str | None
) -> None:
    gateway = PoolGateway(BmcPool(max_workers=1))
    if error is None:
        assert gateway.validate_target(url, "admin", password) == gateway.canonical_url(url)
        return
    with pytest.raises(InvalidArgument) as info:
        gateway.validate_target(url, "admin", password)
    assert error in str(info.value)
    assert password not in str(info.value)


def test_validate_target_returns_the_canonical_url() -> None:
    gateway = PoolGateway(BmcPool(max_workers=1))
    assert gateway.validate_target("IPMI://[fd00::5]", "admin", "pw") == "ipmi://[fd00::5]:623"
    assert (
        gateway.validate_target("redfish+https://bmc-1/redfish/v1/Systems/a/", "admin", "pw")
        == "redfish://bmc-1:443/redfish/v1/Systems/a"
    )


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        pytest.param({"transport": "http2"}, "listed twice", id="same-scheme-twice"),
        pytest.param(
            {"scheme": "redfish3", "transport": "h3", "aliases": ("redfish+https",)},
            "listed twice",
            id="alias-taken",
        ),
        pytest.param({"scheme": "Redfish2"}, "not lower case", id="upper-case"),
        pytest.param(
            {"scheme": "redfish2"}, "two BMC schemes for redfish over https", id="one-transport"
        ),
    ],
)
def test_an_ambiguous_table_is_rejected(change: dict[str, object], fragment: str) -> None:
    redfish = registry.SCHEMES["redfish"]
    other = dataclasses.replace(redfish, **{"aliases": (), **change})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=fragment):
        registry._index((redfish, other))


class _FakeDriver:
    """A driver that only reads power: enough to show the pool used the entry."""

    def __init__(self, address: BmcAddress) -> None:
        self.address = address
        self.closed = False

    def power_state(self) -> PowerState:
        return PowerState.ON

    def close(self) -> None:
        self.closed = True


async def test_one_table_entry_is_all_a_new_protocol_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[_FakeDriver] = []

    def make_driver(
        address: BmcAddress,
        credentials: BmcCredentials,
        tls: TlsOptions,
        *,
        request_timeout: float,
        node: str,
    ) -> _FakeDriver:
        made.append(_FakeDriver(address))
        return made[-1]

    def check_path(path: str) -> str:
        return path

    def validate_credentials(username: str, password: str) -> None:
        if len(password) < 4:
            raise InvalidArgument("fakebmc passwords are at least 4 characters")

    # The fake implements only what this test calls, not all of Driver.
    factory = cast(registry.DriverFactory, make_driver)
    entry = registry.SchemeEntry(
        "fakebmc", "fake", "tcp", 7777, factory, check_path, validate_credentials
    )
    table = (*registry.entries(), entry)
    by_scheme, by_transport = registry._index(table)
    monkeypatch.setattr(registry, "_ENTRIES", table)
    monkeypatch.setattr(registry, "SCHEMES", by_scheme)
    monkeypatch.setattr(registry, "_BY_TRANSPORT", by_transport)

    address = parse_bmc_url("FakeBMC://10.0.0.9/any/path/")
    assert (address.protocol, address.scheme, address.port) == ("fake", "tcp", 7777)
    assert address.url == "fakebmc://10.0.0.9:7777/any/path"
    with pytest.raises(InvalidArgument, match="fakebmc://"):
        parse_bmc_url("no-scheme")
    async with BmcPool(max_workers=2) as pool:
        gateway = PoolGateway(pool)
        assert gateway.validate_target(address.url, "u", "long-enough") == address.url
        with pytest.raises(InvalidArgument, match="at least 4"):
            gateway.validate_target(address.url, "u", "abc")
        bmc = pool.get("n1", address, BmcCredentials("u", "long-enough"))
        assert bmc.protocol == "fake"
        assert await bmc.power.state() is PowerState.ON
    assert [d.address for d in made] == [address]
    assert made[0].closed
