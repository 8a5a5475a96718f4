"""The controller process: storage, the domain core, BMC drivers and gRPC.

``ControllerServer`` is what ``kiln-controller``, ``kiln demo`` and the tests
run: a grpc.aio server with Kiln's two services, server reflection and the
standard health service, over a Fleet on SQLite or PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controller.api.agent_service import AgentService
from controller.api.fleet_service import FleetService
from controller.bmc.gateway import PoolGateway
from controller.bmc.pool import BmcPool
from controller.core.errors import InvalidArgument
from controller.core.fleet import Fleet
from controller.core.ports import BmcGateway
from controller.core.preparation import PrepLimits
from controller.core.profiles import ProfileCatalog
from controller.events.publisher import MqttPublisher
from controller.placement import QueueConfig
from controller.policies import RuleSet, load_rules_file
from controller.store.active_lock import ActiveLock
from controller.store.engine import default_sqlite_url, migrate, open_engine
from controller.store.outbox import StoreOutbox
from controller.store.secrets import SecretBox
from controller.store.sql_store import SqlStore
from controller.tls import server_credentials
from kiln.v1 import agent_pb2, agent_pb2_grpc, fleet_pb2, fleet_pb2_grpc

log = logging.getLogger(__name__)

SERVICES = (
    fleet_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name,
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
)


@dataclass
class ControllerConfig:
    listen: str = "127.0.0.1:50051"
    db_url: str | None = None  # None: SQLite in state_dir
    state_dir: Path | None = None  # None: a temporary directory
    profiles_dir: Path | None = None
    queues: Sequence[QueueConfig] = ()
    reconcile_interval: float = 1.0
    prep_limits: PrepLimits = field(default_factory=PrepLimits)
    sample_interval: float = 5.0
    bmc_call_timeout: float = 10.0
    bmc_power_timeout: float = 120.0
    bmc_workers: int = 256
    profiles: ProfileCatalog | None = field(default=None, repr=False)
    rules: RuleSet | None = field(default=None, repr=False)  # None: rules_file or defaults
    rules_file: Path | None = None
    mqtt: str | None = None  # HOST:PORT of the MQTT broker events go to
    power_sync_interval: float = 60.0
    agent_silent_after: float = 15.0  # then the BMC's thermal sensors feed the policies
    bmc_thermal_interval: float = 10.0
    secret_key_file: Path | None = None  # None: secret.key in the state directory
    tls_cert: Path | None = None  # with tls_key: serve TLS instead of plaintext
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # require client certificates it signed (mTLS)


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
        self._active: ActiveLock | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self.lock_lost = asyncio.Event()
        self._publisher_task: asyncio.Task[None] | None = None

    def _state_dir(self) -> Path:
        if self.config.state_dir is not None:
            return self.config.state_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kiln-")
        return Path(self._tmp.name)

    def _db_url(self) -> str:
        return self.config.db_url or default_sqlite_url(self._state_dir())

    async def start(self) -> str:
        """Open the store, start the services and listen; returns HOST:PORT.

        Raises TlsConfigError (before opening anything) when the TLS options
        are incomplete or name unusable files.
        """
        cfg = self.config
        credentials = server_credentials(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
        profiles = cfg.profiles or ProfileCatalog.load(cfg.profiles_dir)
        engine = open_engine(self._db_url(), migrate_schema=False)
        self._active = ActiveLock(engine)
        await self._active.acquire(
            on_wait=lambda: log.warning(
                "another controller is active on this database; waiting as a standby"
            )
        )
        await asyncio.to_thread(migrate, engine)
        secrets = SecretBox.from_key_file(cfg.secret_key_file or self._state_dir() / "secret.key")
        self.store = SqlStore(engine, secrets=secrets)
        bmc = self._bmc or PoolGateway(
            BmcPool(max_workers=cfg.bmc_workers, call_timeout=cfg.bmc_call_timeout),
            power_timeout=cfg.bmc_power_timeout,
        )
        self._bmc = bmc
        rules = cfg.rules or (load_rules_file(cfg.rules_file) if cfg.rules_file else None)
        self.fleet = Fleet(
            self.store,
            bmc,
            profiles=profiles,
            queues=cfg.queues,
            reconcile_interval=cfg.reconcile_interval,
            sample_interval=cfg.sample_interval,
            rules=rules,
            power_sync_interval=cfg.power_sync_interval,
            prep_limits=cfg.prep_limits,
            agent_silent_after=cfg.agent_silent_after,
            bmc_thermal_interval=cfg.bmc_thermal_interval,
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
            )
            self.store.on_commit(self.publisher.notify)
            self._publisher_task = asyncio.create_task(self.publisher.run(), name="kiln-mqtt")
        server = grpc.aio.server()
        fleet_pb2_grpc.add_FleetServiceServicer_to_server(FleetService(self.fleet), server)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentService(self.fleet), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        host, _, port = cfg.listen.rpartition(":")
        if credentials is None:
            bound = server.add_insecure_port(cfg.listen)
        else:
            bound = server.add_secure_port(cfg.listen, credentials)
        if bound == 0:
            raise OSError(f"cannot listen on {cfg.listen}")
        await server.start()
        self._server = server
        self.address = f"{host or '127.0.0.1'}:{bound}"
        await self.fleet.start()
        self._watchdog = asyncio.create_task(self._watch_lock(), name="kiln-active-lock")
        for name in ("", *SERVICES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "controller listening on %s (%s)",
            self.address,
            "plaintext" if credentials is None else "mutual TLS" if cfg.tls_client_ca else "TLS",
        )
        return self.address

    async def _watch_lock(self, every: float = 5.0) -> None:
        """Stand down the moment the active-controller lock is lost, so two
        controllers never act on the same fleet at once."""
        assert self._active is not None
        while True:
            await asyncio.sleep(every)
            if not await asyncio.to_thread(self._active.still_held):
                log.error("lost the active-controller lock; stopping")
                self.lock_lost.set()
                return

    async def stop(self, grace: float = 2.0) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
            self._watchdog = None
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self.publisher is not None:
            await self.publisher.stop()
            self.publisher = None
        if self._publisher_task is not None:
            self._publisher_task.cancel()
            await asyncio.gather(self._publisher_task, return_exceptions=True)
            self._publisher_task = None
        if self.fleet is not None:
            await self.fleet.stop()
        if self._bmc is not None:
            await self._bmc.close()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._active is not None:
            self._active.release()
            self._active = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
