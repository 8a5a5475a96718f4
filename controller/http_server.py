"""The controller's HTTP port (``--http-listen HOST:PORT``): ``/metrics`` and
the fleet dashboard (``controller/dashboard/``).

Read-only and separate from the gRPC API, so that Prometheus can scrape it
without an API credential: it serves counts, states, names of nodes' racks
and timings, never a secret or a node's BMC address. Bind it to a
management network (or loopback) as you would a node exporter.
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from controller.dashboard.routes import Dashboard
from controller.metrics import ControllerMetrics

log = logging.getLogger(__name__)


class HttpServer:
    """An aiohttp site on the controller's event loop."""

    def __init__(self, metrics: ControllerMetrics, dashboard: Dashboard | None = None) -> None:
        self._metrics = metrics
        self._dashboard = dashboard
        self._runner: web.AppRunner | None = None
        self.address = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        if self._dashboard is not None:
            self._dashboard.install(app)
        return app

    async def _serve_metrics(self, _request: web.Request) -> web.Response:
        body = await self._metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, listen: str) -> str:
        """Listen on HOST:PORT (port 0: any free one); returns HOST:PORT.

        Raises OSError when the address cannot be bound.
        """
        host, _, port = listen.rpartition(":")
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host.strip("[]") or "127.0.0.1", int(port))
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        bound = runner.addresses[0]  # (host, port[, flow, scope]) of the socket
        self.address = f"{bound[0]}:{bound[1]}"
        log.info("dashboard on http://%s/ and metrics at /metrics", self.address)
        return self.address

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
