"""Leak detectors for sushy-tools' emulator: a small addition to its Flask app.

sushy-tools serves no leak detection, so the launcher (``python -m
controller.sim.redfish_emulator``) adds it to the real emulator's app before
handing over to its ``main()``; everything else stays sushy-tools' own.

What it adds, per emulated system:

* a **tray chassis** of its own, as a static chassis of sushy-tools
  (``SUSHY_EMULATOR_CHASSIS``; its UUIDs sort after the default chassis, so
  sushy-tools' first chassis, which holds every system's resources, stays
  first), linked from the system's ``Links.Chassis`` after the shared one,
  and whose own ``Links.ComputerSystems`` names the system;
* on that chassis, the DMTF resources: ``ThermalSubsystem`` (linked from the
  chassis, as the Chassis schema does), its ``LeakDetection``, and the
  ``LeakDetectors`` collection with two detectors (``LEAK_DETECTORS``),
  ``Chassis/{id}/ThermalSubsystem/LeakDetection/LeakDetectors/{id}``, each
  with ``DetectorState`` and ``Status``;
* **simulation only**: ``PATCH`` on a detector sets what it reports (real
  BMCs' detectors are read-only). The body may hold ``DetectorState`` (OK,
  Warning, Critical or null) and ``Status`` (``State``, ``Health``); a new
  ``DetectorState`` without a ``Status.Health`` sets that too, as the schema
  says the two should agree. Anything else is refused with 400.

Which systems get trays comes from the config file (``KILN_LEAK_TRAYS``,
written by ``RedfishEmulator``); without it nothing is added. The detectors'
state lives in the emulator process (``LeakBoard``), behind a lock (the app
serves requests on threads).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

# sushy-tools' own default chassis (resources/chassis.py), kept first.
SHARED_CHASSIS = {
    "Id": "SheetMetalChassis",
    "Name": "Chassis",
    "UUID": "15693887-7984-9484-3272-842188918912",
}
# (Id, Name, LeakDetectorType, PhysicalContext) of each tray's detectors.
LEAK_DETECTORS: tuple[tuple[str, str, str, str], ...] = (
    ("ColdPlate", "Cold plate leak detector", "Moisture", "GPUSubsystem"),
    ("Manifold", "Coolant manifold leak detector", "FloatSwitch", "Chassis"),
)
DETECTOR_STATES = ("OK", "Warning", "Critical")
TRAYS_KEY = "KILN_LEAK_TRAYS"
_BASE = "/redfish/v1/Chassis/{chassis}/ThermalSubsystem"


def tray_uuid(index: int) -> str:
    """The tray chassis UUID of the ``index``-th system: sorts after the default chassis."""
    return str(uuid.UUID(int=(0xF << 124) | (index + 1)))


def tray_config(systems: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Config file entries for systems given as (name, uuid): the static
    chassis (the default one first) and which tray chassis is each system's."""
    chassis = [dict(SHARED_CHASSIS)]
    trays: dict[str, dict[str, str]] = {}
    for index, (name, system_uuid) in enumerate(systems):
        tray = tray_uuid(index)
        chassis.append({"Id": f"Tray-{name}", "Name": f"{name} tray", "UUID": tray})
        trays[tray] = {"system": system_uuid, "name": name}
    return {"SUSHY_EMULATOR_CHASSIS": chassis, TRAYS_KEY: trays}


def detector_path(chassis: str, detector: str) -> str:
    return f"{_BASE.format(chassis=chassis)}/LeakDetection/LeakDetectors/{detector}"


class LeakBoard:
    """What each tray's detectors report, in the emulator process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, chassis: str, detector: str) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._state.setdefault((chassis, detector), _fresh())))

    def patch(self, chassis: str, detector: str, body: Any) -> dict[str, Any]:
        """Merge ``body`` into what the detector reports. Raises ValueError
        naming what is wrong with it (nothing is changed then)."""
        if not isinstance(body, dict) or not body:
            raise ValueError("PATCH a JSON object with DetectorState and/or Status")
        unknown = set(body) - {"DetectorState", "Status"}
        if unknown:
            raise ValueError(f"only DetectorState and Status may be set, not {sorted(unknown)}")
        status = body.get("Status", {})
        if not isinstance(status, dict) or set(status) - {"State", "Health"}:
            raise ValueError("Status is an object with State and/or Health")
        if "DetectorState" in body and body["DetectorState"] not in (*DETECTOR_STATES, None):
            raise ValueError(f"DetectorState is one of {DETECTOR_STATES} or null")
        if "Health" in status and status["Health"] not in (*DETECTOR_STATES, None):
            raise ValueError(f"Status.Health is one of {DETECTOR_STATES} or null")
        if "State" in status and not isinstance(status["State"], str):
            raise ValueError("Status.State is a string, e.g. Enabled or UnavailableOffline")
        with self._lock:
            current = self._state.setdefault((chassis, detector), _fresh())
            if "DetectorState" in body:
                current["DetectorState"] = body["DetectorState"]
                if "Health" not in status and body["DetectorState"] is not None:
                    current["Status"]["Health"] = body["DetectorState"]
            current["Status"].update(status)
            return json.loads(json.dumps(current))


def _fresh() -> dict[str, Any]:
    return {"DetectorState": "OK", "Status": {"State": "Enabled", "Health": "OK"}}


def _worst(healths: Sequence[Any]) -> str:
    order = {"OK": 0, "Warning": 1, "Critical": 2}
    return max((h for h in healths if h in order), key=order.__getitem__, default="OK")


def install(app: Any) -> LeakBoard:
    """Add leak detection to sushy-tools' Flask ``app`` (see the module
    docstring); returns the board holding the detectors' state."""
    import flask
    from werkzeug import exceptions as wz_exc

    board = LeakBoard()

    def trays() -> Mapping[str, Mapping[str, str]]:
        return app.config.get(TRAYS_KEY) or {}

    def tray(chassis: str) -> Mapping[str, str]:
        found = trays().get(chassis)
        if found is None:
            raise wz_exc.NotFound(f"chassis {chassis!r} has no leak detection")
        return found

    def answer(doc: Mapping[str, Any], status: int = 200) -> flask.Response:
        return flask.Response(json.dumps(doc), status=status, content_type="application/json")

    def detector_doc(chassis: str, ident: str) -> dict[str, Any]:
        spec = next((d for d in LEAK_DETECTORS if d[0] == ident), None)
        if spec is None:
            raise wz_exc.NotFound(f"no leak detector {ident!r}")
        _, name, kind, context = spec
        return {
            "@odata.type": "#LeakDetector.v1_3_0.LeakDetector",
            "@odata.id": detector_path(chassis, ident),
            "Id": ident,
            "Name": name,
            "LeakDetectorType": kind,
            "PhysicalContext": context,
            **board.get(chassis, ident),
        }

    @app.route("/redfish/v1/Chassis/<chassis>/ThermalSubsystem", methods=["GET"])
    def kiln_thermal_subsystem(chassis: str) -> flask.Response:
        tray(chassis)
        base = _BASE.format(chassis=chassis)
        return answer(
            {
                "@odata.type": "#ThermalSubsystem.v1_3_0.ThermalSubsystem",
                "@odata.id": base,
                "Id": "ThermalSubsystem",
                "Name": "Thermal Subsystem",
                "LeakDetection": {"@odata.id": f"{base}/LeakDetection"},
                "Status": {"State": "Enabled", "Health": "OK"},
            }
        )

    @app.route("/redfish/v1/Chassis/<chassis>/ThermalSubsystem/LeakDetection", methods=["GET"])
    def kiln_leak_detection(chassis: str) -> flask.Response:
        tray(chassis)
        base = f"{_BASE.format(chassis=chassis)}/LeakDetection"
        healths = [board.get(chassis, d[0])["Status"].get("Health") for d in LEAK_DETECTORS]
        return answer(
            {
                "@odata.type": "#LeakDetection.v1_1_0.LeakDetection",
                "@odata.id": base,
                "Id": "LeakDetection",
                "Name": "Leak Detection",
                "LeakDetectors": {"@odata.id": f"{base}/LeakDetectors"},
                "Status": {"State": "Enabled", "Health": "OK", "HealthRollup": _worst(healths)},
            }
        )

    @app.route(
        "/redfish/v1/Chassis/<chassis>/ThermalSubsystem/LeakDetection/LeakDetectors",
        methods=["GET"],
    )
    def kiln_leak_detectors(chassis: str) -> flask.Response:
        tray(chassis)
        members = [{"@odata.id": detector_path(chassis, d[0])} for d in LEAK_DETECTORS]
        return answer(
            {
                "@odata.type": "#LeakDetectorCollection.LeakDetectorCollection",
                "@odata.id": f"{_BASE.format(chassis=chassis)}/LeakDetection/LeakDetectors",
                "Name": "Leak Detector Collection",
                "Members@odata.count": len(members),
                "Members": members,
            }
        )

    @app.route(
        "/redfish/v1/Chassis/<chassis>/ThermalSubsystem/LeakDetection/LeakDetectors/<detector>",
        methods=["GET", "PATCH"],
    )
    def kiln_leak_detector(chassis: str, detector: str) -> flask.Response:
        tray(chassis)
        doc = detector_doc(chassis, detector)
        if flask.request.method == "PATCH":
            try:
                board.patch(chassis, detector, flask.request.get_json(force=True, silent=True))
            except ValueError as e:
                return answer(
                    {"error": {"code": "Base.1.0.PropertyValueError", "message": str(e)}}, 400
                )
            app.logger.info("leak detector %s of chassis %s set (simulation)", detector, chassis)
            doc = detector_doc(chassis, detector)
        return answer(doc)

    @app.after_request
    def kiln_tray_links(response: flask.Response) -> flask.Response:
        """The system's own tray chassis in its ``Links.Chassis`` (after the
        shared one); a tray chassis links its ThermalSubsystem and its system."""
        request = flask.request
        known = trays()
        if request.method != "GET" or response.status_code != 200 or not known:
            return response
        identity = str((request.view_args or {}).get("identity", ""))
        if request.endpoint == "system_resource":
            chassis = next((c for c, t in known.items() if identity in t.values()), None)
            if chassis is not None:
                doc = json.loads(response.get_data())
                links = doc.setdefault("Links", {}).setdefault("Chassis", [])
                links.append({"@odata.id": f"/redfish/v1/Chassis/{chassis}"})
                response.set_data(json.dumps(doc))
        elif request.endpoint == "chassis_resource" and identity in known:
            doc = json.loads(response.get_data())
            doc["ThermalSubsystem"] = {"@odata.id": _BASE.format(chassis=identity)}
            system = known[identity]["system"]
            doc.setdefault("Links", {})["ComputerSystems"] = [
                {"@odata.id": f"/redfish/v1/Systems/{system}"}
            ]
            response.set_data(json.dumps(doc))
        return response

    return board
