"""The controller process: storage, the domain core, BMC drivers and gRPC.

``ControllerServer`` is what ``kiln-controller``, ``kiln demo`` and the tests
run: a grpc.aio server with Kiln's two services, server reflection and the
standard health service, over a Fleet on SQLite or PostgreSQL.

Start-up runs in this order, so that what can fail at once does:

1. bind the address (``SO_REUSEPORT`` off: an address another controller or
   program serves is refused with ``ListenError``) and serve health, as
   NOT_SERVING, and reflection; Kiln's calls answer UNAVAILABLE;
2. wait to be the active controller (``ActiveLock``), as a hot standby;
3. open the store and the Fleet, then serve Kiln's services (SERVING).

While active, a lost database session makes the controller stand down
(``lock_lost``) the moment any database call sees the connection gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controller.api.agent_service import AgentService
from controller.api.auth.interceptor import AuthInterceptor, on_loopback
from controller.api.fleet_service import FleetService
from controller.api.keepalive import DEFAULT_KEEPALIVE_S, keepalive_options
from controller.api.limits import (
    DEFAULT_MAX_STREAMS,
    DEFAULT_RATE,
    MAX_RECEIVE_BYTES,
    RequestLimits,
)
from controller.api.relay.relayed import CallDetails
from controller.api.relay.supervisor import AgentRelays
from controller.bmc.gateway import PoolGateway
from controller.bmc.image_check import HttpImageVerifier
from controller.bmc.pool import BmcPool
from controller.bmc.reader.gateway import ReaderGateway
from controller.bmc.reader.readers import BmcReaders
from controller.checks import Suite
from controller.core.errors import InvalidArgument
from controller.core.fleet import Fleet
from controller.core.ports import BmcGateway
from controller.core.power_sync import DEFAULT_POWER_SYNC_VOUCHED_EVERY, pass_pacing
from controller.core.preparation import PrepLimits
from controller.core.profiles import ProfileCatalog
from controller.core.provisioning import ProvisionLimits
from controller.core.report_pace import PaceRules
from controller.dashboard.routes import Dashboard
from controller.events.broker import BrokerAccess
from controller.events.publisher import MqttPublisher
from controller.heap import GcPauses
from controller.http_server import HttpServer
from controller.metrics import ControllerMetrics
from controller.placement import QueueConfig
from controller.policies import RuleSet, load_rules_file
from controller.store.active_lock import ActiveLock
from controller.store.engine import default_sqlite_url, migrate, open_engine
from controller.store.outbox import StoreOutbox
from controller.store.secrets import SecretBox
from controller.store.sql_store import SqlStore
from controller.tls import ReloadableTls, TlsConfigError
from images.catalog import DEFAULT_PATH as DEFAULT_CATALOG
from images.catalog import Catalog, CatalogError, load_catalog
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc
from kiln_common.tokens import write_private

log = logging.getLogger(__name__)

SERVICES = (
    fleet_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name,
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
)
# With BMC readers, the controller's own BMC handles serve only power changes
# and operators' calls: one not used for this long is closed (its connection
# to the BMC, its driver's objects), and made anew when next needed.
IDLE_BMC_HANDLE_S = 600.0
IDLE_BMC_SWEEP_S = 60.0

STANDBY = "this controller is a standby; another controller is active on its database"


class ListenError(InvalidArgument):
    """The controller cannot listen on its address; nothing was served."""

    template = "cannot listen on %(address)s: %(reason)s"


def _probe_free(address: str) -> None:
    """Raise ListenError unless ``address`` (HOST:PORT) could be bound right now.

    Binding a throw-away socket first, the way gRPC binds (SO_REUSEADDR, so a
    port in TIME_WAIT is free; no SO_REUSEPORT, so a listening one is not),
    gives a message naming the address instead of gRPC core's log line.
    """
    host, _, port = address.rpartition(":")
    if port == "0":
        return  # any free port
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, ValueError) as e:
        raise ListenError(address=address, reason=f"cannot resolve {host!r}") from e
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as e:
                reason = {
                    errno.EADDRINUSE: "address already in use (by another controller or program)",
                    errno.EADDRNOTAVAIL: "not an address of this machine",
                    errno.EACCES: "permission denied (a port below 1024 needs privileges)",
                }.get(e.errno or 0, e.strerror or str(e))
                raise ListenError(address=address, reason=reason) from e


class _KilnServices(grpc.GenericRpcHandler):
    """Kiln's two services: registered before the server starts, filled in once
    the controller is active (``serve``); until then every call is refused.

    A standby has its port bound but no Fleet yet: an agent or operator that
    dials it is told at once (UNAVAILABLE) to try the next controller, rather
    than hanging on a port that accepts and never answers. gRPC registers
    services only before ``start``, hence one generic handler for both that
    changes what it hands out. Health and reflection are served apart.
    """

    def __init__(self) -> None:
        self._served: tuple[grpc.GenericRpcHandler, ...] = ()
        self._refusals: dict[str, grpc.RpcMethodHandler] = {}
        for file in (fleet_pb2.DESCRIPTOR, agent_pb2.DESCRIPTOR):
            for service in file.services_by_name.values():
                for method in service.methods:
                    refusal = _refusal(method.client_streaming, method.server_streaming)
                    self._refusals[f"/{service.full_name}/{method.name}"] = refusal

    def serve(self, fleet: Fleet) -> None:
        registrar = _Registrar()
        fleet_pb2_grpc.add_FleetServiceServicer_to_server(FleetService(fleet), registrar)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentService(fleet), registrar)
        self._served = tuple(registrar.handlers)

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        for handler in self._served:
            found = handler.service(handler_call_details)
            if found is not None:
                return found
        return self._refusals.get(handler_call_details.method)


class _Registrar:
    """Collects what the generated ``add_*Servicer_to_server`` functions register."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        pass  # the same handlers, looked up faster by core; the generic ones suffice


def _refusal(client_streaming: bool, server_streaming: bool) -> grpc.RpcMethodHandler:
    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, STANDBY)

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(client_streaming, server_streaming)]
    return make(refuse)


def load_images(path: Path | None) -> Catalog:
    """The image catalogue at ``path`` (None: the packaged one).

    Raises InvalidArgument listing every problem (``images.catalog``)."""
    try:
        return load_catalog(path or DEFAULT_CATALOG)
    except CatalogError as e:
        raise InvalidArgument(f"--images: {e}") from None


@dataclass
class ControllerConfig:
    listen: str = "127.0.0.1:50051"
    # Agent streams served by relay worker processes on agent_listen
    # (controller/api/relay/); 0: by this process, on listen only.
    agent_listen: str | None = None
    agent_relays: int = 0
    # Processes doing the periodic BMC reads (controller/bmc/reader/); 0: this one.
    bmc_readers: int = 0
    db_url: str | None = None  # None: SQLite in state_dir
    state_dir: Path | None = None  # None: a temporary directory
    profiles_dir: Path | None = None
    queues: Sequence[QueueConfig] = ()
    reconcile_interval: float = 1.0
    prep_limits: PrepLimits = field(default_factory=PrepLimits)
    sample_interval: float = 5.0
    health_flush_interval: float = 5.0  # the agents' latest health, written behind
    max_health_reports_per_second: float = 5000.0  # more agents are told to slow down
    pace: PaceRules = field(default_factory=PaceRules)  # slows agents while the loop lags
    bmc_call_timeout: float = 10.0
    bmc_power_timeout: float = 120.0
    bmc_power_resend_after: float = 30.0  # an unapplied power command is sent once more
    bmc_workers: int = 256
    profiles: ProfileCatalog | None = field(default=None, repr=False)
    rules: RuleSet | None = field(default=None, repr=False)  # None: rules_file or defaults
    rules_file: Path | None = None
    checks: Suite | None = field(default=None, repr=False)  # None: no health checks
    mqtt: str | None = None  # HOST:PORT of the MQTT broker events go to
    http_listen: str | None = None  # HOST:PORT of /metrics (None: not served)
    mqtt_access: BrokerAccess | None = None  # its credentials and TLS (None: anonymous, plain)
    power_sync_interval: float = 60.0
    # BMC reads a second at most (0: no cap), and the share of the interval a
    # pass's reads begin over (0: at once). None: ``pass_pacing``'s defaults
    # (200 and half the interval, or at once and no cap with BMC readers).
    power_sync_rate: float | None = None
    power_sync_spread: float | None = None
    # A node whose agent is connected has its BMC read every this many passes.
    power_sync_vouched_every: int = DEFAULT_POWER_SYNC_VOUCHED_EVERY
    leak_interval: float = 5.0  # seconds between reads of every node's leak detectors
    # OS provisioning (docs/provisioning.md): the image catalogue (None: the
    # file images_file, or the packaged images/catalog.yaml), the image server
    # overriding its own, how images are verified, caps and the agent timeout.
    images: Catalog | None = field(default=None, repr=False)
    images_file: Path | None = None
    image_server: str | None = None
    image_verify: str = "fetch"  # or "sidecar": URL.sha256 on the image server
    provision_limits: ProvisionLimits = field(default_factory=ProvisionLimits)
    agent_silent_after: float = 15.0  # then the BMC's thermal sensors feed the policies
    # Every connection pinged this often; one that does not answer is closed
    # (api/keepalive.py): a node gone dark loses its agent's stream.
    agent_keepalive: float = DEFAULT_KEEPALIVE_S
    bmc_thermal_interval: float = 10.0
    secret_key_file: Path | None = None  # None: secret.key in the state directory
    tls_cert: Path | None = None  # with tls_key: serve TLS instead of plaintext
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # require client certificates it signed (mTLS)
    # Authentication and the role table (README, Securing a fleet). None: on
    # unless the controller listens on loopback only; True: --auth; False:
    # --insecure-no-auth (logged as a warning at start).
    auth: bool | None = None
    simulation: bool = False  # serve simulation-only RPCs (InjectFault)
    bootstrap_token_file: Path | None = None  # an admin token is written here when none exists
    # Per client (peer IP) on FleetService: open streams, and requests a second.
    max_streams_per_client: int = DEFAULT_MAX_STREAMS
    max_requests_per_second_per_client: float = DEFAULT_RATE


class ControllerServer:
    def __init__(self, config: ControllerConfig, *, bmc: BmcGateway | None = None) -> None:
        self.config = config
        self._bmc = bmc
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._server: grpc.aio.Server | None = None
        self.fleet: Fleet | None = None
        self.store: SqlStore | None = None
        self.address = ""
        self.publisher: MqttPublisher | None = None
        self.metrics = ControllerMetrics()
        self.http: HttpServer | None = None
        self.http_address = ""
        self.tls: ReloadableTls | None = None
        self._active: ActiveLock | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._idle_sweep: asyncio.Task[None] | None = None
        self.lock_lost = asyncio.Event()
        self.stand_down_reason = ""
        self._trouble = asyncio.Event()  # a database call saw the connection gone
        self._loop: asyncio.AbstractEventLoop | None = None
        self._services = _KilnServices()
        self._auth = AuthInterceptor(
            enabled=self.auth_enabled,
            simulation=config.simulation,
            certificates=config.tls_client_ca is not None,
        )
        self._health: health.aio.HealthServicer | None = None
        self._publisher_task: asyncio.Task[None] | None = None
        self._limits: RequestLimits | None = None
        self.relays: AgentRelays | None = None
        self.bmc_readers: BmcReaders | None = None
        self.gc_pauses = GcPauses(self.metrics.meter.gc_pause)

    @property
    def auth_enabled(self) -> bool:
        """Whether callers must authenticate: ``config.auth``, else whether the
        controller listens on anything but loopback."""
        if self.config.auth is not None:
            return self.config.auth
        listens = (self.config.listen, self.config.agent_listen or self.config.listen)
        return not all(on_loopback(address) for address in listens)

    def _log_auth(self, tls: bool) -> None:
        if self.auth_enabled:
            log.info("authentication on: every call needs a bearer token or a client certificate")
            if not tls and not on_loopback(self.config.listen):
                log.warning(
                    "bearer tokens travel in plaintext on %s: serve TLS (--tls-cert, --tls-key)",
                    self.address,
                )
        elif self.config.auth is False:
            log.warning(
                "AUTHENTICATION IS OFF (--insecure-no-auth): anyone who reaches %s may enrol, "
                "power off, drain and release every node",
                self.address,
            )
        else:
            log.info("authentication off: listening on loopback only (--auth turns it on)")

    async def _bootstrap(self, path: Path) -> None:
        """Write the fleet's first admin token to ``path`` (before storing it)."""
        assert self.fleet is not None

        async def keep(_name: str, secret: str) -> None:
            await asyncio.to_thread(write_private, path, secret)

        name = await self.fleet.bootstrap_admin(keep)
        if name is None:
            log.info(
                "the fleet has (or had) an admin token; --bootstrap-token-file %s left as it is",
                path,
            )
            return
        log.warning(
            "wrote a new admin token %r to %s (mode 0600); make your own tokens with it, "
            "then revoke it: kiln tokens revoke %s",
            name,
            path,
            name,
        )

    def _state_dir(self) -> Path:
        if self.config.state_dir is not None:
            return self.config.state_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kiln-")
        return Path(self._tmp.name)

    def _db_url(self) -> str:
        return self.config.db_url or default_sqlite_url(self._state_dir())

    async def start(self) -> str:
        """Listen, wait to be the active controller, then serve; returns HOST:PORT.

        May wait as long as another controller is active on the database.

        Raises:
            TlsConfigError: (before opening anything) the TLS options are
                incomplete or name unusable files.
            ListenError: (before opening the store) the address is taken, not
                local, or not resolvable; a standby fails here, at once.
            DatabaseLost: the database cannot be reached.
        """
        cfg = self.config
        self.tls = ReloadableTls.from_options(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
        credentials = self.tls.credentials() if self.tls is not None else None
        profiles = cfg.profiles or ProfileCatalog.load(cfg.profiles_dir)
        await self._listen(credentials)
        engine = open_engine(self._db_url(), migrate_schema=False)
        self._active = ActiveLock(engine, on_trouble=self._database_trouble)
        await self._active.acquire(
            on_wait=lambda: log.warning(
                "another controller is active on this database; waiting as a standby"
            )
        )
        await asyncio.to_thread(migrate, engine)
        secrets = SecretBox.from_key_file(cfg.secret_key_file or self._state_dir() / "secret.key")
        self.store = SqlStore(engine, secrets=secrets)
        bmc = self._bmc or PoolGateway(
            BmcPool(
                max_workers=cfg.bmc_workers,
                call_timeout=cfg.bmc_call_timeout,
                power_resend_after=cfg.bmc_power_resend_after,
                meter=self.metrics.meter,
            ),
            power_timeout=cfg.bmc_power_timeout,
        )
        self._bmc = bmc
        fleet_bmc: BmcGateway = bmc
        if cfg.bmc_readers > 0:
            self.bmc_readers = BmcReaders(
                cfg.bmc_readers,
                workers=cfg.bmc_workers,
                call_timeout=cfg.bmc_call_timeout,
                verbose=log.isEnabledFor(logging.DEBUG),
            )
            self.bmc_readers.start()  # until they are up, the reads are done here
            fleet_bmc = ReaderGateway(bmc, self.bmc_readers)
        rules = cfg.rules or (load_rules_file(cfg.rules_file) if cfg.rules_file else None)
        sync_spread, sync_rate = pass_pacing(
            readers=cfg.bmc_readers > 0, spread=cfg.power_sync_spread, rate=cfg.power_sync_rate
        )
        self.fleet = Fleet(
            self.store,
            fleet_bmc,
            profiles=profiles,
            queues=cfg.queues,
            reconcile_interval=cfg.reconcile_interval,
            sample_interval=cfg.sample_interval,
            rules=rules,
            power_sync_interval=cfg.power_sync_interval,
            power_sync_spread=sync_spread,
            power_sync_rate=sync_rate,
            power_sync_vouched_every=cfg.power_sync_vouched_every,
            leak_interval=cfg.leak_interval,
            prep_limits=cfg.prep_limits,
            agent_silent_after=cfg.agent_silent_after,
            bmc_thermal_interval=cfg.bmc_thermal_interval,
            health_flush_interval=cfg.health_flush_interval,
            max_reports_per_second=cfg.max_health_reports_per_second,
            pace=cfg.pace,
            meter=self.metrics.meter,
            checks=cfg.checks,
            images=cfg.images or load_images(cfg.images_file),
            image_verifier=HttpImageVerifier(mode=cfg.image_verify),
            image_server=cfg.image_server,
            provision_limits=cfg.provision_limits,
        )
        if cfg.mqtt:
            host, _, port = cfg.mqtt.rpartition(":")
            if not host or not port.isdigit():
                raise InvalidArgument(f"--mqtt wants HOST:PORT, not {cfg.mqtt!r}")
            self.publisher = MqttPublisher(
                StoreOutbox(self.store),
                host,
                int(port),
                client_id=f"kiln-controller-{uuid.uuid4().hex[:8]}",
                access=cfg.mqtt_access,
            )
            self.store.on_commit(self.publisher.notify)
            self._publisher_task = asyncio.create_task(self.publisher.run(), name="kiln-mqtt")
        if cfg.http_listen:
            await self._serve_http(cfg.http_listen)
        if cfg.bootstrap_token_file is not None:
            await self._bootstrap(cfg.bootstrap_token_file)
        await self._serve_api()
        self.gc_pauses.start()
        self._log_auth(credentials is not None)
        log.info(
            "controller listening on %s (%s)",
            self.address,
            "plaintext" if credentials is None else "mutual TLS" if cfg.tls_client_ca else "TLS",
        )
        return self.address

    async def _listen(self, credentials: grpc.ServerCredentials | None) -> None:
        """Bind the address and serve health (NOT_SERVING) and reflection.

        Raises ListenError, having served nothing, when the address cannot be bound.
        """
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        _probe_free(cfg.listen)
        if cfg.agent_listen is not None:
            # The relay workers bind it with SO_REUSEPORT, which would share
            # it with anything else that does: it must be free.
            _probe_free(cfg.agent_listen)
        # gRPC turns SO_REUSEPORT on by default, which lets a second controller
        # bind an address already served; clients would then alternate between
        # two controllers (and two databases).
        limits = RequestLimits(
            max_streams=cfg.max_streams_per_client, rate=cfg.max_requests_per_second_per_client
        )
        self._limits = limits
        server = grpc.aio.server(
            interceptors=[limits, self._auth],
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                *keepalive_options(cfg.agent_keepalive),
                # gRPC's own limit on calls waiting to be taken up (1,000,
                # then it refuses them) is kept: a refused agent backs off and
                # comes back. Raised to 100,000 it let 3,000 calls in at once,
                # but was not shown to help a 25,000-agent reconnect (README).
            ],
        )
        server.add_generic_rpc_handlers((self._services,))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        try:
            if credentials is None:
                bound = server.add_insecure_port(cfg.listen)
            else:
                bound = server.add_secure_port(cfg.listen, credentials)
        except RuntimeError as e:  # gRPC's "Failed to bind": lost a race with another program
            raise ListenError(address=cfg.listen, reason="gRPC could not bind it") from e
        if bound == 0:
            raise ListenError(address=cfg.listen, reason="gRPC could not bind it")
        for name in ("", *SERVICES):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        self._server = server
        host, _, _ = cfg.listen.rpartition(":")
        self.address = f"{host or '127.0.0.1'}:{bound}"

    async def _serve_api(self) -> None:
        """Serve Kiln's services over the Fleet: now SERVING."""
        assert self._health is not None and self.fleet is not None
        await self.fleet.start()
        self._watchdog = asyncio.create_task(self._watch_lock(), name="kiln-active-lock")
        if self.bmc_readers is not None and isinstance(self._bmc, PoolGateway):
            self._idle_sweep = asyncio.create_task(
                _release_idle(self._bmc), name="kiln-bmc-idle-handles"
            )
        self._auth.serve(self.fleet)  # before the services: no call is served unchecked
        self._services.serve(self.fleet)
        cfg = self.config
        if cfg.agent_relays > 0 and cfg.agent_listen is not None:
            _probe_free(cfg.agent_listen)  # again: a standby may have waited long
            self.relays = AgentRelays(
                cfg.agent_relays,
                cfg.agent_listen,
                self._relayed_handler,
                tls_files=(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca),
                keepalive=cfg.agent_keepalive,
            )
            await self.relays.start()
            self.fleet.count_helpers(self.relays.cpu_seconds)
        for name in ("", *SERVICES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def _relayed_handler(self, details: CallDetails) -> grpc.RpcMethodHandler | None:
        """The handler a call forwarded by a relay worker runs: the one a
        direct call gets, through the same interceptors."""
        assert self._limits is not None

        async def served(d: Any) -> grpc.RpcMethodHandler | None:
            return self._services.service(d)

        async def authenticated(d: Any) -> grpc.RpcMethodHandler:
            return await self._auth.intercept_service(served, d)  # type: ignore[arg-type]

        return await self._limits.intercept_service(authenticated, details)  # type: ignore[arg-type]

    def _database_trouble(self) -> None:
        """Wake the watchdog; called from whichever thread saw the error."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._trouble.set)

    @property
    def database_troubled(self) -> bool:
        """True from the moment a database call saw the connection gone until
        the lock is found still held, and for good once it is lost."""
        return self.lock_lost.is_set() or (
            self._active is not None and self._active.troubled.is_set()
        )

    async def _watch_lock(self, every: float = 5.0) -> None:
        """Stand down the moment the active-controller lock is lost, so two
        controllers never act on the same fleet at once: checked every
        ``every`` seconds, and at once when a database call lost its connection.
        Sets ``lock_lost`` and ``stand_down_reason`` (one line); whoever runs
        the server reports it and stops it."""
        assert self._active is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self._trouble.wait()
            troubled = self._trouble.is_set()
            self._trouble.clear()
            if not await asyncio.to_thread(self._active.still_held):
                self.stand_down_reason = self._active.lost_reason or "the lock is gone"
                log.debug("lost the active-controller lock: %s", self.stand_down_reason)
                self.lock_lost.set()
                return
            if troubled:
                log.warning("a database connection dropped; this controller is still active")

    def reload_tls(self) -> bool:
        """Read the TLS certificate, key and client CA again (SIGHUP): new
        connections use them, open streams carry on. A file that is now
        unusable is logged on one line and the current ones stay in use.
        Returns whether the new files were taken."""
        if self.tls is None:
            log.info("SIGHUP: serving plaintext, no TLS files to reload")
            return False
        try:
            files = self.tls.reload()
        except TlsConfigError as e:
            log.warning("SIGHUP: TLS not reloaded, the current certificate stays: %s", e)
            return False
        if self.relays is not None:
            self.relays.signal_all(signal.SIGHUP)  # the workers read the files again too
        expires = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(files.expires_at))
        log.info(
            "SIGHUP: TLS reloaded from %s (certificate expires %s)%s",
            self.tls.cert,
            expires,
            f", client CA {self.tls.client_ca}" if self.tls.client_ca else "",
        )
        return True

    async def _serve_http(self, listen: str) -> None:
        """/metrics on ``listen``. Raises ListenError when it cannot be bound."""
        assert self.fleet is not None and self.store is not None
        self.metrics.watch(
            self.fleet,
            breakers=self._bmc.breaker_states if isinstance(self._bmc, PoolGateway) else None,
            bmc_threads=self._bmc.threads_allowed if isinstance(self._bmc, PoolGateway) else None,
            outbox=StoreOutbox(self.store).backlog if self.publisher is not None else None,
            relays=lambda: self.relays.figures() if self.relays is not None else {},
            bmc_readers=lambda: self.bmc_readers.figures() if self.bmc_readers else {},
            store_writer=self.store.writer_figures,
        )
        self.http = HttpServer(self.metrics, Dashboard(self.fleet, auth=self.auth_enabled))
        try:
            self.http_address = await self.http.start(listen)
        except OSError as e:
            self.http = None
            raise ListenError(address=listen, reason=e.strerror or str(e)) from None

    async def stop(self, grace: float = 2.0) -> None:
        """Stop serving (in-flight calls get ``grace`` seconds), then the Fleet,
        the BMC pool and the store; safe to call after a failed or cancelled start.

        Each step gets at most ``STOP_STEP_S``: one that overruns is logged by
        name and left behind, so that a stuck step cannot keep the process
        (or the port and the active lock) from being given back."""
        self.gc_pauses.stop()
        if self.http is not None:
            await _bounded("the dashboard and metrics server", self.http.stop())
            self.http = None
        if self._health is not None:
            await self._health.enter_graceful_shutdown()  # health says NOT_SERVING
            self._health = None
        for task in (self._watchdog, self._idle_sweep):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._watchdog = self._idle_sweep = None
        if self.fleet is not None and (self.relays is not None or self._server is not None):
            self.fleet.stopping = True  # the streams end now: no event for each
        if self.relays is not None:
            await _bounded("the agent relay workers", self.relays.stop())
            self.relays = None
        if self._server is not None:
            await _bounded("the gRPC server", self._server.stop(grace), extra=grace)
            self._server = None
        if self.publisher is not None:
            await _bounded("the event publisher", self.publisher.stop())
            self.publisher = None
        if self._publisher_task is not None:
            self._publisher_task.cancel()
            await asyncio.gather(self._publisher_task, return_exceptions=True)
            self._publisher_task = None
        if self.fleet is not None:
            await _bounded("the fleet's loops", self.fleet.stop())
        if self.bmc_readers is not None:
            await _bounded("the BMC readers", self.bmc_readers.stop())
            self.bmc_readers = None
        if self._bmc is not None:
            await _bounded("the BMC pool", self._bmc.close())
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._active is not None:
            self._active.release()
            self._active = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


async def _release_idle(bmc: PoolGateway) -> None:
    """Every ``IDLE_BMC_SWEEP_S``: close the handles idle ``IDLE_BMC_HANDLE_S``."""
    while True:
        await asyncio.sleep(IDLE_BMC_SWEEP_S)
        released = bmc.release_idle(IDLE_BMC_HANDLE_S)
        if released:
            log.info(
                "BMC handles: closed %d not used for %.0f minutes (the BMC readers do the reads)",
                released,
                IDLE_BMC_HANDLE_S / 60,
            )


STOP_STEP_S = 15.0  # a shutdown step's limit (``ControllerServer.stop``)


async def _bounded(step: str, work: Awaitable[object], *, extra: float = 0.0) -> None:
    """Await one shutdown step for at most ``STOP_STEP_S`` (+ ``extra``);
    one that overruns is cancelled and logged by name."""
    try:
        async with asyncio.timeout(STOP_STEP_S + extra):
            await work
    except TimeoutError:
        log.warning(
            "shutdown: %s did not stop within %.0f s; going on without it",
            step,
            STOP_STEP_S + extra,
        )
