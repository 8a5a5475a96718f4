"""The dashboard's routes on the controller's HTTP port (read-only).

``/`` racks and trays, ``/nodes/NAME`` one node, ``/allocations`` the
queues, ``/events`` live events; ``/fragments/…`` the parts the page
script re-fetches, and ``/events/stream`` server-sent events. With
authentication on (as the API has it), every page wants an operator-side
token (viewer, operator, provisioner or admin): ``Authorization: Bearer``,
or the cookie ``/login`` sets from a pasted token. Nothing here changes the
fleet, and no page shows a secret or a BMC address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web

from controller.core.errors import KilnError, NotFound
from controller.core.fleet import Fleet
from controller.core.identity import OPERATOR_ROLES
from controller.core.model import EventInfo
from controller.dashboard import pages

log = logging.getLogger(__name__)

COOKIE = "kiln_token"
OPEN_PATHS = ("/login", "/static/", "/metrics")
RECENT_EVENTS = 50
STATIC_TYPES = {".css": "text/css", ".js": "text/javascript"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Dashboard:
    """The dashboard's handlers over one ``Fleet``."""

    def __init__(self, fleet: Fleet, *, auth: bool) -> None:
        self._fleet = fleet
        self._auth = auth

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self._authenticate)
        r = app.router
        r.add_get("/", self.racks)
        r.add_get("/nodes/{name}", self.node)
        r.add_get("/allocations", self.allocations)
        r.add_get("/events", self.events)
        r.add_get("/events/stream", self.stream)
        r.add_get("/fragments/racks", self.racks_fragment)
        r.add_get("/fragments/allocations", self.allocations_fragment)
        r.add_get("/login", self.login_form)
        r.add_post("/login", self.login)
        r.add_get("/static/{file}", self.static)

    # -- who may look ------------------------------------------------------------

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._auth or request.path.startswith(OPEN_PATHS):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        token = token or request.cookies.get(COOKIE, "")
        try:
            caller = await self._fleet.authenticate(token) if token else None
        except KilnError:
            caller = None
        if caller is None or caller.role not in OPERATOR_ROLES:
            if request.path.startswith("/fragments/") or request.path == "/events/stream":
                raise web.HTTPUnauthorized(text="sign in at /login")
            raise web.HTTPFound("/login")
        return await handler(request)

    async def login_form(self, _request: web.Request) -> web.Response:
        body = """<h1>Sign in</h1><form method="post" action="/login">
<label>Token <input type="password" name="token" autocomplete="off" required></label>
<button type="submit">Sign in</button></form>
<p>An operator's token (<code>kiln tokens create NAME --role viewer</code>).</p>"""
        return _html(pages.page("Sign in", body))

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        token = str(form.get("token", "")).strip()
        try:
            caller = await self._fleet.authenticate(token)
        except KilnError:
            caller = None
        if caller is None or caller.role not in OPERATOR_ROLES:
            body = '<h1>Sign in</h1><p class="error">That token is not an operator token.</p>'
            return _html(pages.page("Sign in", body), status=401)
        response = web.HTTPFound("/")
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
        raise response

    # -- pages -------------------------------------------------------------------

    async def racks(self, _request: web.Request) -> web.Response:
        body = f'<div data-fragment="racks">{await self._racks_body()}</div>'
        return _html(pages.page("Racks", body, refresh=("racks",)))

    async def _racks_body(self) -> str:
        nodes = await self._fleet.list_nodes()
        allocations = await self._fleet.list_allocations()
        return (
            pages.summary_fragment(nodes, allocations)
            + pages.racks_fragment(nodes)
            + "<h2>Open allocations</h2>"
            + pages.allocations_fragment(allocations)
        )

    async def racks_fragment(self, _request: web.Request) -> web.Response:
        return _html(await self._racks_body())

    async def allocations(self, _request: web.Request) -> web.Response:
        body = (
            "<h1>Allocations</h1>"
            f'<div data-fragment="allocations">{await self._allocations_body()}</div>'
        )
        return _html(pages.page("Allocations", body, refresh=("allocations",)))

    async def _allocations_body(self) -> str:
        return pages.allocations_fragment(await self._fleet.list_allocations())

    async def allocations_fragment(self, _request: web.Request) -> web.Response:
        return _html(await self._allocations_body())

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            node = await self._fleet.get_node(name)
        except NotFound:
            raise web.HTTPNotFound(text=f"no node {name[:64]!r}") from None
        events = await self._recent(node=name)
        history = self._fleet.live.history(name)
        return _html(pages.node_page(node, history, events))

    async def events(self, _request: web.Request) -> web.Response:
        body = "<h1>Events</h1>" + pages.events_fragment(await self._recent())
        return _html(pages.page("Events", body))

    async def _recent(self, *, node: str = "") -> list[EventInfo]:
        return await self._fleet.events.newest(RECENT_EVENTS, node=node)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events, from now on: one ``data:`` line per event."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        latest = await self._fleet.latest_event_seq()
        with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
            async for e in self._fleet.watch_events(latest, follow=True):
                data = {
                    "seq": e.seq,
                    "at": e.at,
                    "kind": e.kind,
                    "node": e.node,
                    "allocation": e.allocation,
                    "reason": e.reason,
                }
                await response.write(f"data: {json.dumps(data)}\n\n".encode())
        return response

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["file"]
        suffix = name[name.rfind(".") :] if "." in name else ""
        if "/" in name or suffix not in STATIC_TYPES:
            raise web.HTTPNotFound()
        try:
            text = resources.files("controller.dashboard").joinpath("static", name).read_text()
        except FileNotFoundError:
            raise web.HTTPNotFound() from None
        return web.Response(text=text, content_type=STATIC_TYPES[suffix])


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, content_type="text/html", status=status)
