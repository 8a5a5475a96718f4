"""Launch OpenIPMI's ``ipmi_sim`` as one loopback IPMI BMC.

The simulator gets a generated ``lan.conf`` (one admin user, RMCP+ on a free
UDP port of 127.0.0.1), an emulator command file with the SEL enabled and two
sensors read from files (a temperature sensor with upper thresholds 85/95/105
degrees C, so a test can heat the node and see SEL events, and a power draw
sensor), and a ``chassis_control`` program that keeps power and boot state in
files so that tests can assert on them without going through IPMI.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from controller.sim.ports import free_port
from controller.sim.process import ProcessPeer

# chassis_control protocol: "get <parm>..." prints "<parm>:<value>" lines,
# "set <parm> <value> [<parm> <value>...]" stores them.
_CHASSIS_CONTROL = """\
import os
import sys

STATE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = {"power": "0", "boot": "none"}


def main(args):
    if not args:
        return 1
    if args[0] == "get":
        for parm in args[1:]:
            path = os.path.join(STATE, parm)
            value = DEFAULTS.get(parm, "0")
            if os.path.exists(path):
                with open(path) as f:
                    value = f.read().strip() or value
            print(f"{parm}:{value}")
        return 0
    if args[0] == "set":
        rest = args[1:]
        for parm, value in zip(rest[::2], rest[1::2]):
            if parm == "shutdown":  # soft off request: the "OS" obeys at once
                parm, value = "power", "0"
            tmp = os.path.join(STATE, parm + ".tmp")
            with open(tmp, "w") as f:
                f.write(value)
            os.replace(tmp, os.path.join(STATE, parm))
        return 0
    return 0


sys.exit(main(sys.argv[1:]))
"""

TEMP_SENSOR = 1
POWER_SENSOR = 2
POWER_SCALE = 10  # the power sensor's M: watts = 10 x raw


def _full_sensor_record(
    number: int,
    name: str,
    *,
    sensor_type: int,
    base_unit: int,
    m: int,
    entity: int,
    thresholds: tuple[int, int, int] = (0, 0, 0),
) -> list[int]:
    """An SDR type 01 (full sensor record), IPMI 2.0 section 43.1, owner BMC 0x20."""
    unr, uc, unc = thresholds
    name_bytes = list(name.encode("ascii"))[:16]
    body = [
        0x20, 0x00, number, entity, 0x01,
        0x67,  # initialization: scanning, events, thresholds, hysteresis
        0x68 if any(thresholds) else 0x40,  # capabilities: settable thresholds, no rearm
        sensor_type, 0x01,  # threshold-based reading
        0x80, 0x0A, 0x80, 0x7A, 0x38, 0x38,  # event masks: upper thresholds
        0x00, base_unit, 0x00, 0x00,  # unsigned, unit, no modifier, linear
        m & 0xFF, (m >> 8 & 0x03) << 6, 0x00, 0x00, 0x00, 0x00,  # M, B, accuracy, exponents
        0x01, 0x00, 0xFF, 0x00, 0xFF, 0x00,  # flags, nominal, normal max/min, max/min
        unr, uc, unc, 0x00, 0x00, 0x00,  # thresholds
        0x00, 0x00, 0x00, 0x00, 0x00,  # hysteresis, reserved, OEM
        0xC0 | len(name_bytes), *name_bytes,
    ]  # fmt: skip
    return [0x00, 0x00, 0x51, 0x01, len(body), *body]


class IpmiSim(ProcessPeer):
    """One ``ipmi_sim`` BMC on 127.0.0.1; an async context manager."""

    def __init__(
        self,
        name: str,
        username: str,
        password: str,
        *,
        power_on: bool = False,
        temperature_c: int = 40,
        power_watts: int = 700,
        workdir: Path | None = None,
        port: int = 0,
    ) -> None:
        self.name = name
        self.username = username
        self._password = password
        self._initial_power = power_on
        self._temperature = temperature_c
        self._watts = power_watts
        self._workdir_given = workdir
        self.workdir: Path | None = None
        self._port_given = port  # 0: a free one at each start
        self.port = port
        self._proc: asyncio.subprocess.Process | None = None
        self._log: Any = None

    def __repr__(self) -> str:
        return f"IpmiSim(name={self.name!r}, port={self.port})"

    @property
    def address(self) -> str:
        """The Kiln BMC URL: ``ipmi://127.0.0.1:PORT``."""
        return f"ipmi://127.0.0.1:{self.port}"

    @property
    def _state(self) -> Path:
        assert self.workdir is not None, "IpmiSim is not started"
        return self.workdir / "chassis"

    def power_state(self) -> str:
        """ "on" or "off", read from the chassis state file (not via IPMI)."""
        path = self._state / "power"
        return "on" if path.exists() and path.read_text().strip() == "1" else "off"

    def set_power_state(self, on: bool) -> None:
        """Flip the power behind the BMC's back (a node powered off outside Kiln)."""
        (self._state / "power").write_text("1" if on else "0")

    def boot_device(self) -> str:
        """The boot device the chassis control program last stored (e.g. "pxe")."""
        path = self._state / "boot"
        return path.read_text().strip() if path.exists() else "none"

    def set_temperature(self, celsius: int) -> None:
        """Heat or cool the temperature sensor (the simulator polls it every second)."""
        (self.workdir or Path()).joinpath("temp.val").write_text(f"{int(celsius)}\n")

    def set_power_watts(self, watts: int) -> None:
        (self.workdir or Path()).joinpath("power.val").write_text(f"{int(watts) // POWER_SCALE}\n")

    def _write_files(self) -> tuple[Path, Path]:
        assert self.workdir is not None
        state = self._state
        state.mkdir(parents=True, exist_ok=True)
        control = state / "chassis_control.py"
        control.write_text(_CHASSIS_CONTROL)
        (state / "power").write_text("1" if self._initial_power else "0")
        self.set_temperature(self._temperature)
        self.set_power_watts(self._watts)
        for secret in (self.username, self._password):
            if '"' in secret or "\n" in secret:
                raise ValueError("IPMI simulator credentials cannot contain quotes or newlines")
        lan = self.workdir / "lan.conf"
        lan.write_text(
            f'name "{self.name}"\n'
            "set_working_mc 0x20\n"
            "  startlan 1\n"
            f"    addr 127.0.0.1 {self.port}\n"
            "    priv_limit admin\n"
            "    allowed_auths_admin none md2 md5 straight\n"
            "    guid a123456789abcdefa123456789abcdef\n"
            "  endlan\n"
            f'  chassis_control "{sys.executable} {control}"\n'
            f'  user 2 true "{self.username}" "{self._password}" admin 10 none md2 md5 straight\n'
        )
        lan.chmod(0o600)
        temp = _full_sensor_record(
            TEMP_SENSOR, "GPU Temp", sensor_type=0x01, base_unit=0x01, m=1, entity=0x07,
            thresholds=(105, 95, 85),
        )  # fmt: skip
        power = _full_sensor_record(
            POWER_SENSOR, "Power Draw", sensor_type=0x03, base_unit=0x06, m=POWER_SCALE,
            entity=0x15,
        )  # fmt: skip
        emu = self.workdir / "bmc.emu"
        emu.write_text(
            "mc_setbmc 0x20\n"
            "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\n"
            "sel_enable 0x20 1000 0x0a\n"
            f'sensor_add 0x20 0 {TEMP_SENSOR} 0x01 0x01 poll 1000 file "{self.workdir}/temp.val"\n'
            f"main_sdr_add 0x20 {' '.join(f'0x{b:02x}' for b in temp)}\n"
            f"sensor_set_threshold 0x20 0 {TEMP_SENSOR} settable 111000 "
            "0x69 0x5f 0x55 0x00 0x00 0x00\n"
            f"sensor_set_event_support 0x20 0 {TEMP_SENSOR} enable scanning per-state "
            "000111111000000 000111111000000 000111111000000 000111111000000\n"
            f"sensor_add 0x20 0 {POWER_SENSOR} 0x03 0x01 poll 1000 "
            f'file "{self.workdir}/power.val"\n'
            f"main_sdr_add 0x20 {' '.join(f'0x{b:02x}' for b in power)}\n"
            f"sensor_set_event_support 0x20 0 {POWER_SENSOR} enable scanning per-state "
            "000000000000000 000000000000000 000000000000000 000000000000000\n"
            "mc_enable 0x20\n"
        )
        return lan, emu

    async def start(self, ready_timeout: float = 10.0) -> None:
        if shutil.which("ipmi_sim") is None:
            raise RuntimeError("ipmi_sim (Debian package openipmi) is not installed")
        if self._workdir_given is not None:
            self.workdir = Path(self._workdir_given)
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"kiln-ipmi-{self.name}-"))
        self.port = self._port_given or free_port(kind=socket.SOCK_DGRAM)
        lan, emu = self._write_files()
        sim_state = self.workdir / "sim-state"
        sim_state.mkdir(exist_ok=True)
        self._log = (self.workdir / "ipmi_sim.log").open("ab")
        self._proc = await asyncio.create_subprocess_exec(
            "ipmi_sim", "-c", str(lan), "-f", str(emu), "-s", str(sim_state), "-n",
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            await self._wait_ready(ready_timeout)
        except BaseException:
            await self.stop()
            raise

    def _probe(self) -> bool:
        # An RMCP/ASF presence ping; ipmi_sim answers once its LAN is up.
        ping = bytes([0x06, 0x00, 0xFF, 0x06, 0x00, 0x00, 0x11, 0xBE, 0x80, 0x00, 0x00, 0x00])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.2)
            try:
                sock.sendto(ping, ("127.0.0.1", self.port))
                sock.recvfrom(512)
                return True
            except OSError:
                return False

    async def _wait_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self._proc is not None and self._proc.returncode is not None:
                raise RuntimeError(f"ipmi_sim exited with {self._proc.returncode}")
            if await asyncio.to_thread(self._probe):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"ipmi_sim not ready after {timeout}s")
