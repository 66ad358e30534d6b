"""The console: approvers answer calls and auditors read the trail, in a browser, on toolkeeper's own port.

    GET  /toolkeeper/                the place this person's role opens on
    GET  /toolkeeper/sign-in         sign in with a token; POST opens a browser session (../sessions.py)
    POST /toolkeeper/sign-out
    /toolkeeper/queue...             approvers: queue.py
    /toolkeeper/audit...             auditors: trail.py, charts.py and replay.py

Server-rendered HTML with one small script of toolkeeper's own (the live
queue and its clocks), no front-end build and nothing from a CDN. The admin
guard (../guard.py) decides who may open what; a page asked for without a
session answers with the sign-in form.
"""

from __future__ import annotations

import asyncio
from importlib import resources

from aiohttp import web

from toolkeeper.audit import SQLAudit
from toolkeeper.store import Store
from toolkeeper.wire.admin.console.charts import ChartsPage
from toolkeeper.wire.admin.console.layout import SECURITY_HEADERS, link, page, show
from toolkeeper.wire.admin.console.queue import QueuePage
from toolkeeper.wire.admin.console.replay import ReplayPage
from toolkeeper.wire.admin.console.trail import TrailPages
from toolkeeper.wire.admin.guard import PREFIX, AdminGuard, same_origin, served_over_https
from toolkeeper.wire.admin.sessions import SESSION_COOKIE, SESSION_SECONDS

HOME = {"approver": "/queue", "auditor": "/audit", "admin": "/queue"}
SCRIPT = resources.files(__package__).joinpath("console.js").read_text()


class Console:
    """The console's routes, for the admin sub-app."""

    def __init__(self, audit: SQLAudit, store: Store, guard: AdminGuard):
        self.guard = guard
        self.closing = asyncio.Event()
        # the charts' and the replay's paths before the trail's /audit/{id}
        self.parts = [ChartsPage(audit), ReplayPage(audit), TrailPages(audit)]
        if guard.sessions is not None:
            self.parts.append(QueuePage(store, guard.identity, self.closing))

    def __call__(self, app: web.Application) -> None:
        self.guard.public.update({PREFIX + "/sign-in", PREFIX + "/console.js"})
        self.guard.refusals.append((PREFIX, self.refused))
        app.router.add_get("/", self.home)
        app.router.add_get("/console.js", self.script)
        app.router.add_get("/sign-in", self.sign_in_form)
        app.router.add_post("/sign-in", self.sign_in)
        app.router.add_post("/sign-out", self.sign_out)
        for part in self.parts:
            part(app)

        async def closing(app: web.Application) -> None:
            self.closing.set()

        app.on_shutdown.append(closing)

    async def refused(self, request: web.Request) -> web.StreamResponse | None:
        """A page asked for without a session: the sign-in form (401); an API call gets JSON from the guard."""
        if request.method not in ("GET", "HEAD") or "text/html" not in request.headers.get("Accept", ""):
            return None
        return self._form(request, "Sign in with your token.", request.path_qs, 401)

    def _form(self, request: web.Request, message: str, goto: str, status: int) -> web.Response:
        form = (f"<p class=refused>{show(message)}</p><form method=post action='{link('/sign-in')}'>"
                f"<input type=hidden name=next value='{show(goto)}'>"
                "<label>token<input type=password name=token autofocus autocomplete=off size=40></label>"
                "<button type=submit>Sign in</button></form>"
                "<p><small>The admin token, or a named one from <code>toolkeeper tokens add NAME --role "
                "approver|auditor</code>.</small></p>")
        return page(request, "Sign in", form, status=status)

    async def sign_in_form(self, request: web.Request) -> web.Response:
        return self._form(request, "Sign in with your token.", request.query.get("next", PREFIX + "/"), 200)

    async def sign_in(self, request: web.Request) -> web.Response:
        sessions = self.guard.sessions
        assert sessions is not None  # the guard answers 404 for every path when no admin token is set
        address = request.remote or "?"
        wait = sessions.attempt(address)
        if wait:
            response = self._form(request, f"Too many failed sign-ins: try again in {int(wait) + 1} s.", "", 429)
            response.headers["Retry-After"] = str(int(wait) + 1)
            return response
        if not same_origin(request):  # no signing in from another site
            return self._form(request, "Sign in from this page, not from another site.", "", 403)
        form = await request.post()
        opened = await sessions.open(str(form.get("token", "")).strip())
        goto = str(form.get("next", ""))
        if opened is None:
            return self._form(request, "That token is not valid (or was revoked).", goto, 401)
        sessions.succeeded(address)
        cookie, (_, role) = opened
        if not goto.startswith(PREFIX + "/") or goto.startswith(PREFIX + "/sign-"):  # only here, never elsewhere
            goto = PREFIX + HOME.get(role, "/")
        response = web.HTTPSeeOther(goto)
        response.set_cookie(SESSION_COOKIE, cookie, httponly=True, samesite="Strict", path=PREFIX,
                            secure=served_over_https(request), max_age=SESSION_SECONDS)
        raise response

    async def sign_out(self, request: web.Request) -> web.Response:
        response = web.HTTPSeeOther(PREFIX + "/sign-in")
        response.del_cookie(SESSION_COOKIE, path=PREFIX)
        raise response

    async def home(self, request: web.Request) -> web.Response:
        who = request.get("identity")
        raise web.HTTPSeeOther(PREFIX + HOME.get(who[1] if who else "", "/sign-in"))

    async def script(self, request: web.Request) -> web.Response:
        return web.Response(text=SCRIPT, content_type="text/javascript", headers=SECURITY_HEADERS)
