"""One-time boot and boots for sushy-tools' emulator: a small addition to its app.

sushy-tools' fake driver keeps a boot override's target but not how long it
lasts: ``BootSourceOverrideEnabled`` always reads back ``Continuous``, even
after ``Once`` was set, and nothing boots. Provisioning (set a one-time boot
from the virtual CD, power-cycle, the node comes back running the image)
needs both, so the launcher (``python -m controller.sim.redfish_emulator``)
adds them before handing over to sushy-tools' ``main()``; virtual media,
power and the rest stay sushy-tools' own.

What it adds, per system, in the emulator process (``BootBoard``, behind a
lock: the app serves requests on threads):

* ``BootSourceOverrideEnabled`` as the client last PATCHed it (``Once``,
  ``Continuous`` or ``Disabled``) is what a GET of the system reads back;
* a **boot** is a ``ComputerSystem.Reset`` that starts the system: ``On`` (or
  ``ForceOn``, ``PushPowerButton``) while it is off, or any restart or
  ``PowerCycle``. Each boot counts, records what it booted (the override's
  target when one is set, else ``Hdd``; for ``Cd`` the image the virtual CD
  held) and, as on real BMCs, ends a ``Once`` override (``Disabled``);
* a GET of the system shows it under ``Oem.KilnSim``: ``BootCount`` and
  ``LastBoot`` (``Device``, ``Image``, ``Override``). The simulated fleet
  (``controller.sim.fleet``) restarts a node's agent when ``BootCount``
  grows, as a booted node's agent would come back.
"""

from __future__ import annotations

import json
import threading
from typing import Any

SYSTEM_RULE = "/redfish/v1/Systems/<identity>"
RESET_RULE = "/redfish/v1/Systems/<identity>/Actions/ComputerSystem.Reset"
STARTS = frozenset({"On", "ForceOn", "PushPowerButton"})
RESTARTS = frozenset({"ForceRestart", "GracefulRestart", "PowerCycle"})
STOPS = frozenset({"ForceOff", "GracefulShutdown"})


class BootBoard:
    """Each system's override lifetime, boots and last boot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._enabled: dict[str, str] = {}
        self._boots: dict[str, int] = {}
        self._last: dict[str, dict[str, str]] = {}
        self._starting: set[str] = set()  # a boot counted, its power not yet seen On

    def set_enabled(self, system: str, enabled: str) -> None:
        with self._lock:
            self._enabled[system] = enabled

    def boot(self, system: str, target: str, image: str) -> None:
        """A boot of ``system``: counted; a Once override ends."""
        with self._lock:
            enabled = self._enabled.get(system, "Continuous")
            device = target if enabled in ("Once", "Continuous") and target != "None" else "Hdd"
            self._boots[system] = self._boots.get(system, 0) + 1
            self._last[system] = {
                "Device": device,
                "Image": image if device == "Cd" else "",
                "Override": enabled,
            }
            if enabled == "Once":
                self._enabled[system] = "Disabled"
            self._starting.add(system)

    def starting(self, system: str) -> bool:
        """Whether a boot of ``system`` was counted and its power is not On yet
        (with power delays a second "On" meanwhile is the same boot)."""
        with self._lock:
            return system in self._starting

    def settled(self, system: str) -> None:
        """``system``'s power was seen On, or was asked off: no boot is pending."""
        with self._lock:
            self._starting.discard(system)

    def shown(self, system: str) -> tuple[str | None, dict[str, Any]]:
        """(override lifetime or None when never set, the Oem.KilnSim document)."""
        with self._lock:
            return self._enabled.get(system), {
                "BootCount": self._boots.get(system, 0),
                "LastBoot": dict(self._last.get(system, {})),
            }


def install(app: Any) -> BootBoard:
    """Add one-time boot and boots to sushy-tools' Flask ``app``."""
    import flask

    board = BootBoard()

    def system_of(identity: str) -> str:
        try:
            return str(app.systems.uuid(identity))
        except Exception:  # an unknown system: sushy-tools answers it
            return identity

    @app.before_request
    def kiln_boot_before() -> None:
        rule = flask.request.url_rule.rule if flask.request.url_rule else ""
        identity = (flask.request.view_args or {}).get("identity", "")
        if not identity:
            return
        body = flask.request.get_json(silent=True) or {}
        if rule == SYSTEM_RULE and flask.request.method == "PATCH":
            enabled = (body.get("Boot") or {}).get("BootSourceOverrideEnabled")
            if enabled in ("Once", "Continuous", "Disabled"):
                board.set_enabled(system_of(identity), enabled)
        elif rule == RESET_RULE and flask.request.method == "POST":
            reset = body.get("ResetType", "")
            try:
                power = app.systems.get_power_state(identity)
            except Exception:
                return
            system = system_of(identity)
            if power == "On" or reset in STOPS:
                board.settled(system)
            starts = reset in STARTS and power != "On" and not board.starting(system)
            if not (reset in RESTARTS or starts):
                return
            try:
                target = app.systems.get_boot_device(identity)
                image = app.vmedia.get_device_image_info(identity, "Cd")
                url = image.image_url if image.inserted else ""
            except Exception:
                target, url = "Hdd", ""
            board.boot(system, str(target), str(url or ""))
            app.logger.info("system %s boots from %s (simulation)", identity, target)

    @app.after_request
    def kiln_boot_after(response: flask.Response) -> flask.Response:
        rule = flask.request.url_rule.rule if flask.request.url_rule else ""
        identity = (flask.request.view_args or {}).get("identity", "")
        if rule != SYSTEM_RULE or flask.request.method != "GET" or response.status_code != 200:
            return response
        try:
            doc = json.loads(response.get_data())
        except ValueError:
            return response
        system = system_of(identity)
        if doc.get("PowerState") == "On":
            board.settled(system)
        enabled, oem = board.shown(system)
        if enabled is not None and isinstance(doc.get("Boot"), dict):
            doc["Boot"]["BootSourceOverrideEnabled"] = enabled
        doc.setdefault("Oem", {})["KilnSim"] = oem
        response.set_data(json.dumps(doc))
        return response

    return board
