"""A BMC answering with a broken payload flags that node and nothing else.

Each case puts FaultProxy in front of sushy-tools' emulator and has it answer
one document with a broken payload (``PayloadFault``): wrong types, missing
fields or links, not JSON, not UTF-8, nested too deeply, or huge. Every
Redfish read must then raise ``BmcBadResponse`` naming the host, the
operation and what was wrong (in at most a few hundred characters, never the
password), never another exception; the answer is not retried, and the
node's BMC health reads "degraded" with the reason. Healthy BMCs in the same
pool and gateway go on answering.

The emulators here are module-scoped (one fake-driver and one libvirt-test
emulator for about 120 cases); each case gets its own proxy and pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from bmc_peers import PASSWORD, USER, make_pool

from controller.bmc import Bmc, BmcCredentials, PowerState, parse_bmc_url
from controller.bmc.errors import BmcBadResponse, BmcBreakerOpen
from controller.bmc.gateway import PoolGateway
from controller.bmc.redfish import MAX_JSON_DEPTH, MAX_RESPONSE_BYTES
from controller.core.errors import NotSupported
from controller.core.model import BmcTarget
from controller.sim.fault_proxy import FaultProxy, PayloadFault
from controller.sim.redfish_emulator import RedfishEmulator, make_systems

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "node-00001"
SYSTEM_DOC = rf"/Systems/{SYSTEM}$"  # the System document, as Kiln asks for it
THERMAL = r"/Chassis/[^/]+/Thermal$"
CHASSIS = r"/Chassis/[^/]+$"
UPDATE_SERVICE = r"/UpdateService$"
INVENTORY = r"/UpdateService/FirmwareInventory$"
MEMBER = r"/UpdateService/FirmwareInventory/BMC$"
MEMBER_PATH = "/redfish/v1/UpdateService/FirmwareInventory/BMC"
BIOS = r"/BIOS$"
BIOS_SETTINGS = r"/BIOS/Settings$"
HUGE = 50_000_000  # bytes a huge answer would be


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fake_emu() -> AsyncIterator[RedfishEmulator]:
    """sushy-tools' fake driver: power, thermal; no BIOS, no firmware inventory."""
    async with RedfishEmulator(make_systems(2), username=USER, password=PASSWORD) as emu:
        yield emu


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def libvirt_emu() -> AsyncIterator[RedfishEmulator]:
    """sushy-tools' libvirt driver on libvirt's test driver: BIOS attributes."""
    if importlib.util.find_spec("libvirt") is None:
        pytest.fail("libvirt-python is required for the BIOS cases (pip install libvirt-python)")
    async with RedfishEmulator(
        make_systems(2), backend="libvirt-test", username=USER, password=PASSWORD
    ) as emu:
        yield emu


# --- the operations ------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    name: str  # as the error names it
    call: Callable[[Bmc], Awaitable[object]]
    primary: str  # the document a generic breakage replaces
    backend: str = "fake"
    setup: tuple[PayloadFault, ...] = ()  # documents the emulator lacks
    label: str = ""  # its test ids, when not its name

    @property
    def ident(self) -> str:
        return (self.label or self.name).replace(" ", "-")


def _firmware_collection() -> PayloadFault:
    """The emulator has no FirmwareInventory (404): the proxy serves one."""
    return PayloadFault.json(
        INVENTORY,
        {
            "@odata.id": "/redfish/v1/UpdateService/FirmwareInventory",
            "Name": "Firmware Inventory",
            "Members": [{"@odata.id": MEMBER_PATH}],
        },
    )


POWER = Operation("power state", lambda b: b.power.state(), SYSTEM_DOC)
# The periodic pass's reading (power sync): the same GET on the event loop.
POLL = Operation("power state", lambda b: b.power.poll(), SYSTEM_DOC, label="power poll")
SENSORS = Operation("sensors", lambda b: b.sensors.readings(), THERMAL)
FIRMWARE = Operation(
    "firmware inventory",
    lambda b: b.firmware.inventory(),
    INVENTORY,
    setup=(_firmware_collection(),),
)
BIOS_ATTRS = Operation("BIOS attributes", lambda b: b.bios.attributes(), BIOS, backend="libvirt")
BIOS_PENDING = Operation(
    "BIOS pending attributes", lambda b: b.bios.pending(), BIOS_SETTINGS, backend="libvirt"
)
OPERATIONS = (POWER, POLL, SENSORS, FIRMWARE, BIOS_ATTRS, BIOS_PENDING)
# The other reads: the System document is the first thing each one reads.
OTHER_READS = (
    Operation("get boot device", lambda b: b.boot.get(), SYSTEM_DOC),
    Operation("virtual media state", lambda b: b.vmedia.state(), SYSTEM_DOC),
    Operation("inventory", lambda b: b.inventory.get(), SYSTEM_DOC),
    Operation("event log", lambda b: b.log.entries(), SYSTEM_DOC),
    Operation("BIOS attributes", lambda b: b.bios.attributes(), SYSTEM_DOC, backend="libvirt"),
    Operation("firmware inventory", lambda b: b.firmware.inventory(), SYSTEM_DOC),
)


# --- the broken payloads -------------------------------------------------------

# name -> (the payload for a document at PATH, a fragment the message must have)
GENERIC: dict[str, tuple[Callable[[str], PayloadFault], str]] = {
    "not-json": (
        lambda p: PayloadFault(p, b"<html><body>Service temporarily down</body></html>"),
        "not JSON (Expecting value at offset 0, near '<html><body>",
    ),
    "truncated-json": (
        lambda p: PayloadFault(p, b'{"@odata.id": "/redfish/v1/x", "PowerState": "O'),
        "not JSON (Unterminated string",
    ),
    "non-utf8": (
        lambda p: PayloadFault(p, b'{"Name": "caf\xe9 \xff\xfe"}'),
        "not UTF-8 (byte 0xe9 at offset 13)",
    ),
    "nan": (lambda p: PayloadFault(p, b'{"Id": NaN}'), "NaN is not a JSON number"),
    "empty": (lambda p: PayloadFault(p, b""), "empty answer"),
    "a-list": (lambda p: PayloadFault.json(p, ["x"]), "a list of 1 item(s), expected an object"),
    "a-string": (lambda p: PayloadFault.json(p, "x"), "the string 'x', expected an object"),
    "nested-200": (
        lambda p: PayloadFault.nested(p, 200),
        f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
    ),
    "nested-100000": (
        lambda p: PayloadFault.nested(p, 100_000),
        f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
    ),
    "huge-content-length": (
        lambda p: PayloadFault.huge(p, HUGE),
        f"answer of {HUGE} bytes is over the 16 MiB limit (not read)",
    ),
    "huge-chunked": (
        lambda p: PayloadFault.huge(p, HUGE, chunked=True),
        "answer is over the 16 MiB limit (stopped reading after",
    ),
}


def _system(**fields: Any) -> dict[str, Any]:
    """A System document, with ``fields`` changed (None: removed)."""
    doc: dict[str, Any] = {
        "@odata.id": f"/redfish/v1/Systems/{SYSTEM}",
        "Id": SYSTEM,
        "Name": SYSTEM,
        "PowerState": "Off",
        "Status": {"State": "Enabled", "Health": "OK"},
    }
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not None}


def _thermal(temperatures: Any = None, fans: Any = None) -> dict[str, Any]:
    ok = {"MemberId": "0", "Name": "GPU0 Temp", "ReadingCelsius": 41, "Status": {"Health": "OK"}}
    fan = {"MemberId": "0", "Name": "Fan1", "Reading": 3000, "ReadingUnits": "RPM"}
    return {
        "@odata.id": "/redfish/v1/Chassis/1/Thermal",
        "Temperatures": [ok] if temperatures is None else temperatures,
        "Fans": [fan] if fans is None else fans,
    }


def _member(**fields: Any) -> dict[str, Any]:
    doc = {"@odata.id": MEMBER_PATH, "Id": "BMC", "Name": "BMC firmware", "Version": "1.2.3"}
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not None}


def _bios(attributes: Any, drop: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {"@odata.id": f"/redfish/v1/Systems/{SYSTEM}/BIOS", "Id": "BIOS"}
    if not drop:
        doc["Attributes"] = attributes
    return doc


J = PayloadFault.json
# (operation, case id, faults, fragment the message must have)
SPECIFIC: list[tuple[Operation, str, tuple[PayloadFault, ...], str]] = [
    (POWER, "PowerState-42", (J(SYSTEM_DOC, _system(PowerState=42)),),
     "PowerState is the number 42, expected a string"),
    (POWER, "no-PowerState", (J(SYSTEM_DOC, _system(PowerState=None)),), "PowerState is missing"),
    (POWER, "PowerState-null", (PayloadFault(SYSTEM_DOC, b'{"PowerState": null}'),),
     "PowerState is null"),
    (POWER, "PowerState-unknown", (J(SYSTEM_DOC, _system(PowerState="Sideways")),),
     "PowerState 'Sideways' is not one of On, Off, PoweringOn, PoweringOff, Paused"),
    (POWER, "PowerState-echoes-the-password", (J(SYSTEM_DOC, _system(PowerState=PASSWORD)),),
     "PowerState '***' is not one of"),
    (POWER, "PowerState-long-string", (J(SYSTEM_DOC, _system(PowerState="A" * 5000)),),
     "PowerState 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'... is not one of"),
    # A power read goes straight to the System document; the firmware
    # inventory reads the service root first (its UpdateService link).
    (FIRMWARE, "service-root-not-json", (PayloadFault(r"^/redfish/v1/?$", b"garbage"),),
     "/redfish/v1/: not JSON (Expecting value at offset 0, near 'garbage')"),
    (FIRMWARE, "service-root-UpdateService-a-string",
     (J(r"^/redfish/v1/?$", {"Id": "Root", "UpdateService": "x"}),),
     "unexpected structure (TypeError: string indices must be integers"),
    (SENSORS, "Temperatures-strings", (J(THERMAL, _thermal(temperatures=["hot", "cold"])),),
     "Temperatures[0] is the string 'hot', expected an object"),
    (SENSORS, "Temperatures-not-a-list", (J(THERMAL, _thermal(temperatures="x")),),
     "Temperatures is the string 'x', expected a list"),
    (SENSORS, "ReadingCelsius-hot",
     (J(THERMAL, _thermal(temperatures=[{"Name": "GPU0", "ReadingCelsius": "hot"}])),),
     "Temperatures[0].ReadingCelsius is the string 'hot', expected a number"),
    (SENSORS, "ReadingCelsius-true",
     (J(THERMAL, _thermal(temperatures=[{"Name": "GPU0", "ReadingCelsius": True}])),),
     "Temperatures[0].ReadingCelsius is true, expected a number"),
    (SENSORS, "ReadingCelsius-1e999",
     (PayloadFault(THERMAL, b'{"Temperatures": [{"ReadingCelsius": 1e999}]}'),),
     "Temperatures[0].ReadingCelsius is not a finite number"),
    (SENSORS, "fan-Reading-hot", (J(THERMAL, _thermal(fans=[{"Name": "Fan1", "Reading": "hot"}])),),
     "Fans[0].Reading is the string 'hot', expected a number"),
    (SENSORS, "Health-42",
     (J(THERMAL, _thermal(temperatures=[{"ReadingCelsius": 40, "Status": {"Health": 42}}])),),
     "Temperatures[0].Status.Health is the number 42, expected a string"),
    (SENSORS, "Thermal-link-without-odata-id",
     (J(CHASSIS, {"@odata.id": "/redfish/v1/Chassis/1", "Thermal": {}}),),
     "Thermal has no @odata.id"),
    (SENSORS, "Thermal-link-to-another-host",
     (J(CHASSIS, {"Thermal": {"@odata.id": "http://198.51.100.7/redfish/v1/Thermal"}}),),
     "Thermal @odata.id 'http://198.51.100.7/redfish/v1/Thermal' is not a path on this BMC"),
    (SENSORS, "Links-Chassis-a-string", (J(SYSTEM_DOC, _system(Links={"Chassis": "x"})),),
     "Links.Chassis is the string 'x', expected a list of links"),
    (FIRMWARE, "Members-a-string", (J(INVENTORY, {"Members": "x"}),),
     "Members is the string 'x', expected a list of links"),
    (FIRMWARE, "no-Members", (J(INVENTORY, {"@odata.id": "/redfish/v1/x", "Name": "FW"}),),
     "Members is missing"),
    (FIRMWARE, "member-without-odata-id", (J(INVENTORY, {"Members": [{}]}),),
     "Members[0] has no @odata.id"),
    (FIRMWARE, "member-odata-id-7", (J(INVENTORY, {"Members": [{"@odata.id": 7}]}),),
     "Members[0] @odata.id is the number 7, expected a string"),
    (FIRMWARE, "Version-42", (_firmware_collection(), J(MEMBER, _member(Version=42))),
     "Version is the number 42, expected a string"),
    (FIRMWARE, "member-without-Id", (_firmware_collection(), J(MEMBER, _member(Id=None))),
     "Id is missing"),
    (FIRMWARE, "member-a-list", (_firmware_collection(), J(MEMBER, [1, 2])),
     "answer is a list of 2 item(s), expected an object"),
    (FIRMWARE, "FirmwareInventory-a-string", (J(UPDATE_SERVICE, {"FirmwareInventory": "x"}),),
     "FirmwareInventory is the string 'x', expected a link"),
    (BIOS_ATTRS, "Attributes-a-string", (J(BIOS, _bios("x")),),
     "Attributes is the string 'x', expected an object"),
    (BIOS_ATTRS, "no-Attributes", (J(BIOS, _bios(None, drop=True)),), "Attributes is missing"),
    (BIOS_ATTRS, "attribute-an-object", (J(BIOS, _bios({"ProcTurboMode": {"deep": 1}})),),
     "Attributes.'ProcTurboMode' is an object, expected a string, number or boolean"),
    (BIOS_ATTRS, "Bios-link-without-odata-id",
     (J(SYSTEM_DOC, _system(Bios={"@odata.type": "#Bios"})),), "Bios has no @odata.id"),
    (BIOS_PENDING, "SettingsObject-a-number",
     (J(BIOS, {**_bios({}), "@Redfish.Settings": {"SettingsObject": 5}}),),
     "@Redfish.Settings.SettingsObject is the number 5, expected a link"),
    (BIOS_PENDING, "pending-Attributes-a-list", (J(BIOS_SETTINGS, _bios([1])),),
     "Attributes is a list of 1 item(s), expected an object"),
]  # fmt: skip


def _cases() -> list[Any]:
    cases = []
    for op in OPERATIONS:
        for kind, (make, fragment) in GENERIC.items():
            faults = (*op.setup, make(op.primary))
            # The fault for the primary document goes first: it wins.
            cases.append(pytest.param(op, faults[::-1], fragment, id=f"{op.ident}-{kind}"))
    for op, kind, faults, fragment in SPECIFIC:
        cases.append(pytest.param(op, faults, fragment, id=f"{op.ident}-{kind}"))
        if op is POWER:
            cases.append(pytest.param(POLL, faults, fragment, id=f"{POLL.ident}-{kind}"))
    return cases


# --- helpers -------------------------------------------------------------------


@pytest.fixture
def emulators(
    fake_emu: RedfishEmulator, libvirt_emu: RedfishEmulator
) -> dict[str, RedfishEmulator]:
    return {"fake": fake_emu, "libvirt": libvirt_emu}


def _via(proxy: FaultProxy, system: str = SYSTEM) -> str:
    return f"redfish+http://127.0.0.1:{proxy.port}/redfish/v1/Systems/{system}"


async def _expect_bad(bmc: Bmc, proxy: FaultProxy, op: Operation, fragment: str) -> str:
    """Run ``op`` and check its error: the type, host, operation and reason."""
    with pytest.raises(BmcBadResponse) as info:
        await op.call(bmc)
    message = str(info.value)
    assert message.startswith(f"BMC 127.0.0.1:{proxy.port} sent a bad answer to {op.name}: ")
    assert fragment in message
    assert len(message) <= 300, message
    assert PASSWORD not in message
    return message


# --- tests ---------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("op", "faults", "fragment"), _cases())
async def test_broken_payload_is_a_bad_response_naming_what_was_wrong(
    emulators: dict[str, RedfishEmulator],
    credentials: BmcCredentials,
    op: Operation,
    faults: tuple[PayloadFault, ...],
    fragment: str,
) -> None:
    emu = emulators[op.backend]
    async with FaultProxy(("127.0.0.1", emu.port), payload_faults=faults) as proxy:
        async with make_pool(call_timeout=8.0) as pool:
            bmc = pool.get("node-1", parse_bmc_url(_via(proxy)), credentials)
            message = await _expect_bad(bmc, proxy, op, fragment)
            assert proxy.replaced >= 1
            replaced = proxy.replaced
            # Not retried, and the node's health says why.
            assert bmc.health.state == "degraded"
            assert bmc.health.last_error == message
            assert bmc.health.consecutive_failures == 1
            # The same BMC, fixed, answers again: "ok" (no firmware inventory
            # on the fake driver is an answer too).
            proxy.payload_faults.clear()
            with contextlib.suppress(NotSupported):
                await op.call(bmc)
            assert bmc.health.state == "ok"
            assert proxy.replaced == replaced


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", OTHER_READS, ids=lambda op: f"{op.name.replace(' ', '-')}")
@pytest.mark.parametrize(
    "kind", ["not-json", "non-utf8", "a-list", "nested-100000", "huge-chunked"]
)
async def test_every_read_turns_a_broken_system_document_into_a_bad_response(
    emulators: dict[str, RedfishEmulator], credentials: BmcCredentials, op: Operation, kind: str
) -> None:
    make, fragment = GENERIC[kind]
    if kind == "a-list" and op.name in ("get boot device", "virtual media state"):
        fragment = "unexpected structure"  # sushy itself parses the System here
    emu = emulators[op.backend]
    async with FaultProxy(("127.0.0.1", emu.port), payload_faults=[make(SYSTEM_DOC)]) as proxy:
        async with make_pool() as pool:
            bmc = pool.get("node-1", parse_bmc_url(_via(proxy)), credentials)
            await _expect_bad(bmc, proxy, op, fragment)
            assert bmc.health.state == "degraded"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", [POWER, POLL], ids=lambda op: op.ident)
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_huge_answer_is_refused_without_reading_it_all(
    fake_emu: RedfishEmulator, credentials: BmcCredentials, chunked: bool, op: Operation
) -> None:
    fault = PayloadFault.huge(SYSTEM_DOC, HUGE, chunked=chunked)
    async with FaultProxy(("127.0.0.1", fake_emu.port), payload_faults=[fault]) as proxy:
        async with make_pool() as pool:
            bmc = pool.get("node-1", parse_bmc_url(_via(proxy)), credentials)
            tracemalloc.start()
            started = time.monotonic()
            try:
                with pytest.raises(BmcBadResponse, match="over the 16 MiB limit"):
                    await op.call(bmc)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert time.monotonic() - started < 20
            # Never more than the cap (and a read chunk or two) in memory.
            assert peak < MAX_RESPONSE_BYTES + 4 * 1024 * 1024, peak
            await asyncio.sleep(0.2)  # let the proxy notice the hang-up
            assert proxy.replaced == 1  # not retried
            assert proxy.replaced_bytes < HUGE // 2  # the rest was never sent
            if not chunked:
                assert peak < 4 * 1024 * 1024  # refused on its Content-Length


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", [POWER, POLL], ids=lambda op: op.ident)
async def test_a_bmc_sending_only_bad_answers_is_failed_fast_after_the_threshold(
    fake_emu: RedfishEmulator, credentials: BmcCredentials, op: Operation
) -> None:
    fault = PayloadFault.json(SYSTEM_DOC, _system(PowerState=42))
    async with FaultProxy(("127.0.0.1", fake_emu.port), payload_faults=[fault]) as proxy:
        async with make_pool(breaker_threshold=3, breaker_cooldown=0.5) as pool:
            bmc = pool.get("node-1", parse_bmc_url(_via(proxy)), credentials)
            for count in (1, 2):
                with pytest.raises(BmcBadResponse):
                    await op.call(bmc)
                assert (bmc.health.state, bmc.health.consecutive_failures) == ("degraded", count)
            with pytest.raises(BmcBadResponse):
                await op.call(bmc)
            assert bmc.health.state == "unreachable"
            assert "PowerState is the number 42" in (bmc.health.last_error or "")
            seen = proxy.requests
            with pytest.raises(BmcBreakerOpen, match="PowerState is the number 42"):
                await op.call(bmc)
            assert proxy.requests == seen  # failed fast
            proxy.payload_faults.clear()
            await asyncio.sleep(0.6)
            assert await op.call(bmc) is PowerState.OFF  # the probe gets a good answer
            assert bmc.health.state == "ok"


@pytest.mark.timeout(90)
async def test_garbage_from_one_bmc_flags_that_node_only(credentials: BmcCredentials) -> None:
    async with RedfishEmulator(make_systems(5), username=USER, password=PASSWORD) as emu:
        wrong = FaultProxy(
            ("127.0.0.1", emu.port),
            payload_faults=[
                # The first power read gets a wrong type; then the real
                # System document leads to a broken Thermal document.
                PayloadFault.json(r"/Systems/node-00001$", _system(PowerState=42), limit=1),
                PayloadFault.json(THERMAL, _thermal(temperatures=["hot"])),
            ],
        )
        huge = FaultProxy(
            ("127.0.0.1", emu.port),
            payload_faults=[PayloadFault.huge(r"/Systems/node-00002$", HUGE, chunked=True)],
        )
        async with wrong, huge, make_pool() as pool:
            gateway = PoolGateway(pool, power_timeout=20)

            def target(node: str, url: str) -> BmcTarget:
                return BmcTarget(node=node, url=url, username=USER, password=PASSWORD)

            broken = {
                "n1": target("n1", _via(wrong, "node-00001")),
                "n2": target("n2", _via(huge, "node-00002")),
            }
            healthy = {
                name: target(name, emu.system_url(system))
                for name, system in (("n0", "node-00000"), ("n3", "node-00003"))
            }
            targets = [healthy["n0"], broken["n1"], broken["n2"], healthy["n3"]]

            polled = await gateway.poll_power(targets, concurrency=4)
            assert polled == {
                "n0": ("off", "ok"),
                "n1": (None, "degraded"),
                "n2": (None, "degraded"),
                "n3": ("off", "ok"),
            }
            for node in healthy.values():
                assert await gateway.thermal_c(node)
            with pytest.raises(BmcBadResponse, match="Temperatures\\[0\\] is the string 'hot'"):
                await gateway.thermal_c(broken["n1"])
            with pytest.raises(BmcBadResponse, match="over the 16 MiB limit"):
                await gateway.power_state(broken["n2"])
            # Healthy nodes still change state through the same gateway and pool.
            assert await gateway.set_power(healthy["n3"], "on") == "on"
            assert await gateway.power_state(healthy["n0"]) == "off"
            assert {n: gateway.health(n) for n in ("n0", "n1", "n2", "n3")} == {
                "n0": "ok",
                "n1": "degraded",
                "n2": "degraded",
                "n3": "ok",
            }
            polled = await gateway.poll_power(targets, concurrency=4)
            assert polled["n3"] == ("on", "ok")
            assert polled["n0"] == ("off", "ok")
            assert polled["n2"] == (None, "degraded")
            assert polled["n1"] == ("off", "ok")  # its System document is good again
            assert wrong.forwarded > 0  # the rest of that BMC's answers were real
