"""Redfish driver on sushy (blocking; the pool runs it in worker threads).

Translation tables sit at the top; sushy exceptions become Kiln errors in
``_edge``. One ``RedfishDriver`` serves one BMC system and is used by one
thread at a time (the pool serializes calls per BMC).

Broken answers. A BMC's answer is data from outside, and a broken one must
flag that node and nothing else:

* Size: the driver reads at most ``MAX_RESPONSE_BYTES`` (16 MiB) of any
  answer. An HTTP adapter mounted on sushy's requests session reads every
  body itself, in 64 KiB chunks: a ``Content-Length`` over the cap is refused
  before the body is read, and a body without one (chunked, or until close)
  is dropped, and the connection closed, as soon as it passes the cap, so
  memory stays near the cap however much the BMC sends.
* Form: every successful GET answer must be UTF-8 JSON nested at most
  ``MAX_JSON_DEPTH`` levels (no ``NaN``/``Infinity``, no 5000-digit
  integers); the adapter checks it before sushy sees it, so sushy never logs
  a whole unparseable body. The depth is counted before parsing, without
  recursion, so a 100,000-deep answer never takes ``json.loads`` to the
  interpreter's recursion limit.
* Content: the reads -- power state, sensors, leak detectors, firmware
  inventory, BIOS attributes, inventory, event log -- parse the documents themselves
  (``_Doc``): a field of the wrong type, a required field or link that is
  missing, or a link that is not a path on this BMC is named with its
  resource.

Any of these raises ``BmcBadResponse`` naming the host, the operation and
what was wrong, quoting at most a short excerpt (the whole reason is cut at
200 characters, and the BMC password is blanked should the BMC echo it).
Nothing else escapes: whatever sushy or the parsing raises on such an answer
(TypeError, KeyError, RecursionError, sushy's own errors ...) becomes a Kiln
error in ``_edge``. For the guard a bad answer is an answer, so it is not
retried (the BMC would send it again) and is not "unreachable"; it does count
against the breaker (``counts_against_breaker``), so the node's BMC health
reads "degraded" with the reason from the first bad answer, and a BMC that
sends nothing but bad answers ``breaker_threshold`` times in a row is failed
fast, and its node held back from new work, like one that does not answer.
A good answer makes it "ok" again.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import re
import ssl
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import aiohttp
import requests
import sushy
from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter
from sushy import auth as sushy_auth
from sushy import connector as sushy_connector
from sushy import exceptions as sushy_exc
from sushy.resources.system import system as sushy_system

from controller.bmc.errors import BmcBadResponse, BmcServerError, BmcTlsError
from controller.bmc.http_get import NotHttp
from controller.bmc.redfish_http import AnswerTooLarge, RedfishHttp
from controller.bmc.types import (
    BootDevice,
    BootMode,
    BootOverride,
    FirmwareComponent,
    HardwareInventory,
    Health,
    LeakDetectorReading,
    LogEntry,
    Nic,
    PowerAction,
    PowerState,
    SensorReading,
    SensorReadings,
    VirtualMediaState,
)
from controller.core.errors import (
    BmcAuthenticationFailed,
    BmcError,
    BmcTimeout,
    BmcUnreachable,
    InvalidArgument,
    NotSupported,
)
from controller.core.json_depth import nests_deeper_than

if TYPE_CHECKING:
    # The registry imports this module and address.py imports the registry.
    from controller.bmc.address import BmcAddress, BmcCredentials, TlsOptions

LOG = logging.getLogger(__name__)
_SYSTEM_PATH = re.compile(r"^/redfish/v1/Systems/[^/?#\s]+$")

# --- translation tables (wire <-> Kiln) -------------------------------------
POWER_STATES: dict[str, PowerState] = {
    "On": PowerState.ON,
    "Off": PowerState.OFF,
    "PoweringOn": PowerState.OFF,  # not on yet
    "PoweringOff": PowerState.ON,  # not off yet
    "Paused": PowerState.ON,
}
RESET_TYPES: dict[PowerAction, sushy.ResetType] = {
    PowerAction.ON: sushy.ResetType.ON,
    PowerAction.OFF: sushy.ResetType.GRACEFUL_SHUTDOWN,
    PowerAction.FORCE_OFF: sushy.ResetType.FORCE_OFF,
    PowerAction.CYCLE: sushy.ResetType.FORCE_RESTART,
    PowerAction.RESTART: sushy.ResetType.GRACEFUL_RESTART,
}
BOOT_TARGETS: dict[BootDevice, sushy.BootSource] = {
    BootDevice.PXE: sushy.BootSource.PXE,
    BootDevice.CD: sushy.BootSource.CD,
    BootDevice.DISK: sushy.BootSource.HDD,
    BootDevice.UEFI_HTTP: sushy.BootSource.UEFI_HTTP,
    BootDevice.NONE: sushy.BootSource.NONE,
}
BOOT_TARGETS_REV: dict[sushy.BootSource, BootDevice] = {v: k for k, v in BOOT_TARGETS.items()}
BOOT_MODES: dict[BootMode, sushy.BootSourceOverrideMode] = {
    BootMode.UEFI: sushy.BootSourceOverrideMode.UEFI,
    BootMode.LEGACY: sushy.BootSourceOverrideMode.LEGACY,
}
BOOT_MODES_REV = {v: k for k, v in BOOT_MODES.items()}
HEALTH: dict[str | None, Health] = {
    "OK": Health.OK,
    "Warning": Health.WARNING,
    "Critical": Health.CRITICAL,
}
# DMTF LeakDetector.DetectorState is a Resource.Health: OK, Warning or Critical (or null).
LEAK_DETECTOR_STATES: dict[str, Health] = {
    "OK": Health.OK,
    "Warning": Health.WARNING,
    "Critical": Health.CRITICAL,
}
LEAK_REDISCOVER_S = 600.0
"""How long the chassis' leak detector collections found are trusted before
they are looked for again (a BMC may gain leak detection with new firmware).
Finding none is not kept: the leak watcher asks such a BMC again only when
it means to look afresh (``LeakWatcher.rediscover``)."""
TASK_DONE_OK = {"Completed"}
TASK_FAILED = {"Exception", "Killed", "Cancelled", "Interrupted", "Suspended"}


def _health(value: Any) -> Health:
    if isinstance(value, sushy.Health):
        value = value.value
    return HEALTH.get(value, Health.UNKNOWN)


# --- what Kiln accepts from a BMC --------------------------------------------
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""The most bytes of one answer the driver reads (16 MiB). Real Redfish
documents stay far below it (the largest, attribute registries and expanded
log collections, are a few MiB)."""
MAX_JSON_DEPTH = 64
"""The deepest nesting accepted in an answer (Redfish documents nest < 10)."""
_READ_CHUNK = 64 * 1024
_PARSED = "kiln_document"  # the attribute on a requests.Response holding the parsed body
_UNSET = object()


class _BadAnswer(Exception):
    """Raised while reading or parsing an answer; ``_edge`` turns it into
    ``BmcBadResponse``. Deliberately not a requests exception, so that sushy's
    connector lets it through unchanged."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _CappedAdapter(HTTPAdapter):
    """requests' HTTP adapter, reading each body itself and at most ``limit``
    bytes of it; a GET's 2xx body is also checked to be JSON (see
    ``_decode_document``) and kept parsed on the response."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def send(
        self, request: PreparedRequest, stream: bool = False, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().send(request, True, *args, **kwargs)
        try:
            body = self._read(request, response)
            if request.method == "GET" and 200 <= response.status_code < 300 and body:
                setattr(response, _PARSED, _decode_document(body, _where(request)))
        except BaseException:
            response.close()  # drops the connection: the rest is never read
            raise
        # What requests' Response.content does, with a cap: the body is read.
        response._content = body
        response._content_consumed = True
        return response

    def _read(self, request: PreparedRequest, response: Response) -> bytes:
        declared = response.headers.get("Content-Length", "").strip()
        if request.method != "HEAD" and declared.isdigit() and int(declared) > self.limit:
            raise _BadAnswer(
                f"{_where(request)}: answer of {int(declared)} bytes is over the "
                f"{_size(self.limit)} limit (not read)"
            )
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_content(_READ_CHUNK):
            size += len(chunk)
            if size > self.limit:
                raise _BadAnswer(
                    f"{_where(request)}: answer is over the {_size(self.limit)} limit "
                    f"(stopped reading after {size} bytes)"
                )
            chunks.append(chunk)
        return b"".join(chunks)


def _where(request: PreparedRequest) -> str:
    return _short(str(request.path_url or "/"), 100)


def _size(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit} byte"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _decode_document(body: bytes, where: str) -> Any:
    """``body`` as JSON: UTF-8, no NaN/Infinity, at most ``MAX_JSON_DEPTH`` deep.

    Raises:
        _BadAnswer: naming ``where`` and what is wrong (with a short excerpt).
    """
    reason = None
    doc: Any = None
    try:
        text = body.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        reason = f"{where}: not UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start})"
        text = ""
    if reason is None and not text.strip():
        reason = f"{where}: empty answer"
    elif reason is None and nests_deeper_than(text, MAX_JSON_DEPTH):
        # Refused before parsing: see controller/core/json_depth.py.
        reason = f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels"
    elif reason is None:
        try:
            doc = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as e:
            near = _quote(text[max(0, e.pos - 20) : e.pos + 20])
            what = e.msg.removesuffix(" at")  # "Unterminated string starting at"
            reason = f"{where}: not JSON ({what} at offset {e.pos}, near {near})"
        except RecursionError:
            reason = f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels"
        except ValueError as e:  # NaN, or an integer longer than Python converts
            reason = f"{where}: not usable JSON ({_short(str(e), 80)})"
    # Raised outside the except blocks: the error must not hold on to the body.
    if reason is not None:
        raise _BadAnswer(reason)
    return doc


def _kind(value: Any) -> str:
    """What a JSON value is, for an error message (quoting at most 40 characters)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {_short(repr(value), 40)}"
    if isinstance(value, str):
        return f"the string {_quote(value)}"
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _quote(text: str, limit: int = 40) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class _Doc:
    """One JSON object from the BMC: ``path`` is the resource it came from,
    ``prefix`` where in it this object sits ("Temperatures[2]."). The getters
    check each field's type and raise ``_BadAnswer`` naming the field."""

    __slots__ = ("data", "path", "prefix")

    def __init__(self, data: Any, path: str, prefix: str = "") -> None:
        if not isinstance(data, dict):
            what = f"{prefix.rstrip('.')} is" if prefix else "answer is"
            raise _BadAnswer(f"{_short(path, 100)}: {what} {_kind(data)}, expected an object")
        self.data: dict[str, Any] = data
        self.path = path
        self.prefix = prefix

    def bad(self, key: str, problem: str) -> _BadAnswer:
        name = f"{self.prefix}{key}".rstrip(".") or "answer"
        return _BadAnswer(f"{_short(self.path, 100)}: {name} {problem}")

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.data:
            if required:
                raise self.bad(key, "is missing")
            return None
        value = self.data[key]
        if value is None and required:
            raise self.bad(key, "is null")
        return value

    def text(self, key: str, *, required: bool = False) -> str | None:
        value = self._get(key, required)
        if value is not None and not isinstance(value, str):
            raise self.bad(key, f"is {_kind(value)}, expected a string")
        return value

    def number(self, key: str) -> float | None:
        value = self._get(key, False)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.bad(key, f"is {_kind(value)}, expected a number")
        if not math.isfinite(value):
            raise self.bad(key, "is not a finite number")
        return float(value)

    def integer(self, key: str) -> int | None:
        value = self.number(key)
        if value is not None and not value.is_integer():
            raise self.bad(key, f"is {_kind(value)}, expected a whole number")
        return None if value is None else int(value)

    def obj(self, key: str, *, required: bool = False) -> _Doc | None:
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.bad(key, f"is {_kind(value)}, expected an object")
        return _Doc(value, self.path, f"{self.prefix}{key}.")

    def objects(self, key: str, *, required: bool = False) -> list[_Doc]:
        value = self._get(key, required)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.bad(key, f"is {_kind(value)}, expected a list")
        return [_Doc(item, self.path, f"{self.prefix}{key}[{i}].") for i, item in enumerate(value)]

    def link(self, key: str) -> str | None:
        """A ``{"@odata.id": "/path"}`` link; None when absent."""
        value = self._get(key, False)
        return None if value is None else self._path_of(key, value)

    def links(self, key: str, *, required: bool = False) -> list[str]:
        """A list of links (a collection's ``Members``, ``Links.Chassis``)."""
        value = self._get(key, required)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.bad(key, f"is {_kind(value)}, expected a list of links")
        return [self._path_of(f"{key}[{i}]", item) for i, item in enumerate(value)]

    def own_path(self) -> str:
        """This object's own ``@odata.id`` (a collection member given as a link)."""
        return self._path_of("", self.data)

    def _path_of(self, key: str, value: Any) -> str:
        if not isinstance(value, dict):
            raise self.bad(key, f"is {_kind(value)}, expected a link")
        path = value.get("@odata.id")
        if path is None:
            raise self.bad(key, "has no @odata.id")
        if not isinstance(path, str):
            raise self.bad(key, f"@odata.id is {_kind(path)}, expected a string")
        if not path.startswith("/") or path.startswith("//"):
            raise self.bad(key, f"@odata.id {_quote(path)} is not a path on this BMC")
        return path.rstrip("/") or "/"


T = TypeVar("T")
# A read of several documents written once for both ways of reading them:
# a generator that yields each path it wants, is sent its document (or
# thrown the error its read raised) and returns its result
# (``RedfishDriver._walk`` on sushy, ``_walk_async`` on the event loop).
_Walk = Generator[str, _Doc, T]


class _Stepper(Generic[T]):
    """Steps a walk on: ``path`` is what it asks next (None once it has
    returned, its value then ``result``)."""

    def __init__(self, walk: _Walk[T]) -> None:
        self._walk = walk
        self.path: str | None = None
        self._result: tuple[T] | None = None
        self._advance(lambda: next(walk))

    def answer(self, doc: _Doc) -> None:
        self._advance(lambda: self._walk.send(doc))

    def fail(self, error: Exception) -> None:
        """The read failed: ``error`` is raised in the walk where it asked;
        raised from here if the walk does not handle it."""
        self._advance(lambda: self._walk.throw(error))

    def _advance(self, step: Callable[[], str]) -> None:
        try:
            self.path = step()
        except StopIteration as done:
            self.path, self._result = None, (done.value,)

    @property
    def result(self) -> T:
        if self._result is None:
            raise RuntimeError("the walk has not returned")
        return self._result[0]


def _unless_absent(path: str | None) -> _Walk[_Doc | None]:
    """A resource this BMC may lack: None when absent (404, 405, 501)."""
    if path is None:
        return None
    try:
        doc: _Doc = yield path
    except sushy_exc.HTTPError as e:
        if e.status_code in (404, 405, 501):
            return None
        raise
    return doc


def _power_of(system: _Doc) -> PowerState:
    """A System document's ``PowerState``, checked."""
    wire = system.text("PowerState", required=True)
    state = POWER_STATES.get(wire or "")
    if state is None:
        raise system.bad(
            "PowerState", f"{_quote(wire or '')} is not one of {', '.join(POWER_STATES)}"
        )
    return state


def _status_health(doc: _Doc) -> Health:
    status = doc.obj("Status")
    return HEALTH.get(status.text("Health"), Health.UNKNOWN) if status else Health.UNKNOWN


def _attributes(doc: _Doc) -> dict[str, Any]:
    """A BIOS resource's ``Attributes``: a flat object of JSON scalars."""
    attrs = doc.obj("Attributes", required=True)
    assert attrs is not None  # required
    for key, value in attrs.data.items():
        if value is not None and not isinstance(value, str | int | float | bool):
            raise attrs.bad(_quote(key), f"is {_kind(value)}, expected a string, number or boolean")
        if isinstance(value, float) and not math.isfinite(value):
            raise attrs.bad(_quote(key), "is not a finite number")
    return dict(attrs.data)


class RedfishDriver:
    """Blocking Redfish calls for one system. Raises only Kiln errors."""

    def __init__(
        self,
        address: BmcAddress,
        credentials: BmcCredentials,
        tls: TlsOptions,
        *,
        request_timeout: float = 10.0,
        node: str = "",
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self._address = address
        self._credentials = credentials
        self._tls = tls
        self._timeout = request_timeout
        self._node = node or address.host
        self._label = f"{address.host}:{address.port}"
        self._max_response_bytes = max_response_bytes
        self._conn: sushy.Sushy | None = None
        self._connector: Any = None
        # For reads through RedfishHttp: the environment's route, and the
        # headers with the Basic credentials, each made once.
        self._http_route: tuple[str | None, bool | str] | None = None
        self._http_headers: dict[str, str] | None = None
        self._system: sushy_system.System | None = None
        # The LeakDetectors collections of the system's chassis, and when found.
        self._leak_paths: tuple[str, ...] | None = None
        self._leak_found_at = 0.0
        # Guards lazy connection set-up against a timed-out call still running.
        self._setup_lock = threading.Lock()

    # --- plumbing ---------------------------------------------------------
    @contextlib.contextmanager
    def _edge(self, operation: str) -> Iterator[None]:
        """Convert sushy/requests failures, and answers Kiln cannot use, into
        Kiln errors: nothing else leaves the driver."""
        host = self._label
        try:
            yield
        except (BmcError, NotSupported):
            raise
        except _BadAnswer as e:
            raise self._bad(operation, e.reason) from None
        except sushy_exc.AccessError as e:
            if e.status_code == 401:
                raise BmcAuthenticationFailed(host=host, username=self._credentials.username) from e
            raise BmcError(host=host, reason=f"{operation}: access denied (403)") from e
        except sushy_exc.ServerSideError as e:
            if e.status_code == 501:
                raise NotSupported(operation) from e
            raise BmcServerError(
                host=host, status=e.status_code, reason=f"{operation}: {self._text(e.detail)}"
            ) from e
        except sushy_exc.ResourceNotFoundError as e:
            raise NotSupported(operation) from e
        except sushy_exc.HTTPError as e:
            if e.status_code in (405, 501):
                raise NotSupported(operation) from e
            detail = self._text(e.detail, "")
            raise BmcError(
                host=host, reason=f"{operation}: HTTP {e.status_code} {detail}".strip()
            ) from e
        except sushy_exc.ConnectionError as e:
            self._reset_connection()
            text = str(e)
            if "ssl" in text.lower() or "certificate" in text.lower():
                raise BmcTlsError(host=host, reason=_short(_tls_reason(text))) from e
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise BmcTimeout(host=host, operation=operation, seconds=self._timeout) from e
            raise BmcUnreachable(host=host, reason=_short(_connection_reason(text))) from e
        except sushy_exc.MalformedAttributeError as e:
            # No chain, here and below: the cause may quote the whole answer.
            raise self._bad(operation, str(e)) from None
        except (sushy_exc.MissingAttributeError, sushy_exc.MissingActionError) as e:
            raise NotSupported(operation) from e
        except sushy_exc.InvalidParameterValueError as e:
            raise NotSupported(operation) from e
        except sushy_exc.SushyError as e:
            raise BmcError(host=host, reason=f"{operation}: {self._text(str(e))}") from e
        except RecursionError:
            raise self._bad(operation, "nested too deeply to read") from None
        except MemoryError:
            raise self._bad(operation, "too large to read") from None
        except (ValueError, LookupError, TypeError, AttributeError, ArithmeticError) as e:
            # sushy tripping over a field of the wrong type ("string indices
            # must be integers"), a bad value in a sushy resource ...
            raise self._bad(operation, f"unexpected structure ({type(e).__name__}: {e})") from None
        except Exception as e:
            LOG.warning(
                "node %s: Redfish %s %s raised %s", self._node, self._label, operation, type(e)
            )
            raise BmcError(
                host=host, reason=f"{operation}: unexpected {type(e).__name__} in the driver"
            ) from e

    @contextlib.contextmanager
    def _edge_http(self, operation: str) -> Iterator[None]:
        """As ``_edge``, for reads through ``RedfishHttp``: its failures
        (``http_get``'s and aiohttp's) become the Kiln errors the same
        failure raises through sushy, and ``_edge`` does the rest (answers Kiln cannot use)."""
        host = self._label
        with self._edge(operation):
            try:
                yield
            except (aiohttp.ClientSSLError, ssl.SSLError) as e:
                raise BmcTlsError(host=host, reason=_short(_tls_reason(str(e)))) from e
            except TimeoutError as e:  # the total or the connect timeout
                raise BmcTimeout(host=host, operation=operation, seconds=self._timeout) from e
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as e:
                raise BmcUnreachable(host=host, reason=_short(_socket_reason(e))) from e
            except (aiohttp.ClientError, NotHttp) as e:
                raise BmcError(host=host, reason=f"{operation}: {self._text(str(e))}") from e

    def _route(self) -> tuple[str | None, bool | str]:
        """The proxy (None: direct) and ``verify`` for this BMC, from the
        environment, read once (as the sushy session's)."""
        route = self._http_route
        if route is None:
            proxies, verify = _environment(self._address.base_url, self._tls.requests_verify)
            scheme = self._address.base_url.split(":", 1)[0]
            route = self._http_route = (proxies.get(scheme) or proxies.get("all"), verify)
        return route

    def _headers(self) -> dict[str, str]:
        headers = self._http_headers
        if headers is None:
            token = base64.b64encode(
                f"{self._credentials.username}:{self._credentials.password}".encode()
            ).decode("ascii")
            headers = self._http_headers = {
                "Authorization": f"Basic {token}",
                "Accept": "application/json",
                "OData-Version": "4.0",
            }
        return headers

    def _bad(self, operation: str, reason: str) -> BmcBadResponse:
        error = BmcBadResponse(host=self._label, operation=operation, reason=self._text(reason))
        LOG.info("node %s: %s", self._node, error)
        return error

    def _text(self, text: str | None, default: str = "error") -> str:
        """BMC-supplied text for a message: the password blanked, cut at 200."""
        text = str(text) if text else default
        password = self._credentials.password
        if password:
            text = text.replace(password, "***")
        return _short(text)

    def _reset_connection(self) -> None:
        with self._setup_lock:
            self._system = None

    def _http(self) -> Any:
        """The BMC's HTTP session (sushy's connector, no I/O): a read of a
        known path needs nothing more, so the first read of a BMC is one
        round trip, not two (the service root is read only by calls that go
        through sushy's resource model)."""
        connector = self._connector
        if connector is not None:  # not behind a service root being read
            return connector
        with self._setup_lock:
            if self._connector is None:
                proxies, verify = _environment(self._address.base_url, self._tls.requests_verify)
                connector = sushy_connector.Connector(
                    self._address.base_url,
                    verify=verify,
                    # Kiln retries with backoff itself; keep sushy's own
                    # retry loops to a single attempt.
                    server_side_retries=1,
                    server_side_retries_delay=0,
                    default_request_timeout=self._timeout,
                    connect_timeout=min(self._timeout, 5.0),
                )
                # Every answer is read through the capped adapter (sushy has
                # no public hook for its requests session's adapters).
                adapter = _CappedAdapter(self._max_response_bytes)
                connector._session.mount("https://", adapter)
                connector._session.mount("http://", adapter)
                connector._session.proxies.update(proxies)
                connector._session.trust_env = False
                connector.set_http_basic_auth(
                    self._credentials.username, self._credentials.password
                )
                self._connector = connector
            return self._connector

    def _sushy(self) -> sushy.Sushy:
        connector = self._http()
        with self._setup_lock:
            if self._conn is None:
                auth = sushy_auth.BasicAuth(
                    username=self._credentials.username, password=self._credentials.password
                )
                # Reads the service root: no answer, or a bad root, raises
                # and the next call tries again on the same session.
                self._conn = sushy.Sushy(self._address.base_url, auth=auth, connector=connector)
            return self._conn

    def _get(self, path: str) -> _Doc:
        """GET ``path`` as a JSON object (read and checked by the adapter)."""
        response = self._http().get(path)
        parsed = response.__dict__.get(_PARSED, _UNSET)
        if parsed is _UNSET:  # an empty body, or not a 2xx answer
            parsed = _decode_document(response.content, _short(path, 100))
        return _Doc(parsed, path)

    def _get_optional(self, path: str | None) -> _Doc | None:
        """An optional sub-resource: absent or an HTTP error means "not reported"."""
        if path is None:
            return None
        try:
            return self._get(path)
        except sushy_exc.HTTPError:
            return None

    def _get_unless_absent(self, path: str | None) -> _Doc | None:
        """A resource this BMC may lack: None when absent (404, 405, 501)."""
        return self._walk(_unless_absent(path))

    def _system_doc(self) -> _Doc:
        return self._get(self._address.system_path)

    def _sys(self, refresh: bool = True) -> sushy_system.System:
        conn = self._sushy()
        system = self._system
        if system is None:
            system = conn.get_system(self._address.system_path)
            self._system = system
        elif refresh:
            system.refresh(force=True)
        return system

    def close(self) -> None:
        """Close the HTTP session. Never waits: while a call is connecting
        (sushy reads the service root under the set-up lock, perhaps from a
        BMC that never answers) there is no session yet to close."""
        if not self._setup_lock.acquire(blocking=False):
            LOG.debug(
                "node %s: Redfish %s is still connecting; nothing to close", self._node, self._label
            )
            return
        try:
            if self._connector is not None:
                with contextlib.suppress(Exception):
                    self._connector.close()
            self._conn = None
            self._connector = None
            self._system = None
            self._leak_paths = None
        finally:
            self._setup_lock.release()

    # --- power --------------------------------------------------------------
    def power_state(self) -> PowerState:
        with self._edge("power state"):
            return _power_of(self._system_doc())

    async def power_state_async(self, http: RedfishHttp) -> PowerState:
        """``power_state`` on the event loop, through ``http`` (the pool's
        HTTP client, ``redfish_http.py``): the same GET, the same checks
        of the answer and the same Kiln errors, without a worker thread."""
        with self._edge_http("power state"):
            return _power_of(await self._get_async(http, self._address.system_path))

    async def _get_async(self, http: RedfishHttp, path: str) -> _Doc:
        """``_get`` through ``http`` (the pool's HTTP client): the same
        answer checks and the same sushy errors for an error answer, which
        ``_edge`` (under ``_edge_http``) turns into Kiln's."""
        url = self._address.base_url + path
        proxy, verify = self._route()
        try:
            status, body = await http.get(
                url,
                headers=self._headers(),
                tls=http.tls(verify),
                proxy=proxy,
                timeout=self._timeout,
                connect_timeout=min(self._timeout, 5.0),
                limit=self._max_response_bytes,
            )
        except AnswerTooLarge as e:  # as the capped adapter words it for sushy
            where = _short(path, 100)
            limit = _size(self._max_response_bytes)
            raise _BadAnswer(
                f"{where}: answer of {e.size} bytes is over the {limit} limit (not read)"
                if e.declared
                else f"{where}: answer is over the {limit} limit (stopped reading after "
                f"{e.size} bytes)"
            ) from None
        # An error answer raises the sushy error the same answer raises
        # through sushy's connector (the requests Response it reads is made
        # only for those).
        if status >= 400:
            sushy_exc.raise_for_response("GET", url, _answer(status, body))
        return _Doc(_decode_document(body, _short(path, 100)), path)

    def _walk(self, walk: _Walk[T]) -> T:
        """Run a read written as a walk (``_leak_walk``) on sushy's session:
        each path it yields is read with ``_get`` and sent back, or the
        error the read raised is thrown in where it asked."""
        step = _Stepper(walk)
        while step.path is not None:
            try:
                doc = self._get(step.path)
            except Exception as e:
                step.fail(e)
            else:
                step.answer(doc)
        return step.result

    async def _walk_async(self, http: RedfishHttp, walk: _Walk[T]) -> T:
        """``_walk`` on the event loop, each read through ``http``."""
        step = _Stepper(walk)
        while step.path is not None:
            try:
                doc = await self._get_async(http, step.path)
            except Exception as e:
                step.fail(e)
            else:
                step.answer(doc)
        return step.result

    def power_action(self, action: PowerAction) -> None:
        with self._edge(f"power {action.value}"):
            self._sys().reset_system(RESET_TYPES[action])

    # --- boot ---------------------------------------------------------------
    def boot_get(self) -> BootOverride:
        with self._edge("get boot device"):
            boot = self._sys().boot
            enabled = boot.enabled
            target = boot.target
            if enabled in (None, sushy.BootSourceOverrideEnabled.DISABLED) or target is None:
                return BootOverride(BootDevice.NONE)
            device = BOOT_TARGETS_REV.get(target, BootDevice.OTHER)
            mode = BOOT_MODES_REV.get(boot.mode) if boot.mode else None
            return BootOverride(
                device, persistent=enabled == sushy.BootSourceOverrideEnabled.CONTINUOUS, mode=mode
            )

    def boot_set(self, device: BootDevice, persistent: bool, mode: BootMode | None) -> None:
        if device not in BOOT_TARGETS:
            raise NotSupported(f"boot from {device.value}")
        with self._edge(f"set boot device {device.value}"):
            enabled = (
                sushy.BootSourceOverrideEnabled.CONTINUOUS
                if persistent
                else sushy.BootSourceOverrideEnabled.ONCE
            )
            self._sys().set_system_boot_options(
                target=BOOT_TARGETS[device],
                enabled=enabled,
                mode=BOOT_MODES[mode] if mode else None,
            )

    # --- virtual media ------------------------------------------------------
    def _cd(self) -> Any:
        system = self._sys()
        collections = []
        with contextlib.suppress(sushy_exc.MissingAttributeError):
            collections.append(system.virtual_media)
        if not collections:
            for manager in system.managers:
                with contextlib.suppress(sushy_exc.MissingAttributeError):
                    collections.append(manager.virtual_media)
        for collection in collections:
            for member in collection.get_members():
                types = {t.value if hasattr(t, "value") else t for t in member.media_types or []}
                if types & {"CD", "DVD"} or not types:
                    return member
        raise NotSupported("virtual media (CD)")

    def vmedia_state(self) -> VirtualMediaState:
        with self._edge("virtual media state"):
            cd = self._cd()
            return VirtualMediaState(inserted=bool(cd.inserted), image_url=cd.image or None)

    def vmedia_insert(self, image_url: str) -> None:
        with self._edge("insert virtual media"):
            cd = self._cd()
            if cd.inserted and cd.image == image_url:
                return
            if cd.inserted:
                cd.eject_media()
                cd.refresh(force=True)
            cd.insert_media(image_url, inserted=True, write_protected=True)

    def vmedia_eject(self) -> None:
        with self._edge("eject virtual media"):
            cd = self._cd()
            if cd.inserted or cd.image:
                cd.eject_media()

    # --- BIOS ---------------------------------------------------------------
    def _bios(self) -> Any:
        try:
            return self._sys().bios
        except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError) as e:
            raise NotSupported("BIOS attributes") from e

    def _bios_doc(self) -> _Doc:
        path = self._system_doc().link("Bios")
        if path is None:
            raise NotSupported("BIOS attributes")
        return self._get(path)

    def bios_attributes(self) -> dict[str, Any]:
        with self._edge("BIOS attributes"):
            return _attributes(self._bios_doc())

    def bios_pending(self) -> dict[str, Any]:
        with self._edge("BIOS pending attributes"):
            settings = self._bios_doc().obj("@Redfish.Settings")
            path = settings.link("SettingsObject") if settings else None
            if path is None:
                raise NotSupported("BIOS pending attributes")
            return _attributes(self._get(path))

    def bios_set(self, attrs: Mapping[str, Any]) -> None:
        with self._edge("BIOS attributes"):
            self._bios().set_attributes(dict(attrs))

    # --- firmware -----------------------------------------------------------
    def _update_service(self) -> Any:
        try:
            return self._sushy().get_update_service()
        except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError) as e:
            raise NotSupported("firmware update") from e

    def firmware_inventory(self) -> list[FirmwareComponent]:
        """FirmwareInventory members; without one, the System's ``BiosVersion``."""
        with self._edge("firmware inventory"):
            root = _Doc(self._sushy().json, "/redfish/v1/")
            service = self._get_unless_absent(root.link("UpdateService"))
            inventory = self._get_unless_absent(
                service.link("FirmwareInventory") if service else None
            )
            if inventory is None:
                system = self._system_doc()
                bios_version = system.text("BiosVersion")
                if not bios_version:
                    raise NotSupported("firmware inventory")
                return [
                    FirmwareComponent(
                        id="BIOS", name="BIOS", version=bios_version, target=system.path
                    )
                ]
            components = []
            for path in inventory.links("Members", required=True):
                try:
                    member = self._get(path)
                except sushy_exc.ResourceNotFoundError:
                    LOG.debug("node %s: firmware %s vanished; skipped", self._node, path)
                    continue
                identity = member.text("Id", required=True) or ""
                components.append(
                    FirmwareComponent(
                        id=identity,
                        name=member.text("Name") or identity,
                        version=member.text("Version") or "",
                        target=path,
                    )
                )
            return components

    def firmware_start(self, image_url: str, targets: list[str] | None) -> str | None:
        """Start SimpleUpdate; return a task monitor path or None when it finished at once."""
        with self._edge("firmware update"):
            monitor = self._update_service().simple_update(image_url, targets=targets)
            if monitor is None or not monitor.is_processing:
                self._check_monitor(monitor)
                return None
            return str(monitor.task_monitor_uri)

    def firmware_task_done(self, monitor_uri: str) -> bool:
        """True when the task finished successfully; raises BmcError when it failed."""
        with self._edge("firmware update"):
            monitor = self._sushy().get_task_monitor(monitor_uri)
            monitor.refresh()
            if monitor.is_processing:
                return False
            self._check_monitor(monitor)
            return True

    def _check_monitor(self, monitor: Any) -> None:
        task = getattr(monitor, "task", None) if monitor is not None else None
        if task is None:
            return
        state = getattr(task.task_state, "value", task.task_state)
        if state in TASK_FAILED:
            messages = "; ".join(str(m.message) for m in (task.messages or []) if m.message)
            raise BmcError(
                host=self._label, reason=f"firmware task {state}: {messages or 'no detail'}"
            )

    # --- sensors, inventory, logs --------------------------------------------
    def sensors(self) -> SensorReadings:
        with self._edge("sensors"):
            system = self._system_doc()
            links = system.obj("Links")
            temps: list[SensorReading] = []
            fans: list[SensorReading] = []
            watts: float | None = None
            for path in links.links("Chassis") if links else []:
                chassis = self._get_optional(path)
                if chassis is None:
                    continue
                thermal = self._get_optional(chassis.link("Thermal"))
                if thermal is not None:
                    for t in thermal.objects("Temperatures"):
                        name = t.text("Name") or "temperature"
                        value = t.number("ReadingCelsius")
                        temps.append(SensorReading(name, value, "C", _status_health(t)))
                    for f in thermal.objects("Fans"):
                        name = f.text("Name") or f.text("FanName") or "fan"
                        units = f.text("ReadingUnits") or ""
                        fans.append(
                            SensorReading(name, f.number("Reading"), units, _status_health(f))
                        )
                if watts is None:
                    power = self._get_optional(chassis.link("Power"))
                    for control in power.objects("PowerControl") if power else []:
                        watts = control.number("PowerConsumedWatts")
                        if watts is not None:
                            break
            return SensorReadings(tuple(temps), tuple(fans), watts, _status_health(system))

    # --- leak detection -----------------------------------------------------
    def leak_detectors(self) -> list[LeakDetectorReading]:
        """Every leak detector of the system's chassis, by the DMTF schema:
        ``Chassis/{id}/ThermalSubsystem/LeakDetection/LeakDetectors/{id}``;
        [] when no chassis of the system has leak detection.

        sushy has no model for these: the documents are read through its
        connector and checked here. A broken collection or link is a bad
        answer (``BmcBadResponse``); a detector whose own document is broken
        comes back with ``problem`` set, so the others still count.
        """
        with self._edge("leak detectors"):
            return self._walk(self._leak_walk())

    async def leak_detectors_async(self, http: RedfishHttp) -> list[LeakDetectorReading]:
        """``leak_detectors`` on the event loop, each GET through ``http``
        (the pool's HTTP client): the same walk, checks and errors."""
        with self._edge_http("leak detectors"):
            return await self._walk_async(http, self._leak_walk())

    def _leak_walk(self) -> _Walk[list[LeakDetectorReading]]:
        """The leak read as a walk: it yields each path to read and is sent
        its document (or thrown the read's error), whoever does the I/O."""
        try:
            return (yield from self._leak_read((yield from self._leak_collections())))
        except sushy_exc.ResourceNotFoundError:
            # A collection found earlier is gone (the BMC was reconfigured): look again.
            self._leak_paths = None
            return (yield from self._leak_read((yield from self._leak_collections())))

    def _leak_collections(self) -> _Walk[tuple[str, ...]]:
        """The LeakDetectors collections of the system's chassis (those found
        are kept for ``LEAK_REDISCOVER_S``; none found is looked for again
        at the next read): System ``Links.Chassis`` → Chassis
        ``ThermalSubsystem`` → ``LeakDetection`` → ``LeakDetectors``."""
        now = time.monotonic()
        if self._leak_paths and now - self._leak_found_at < LEAK_REDISCOVER_S:
            return self._leak_paths
        found: list[str] = []
        system: _Doc = yield self._address.system_path
        links = system.obj("Links")
        for path in links.links("Chassis") if links else []:
            chassis = yield from _unless_absent(path)
            thermal = yield from _unless_absent(
                chassis.link("ThermalSubsystem") if chassis else None
            )
            detection = yield from _unless_absent(
                thermal.link("LeakDetection") if thermal else None
            )
            collection = detection.link("LeakDetectors") if detection else None
            if collection is not None:
                found.append(collection)
        self._leak_paths = tuple(dict.fromkeys(found))
        self._leak_found_at = now
        return self._leak_paths

    def _leak_read(self, collections: tuple[str, ...]) -> _Walk[list[LeakDetectorReading]]:
        readings: list[LeakDetectorReading] = []
        for path in collections:
            listing: _Doc = yield path
            for member in listing.links("Members", required=True):
                try:
                    doc: _Doc = yield member
                except sushy_exc.ResourceNotFoundError:
                    LOG.debug("node %s: leak detector %s vanished; skipped", self._node, member)
                    continue
                except _BadAnswer as e:  # not JSON, too large ...: this detector only
                    ident = member.rsplit("/", 1)[-1]
                    readings.append(self._unreadable_detector(member, ident, e.reason))
                    continue
                readings.append(self._leak_reading(doc))
        return readings

    def _leak_reading(self, doc: _Doc) -> LeakDetectorReading:
        """One LeakDetector document; a field of the wrong type or an unknown
        ``DetectorState`` / ``Status.Health`` makes it a reading with ``problem``."""
        ident = doc.path.rsplit("/", 1)[-1]
        try:
            ident = doc.text("Id") or ident
            wire = doc.text("DetectorState")
            state = LEAK_DETECTOR_STATES.get(wire) if wire is not None else None
            if wire is not None and state is None:
                raise doc.bad(
                    "DetectorState", f"{_quote(wire)} is not one of OK, Warning, Critical"
                )
            status = doc.obj("Status")
            health_wire = status.text("Health") if status else None
            health = HEALTH.get(health_wire) if health_wire is not None else None
            if status is not None and health_wire is not None and health is None:
                raise status.bad(
                    "Health", f"{_quote(health_wire)} is not one of OK, Warning, Critical"
                )
            return LeakDetectorReading(
                path=doc.path,
                id=ident,
                name=doc.text("Name") or ident,
                detector_state=state,
                status_state=status.text("State") if status else None,
                status_health=health,
                read_at=time.time(),
                detector_type=doc.text("LeakDetectorType"),
                physical_context=doc.text("PhysicalContext"),
            )
        except _BadAnswer as e:
            return self._unreadable_detector(doc.path, ident, e.reason)

    def _unreadable_detector(self, path: str, ident: str, reason: str) -> LeakDetectorReading:
        problem = self._text(reason)
        LOG.info("node %s: leak detector %s unreadable: %s", self._node, path, problem)
        return LeakDetectorReading(
            path=path,
            id=ident,
            name=ident,
            detector_state=None,
            status_state=None,
            status_health=None,
            read_at=time.time(),
            problem=problem,
        )

    def inventory(self) -> HardwareInventory:
        with self._edge("inventory"):
            system = self._system_doc()
            summary = system.obj("ProcessorSummary")
            memory = system.obj("MemorySummary")
            nics: list[Nic] = []
            ifaces = self._get_optional(system.link("EthernetInterfaces"))
            for path in ifaces.links("Members") if ifaces else []:
                member = self._get_optional(path)
                if member is not None:
                    identity = member.text("Id") or path.rsplit("/", 1)[-1]
                    nics.append(Nic(id=identity, mac=member.text("MACAddress")))
            return HardwareInventory(
                manufacturer=system.text("Manufacturer"),
                model=system.text("Model"),
                serial=system.text("SerialNumber"),
                cpu_count=summary.integer("Count") if summary else None,
                cpu_model=summary.text("Model") if summary else None,
                memory_gib=memory.number("TotalSystemMemoryGiB") if memory else None,
                nics=tuple(nics),
            )

    def log_entries(self) -> list[LogEntry]:
        with self._edge("event log"):
            services_path = self._system_doc().link("LogServices")
            if not services_path:
                raise NotSupported("event log")
            entries: list[LogEntry] = []
            for path in self._get(services_path).links("Members"):
                entries_path = self._get(path).link("Entries")
                if not entries_path:
                    continue
                for raw in self._get(entries_path).objects("Members"):
                    if "Message" not in raw.data and "@odata.id" in raw.data:
                        raw = self._get(raw.own_path())
                    entries.append(_log_entry(raw))
            return entries


def _log_entry(raw: _Doc) -> LogEntry:
    created = None
    stamp = raw.text("Created")
    if stamp:
        with contextlib.suppress(ValueError):
            created = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return LogEntry(
        id=raw.text("Id") or "",
        message=raw.text("Message") or "",
        severity=HEALTH.get(raw.text("Severity"), Health.UNKNOWN),
        created=created,
    )


def _tls_reason(text: str) -> str:
    """The useful part of a requests SSL error ("certificate verify failed: ...")."""
    marker = "certificate verify failed"
    index = text.find(marker)
    return text[index:].split("'")[0].rstrip(")") if index >= 0 else text


_CONNECTION_CAUSES = (
    "Connection refused",
    "Connection reset",
    "No route to host",
    "Network is unreachable",
    "Name or service not known",
    "Temporary failure in name resolution",
    "Remote end closed connection without response",
)


def _environment(base_url: str, verify: bool | str) -> tuple[dict[str, str], bool | str]:
    """What the environment says for this BMC's URL (``HTTPS_PROXY`` and
    ``NO_PROXY``; ``REQUESTS_CA_BUNDLE`` when ``verify`` is True), by
    requests' own rules: the proxies and the ``verify`` to use. Read when a
    BMC's session is set up (``trust_env`` off after): requests otherwise
    reads it again on every call (every environment variable scanned for
    proxies, ``~/.netrc`` looked for), 10-20 % of a BMC read's CPU; and a
    ``~/.netrc`` is never sent to a BMC."""
    with requests.Session() as probe:
        settings = probe.merge_environment_settings(base_url, {}, None, verify, None)
    return dict(settings["proxies"]), settings["verify"]


def _connection_reason(text: str) -> str:
    """The root cause of a requests connection error ("Connection refused"),
    not the whole urllib3 chain; the chain itself when no cause is known."""
    return next((cause.lower() for cause in _CONNECTION_CAUSES if cause in text), text)


def _answer(status: int, body: bytes) -> Response:
    """An answer read through ``RedfishHttp`` as requests' ``Response``,
    which sushy's errors read their status and Redfish message from."""
    response = Response()
    response.status_code = status
    response._content = body
    return response


def _socket_reason(error: BaseException) -> str:
    """The root cause of a connection error on the event loop ("connection refused"),
    as ``_connection_reason`` gives it for requests'."""
    cause = getattr(error, "os_error", None) or error
    number = getattr(cause, "errno", None)
    if isinstance(number, int) and number > 0:
        return _connection_reason(os.strerror(number))
    text = str(error) or type(error).__name__
    if isinstance(error, aiohttp.ServerDisconnectedError):
        text = "Remote end closed connection without response"
    return _connection_reason(text)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- registry hooks (controller/bmc/registry.py) ------------------------------
def check_path(path: str) -> str:
    """A Redfish BMC URL names one ComputerSystem; return its path.

    Raises:
        InvalidArgument: the path is not ``/redfish/v1/Systems/<id>``.
    """
    if not _SYSTEM_PATH.match(path):
        raise InvalidArgument(
            f"Redfish BMC URL path must be /redfish/v1/Systems/<id> (got {path or '/'!r})"
        )
    return path


def validate_credentials(username: str, password: str) -> None:
    """Redfish itself limits neither; a BMC's own policy answers at login."""


def make_driver(
    address: BmcAddress,
    credentials: BmcCredentials,
    tls: TlsOptions,
    *,
    request_timeout: float,
    node: str,
) -> RedfishDriver:
    """The registry's factory (no I/O: sushy connects on first use)."""
    return RedfishDriver(address, credentials, tls, request_timeout=request_timeout, node=node)
