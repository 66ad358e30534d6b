"""The console: approvers answer calls and auditors read the trail, in a browser, on toolkeeper's own port.

    GET  /toolkeeper/                the place this person's role opens on
    GET  /toolkeeper/sign-in         sign in through the OpenID provider (oidc.py), or with a token: POST opens
                                     a browser session (../sessions.py), unless `auth.tokens: automation-only`
    POST /toolkeeper/sign-out        ends the session (a person's everywhere, and at the provider)
    /toolkeeper/oidc/...             the provider's way in and back: oidc.py
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
from toolkeeper.wire.admin.console.oidc import OidcPages, destination
from toolkeeper.wire.admin.console.queue import QueuePage, reopen_here
from toolkeeper.wire.admin.console.replay import ReplayPage
from toolkeeper.wire.admin.console.trail import TrailPages
from toolkeeper.wire.admin.guard import PREFIX, AdminGuard, same_origin, served_over_https
from toolkeeper.wire.admin.people import is_person_cookie
from toolkeeper.wire.admin.sessions import SESSION_COOKIE, SESSION_SECONDS

SCRIPT = resources.files(__package__).joinpath("console.js").read_text()


class Console:
    """The console's routes, for the admin sub-app."""

    def __init__(self, audit: SQLAudit, store: Store, guard: AdminGuard):
        self.guard = guard
        self.closing = asyncio.Event()
        # the charts' and the replay's paths before the trail's /audit/{id}
        self.parts = [ChartsPage(audit), ReplayPage(audit), TrailPages(audit)]
        if guard.console:
            self.parts.append(QueuePage(store, guard.identity, self.closing))
        self.oidc = OidcPages(guard) if guard.people is not None else None
        if self.oidc is not None:
            self.parts.append(self.oidc)

    def __call__(self, app: web.Application) -> None:
        self.guard.public.update({PREFIX + "/sign-in", PREFIX + "/console.js", PREFIX + "/sign-out"})
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
        if (reopened := reopen_here(request)) is not None:  # a channel's link, followed from a chat message
            return reopened
        return self._form(request, self._invitation, request.path_qs, 401)

    @property
    def _invitation(self) -> str:
        ways = ([f"through {self.oidc.provider}"] if self.oidc is not None else []) + (
            ["with your token"] if self.guard.sessions is not None else [])
        return f"Sign in {' or '.join(ways)}." if ways else "Signing in to the console is off."

    def _form(self, request: web.Request, message: str, goto: str, status: int) -> web.Response:
        form = f"<p class=refused>{show(message)}</p>" + (self.oidc.button(goto) if self.oidc is not None else "")
        if self.guard.sessions is not None:
            form += (f"<form method=post action='{link('/sign-in')}'>"
                     f"<input type=hidden name=next value='{show(goto)}'>"
                     "<label>token<input type=password name=token autofocus autocomplete=off size=40></label>"
                     "<button type=submit>Sign in</button></form>"
                     "<p><small>The admin token, or a named one from <code>toolkeeper tokens add NAME --role "
                     "approver|auditor</code>.</small></p>")
        return page(request, "Sign in", form, status=status)

    async def sign_in_form(self, request: web.Request) -> web.Response:
        return self._form(request, self._invitation, request.query.get("next", PREFIX + "/"), 200)

    async def sign_in(self, request: web.Request) -> web.Response:
        sessions = self.guard.sessions
        if sessions is None:  # `auth.tokens: automation-only`, or no admin token: tokens are for scripts
            return self._form(request, "Signing in with a token is off for people here (auth.tokens: "
                                       "automation-only): " + self._invitation, "", 403)
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
        response = web.HTTPSeeOther(destination(goto, (role,)))  # only here, never elsewhere
        response.set_cookie(SESSION_COOKIE, cookie, httponly=True, samesite="Strict", path=PREFIX,
                            secure=served_over_https(request), max_age=SESSION_SECONDS)
        raise response

    async def sign_out(self, request: web.Request) -> web.Response:
        """Ends the session: a person's in the store (every replica) and then at the provider, when it has an
        end_session_endpoint. Open to anyone (a session the provider cannot vouch for now can still end), so the
        form's CSRF key and this origin are checked here: no other site signs anyone out."""
        cookie = request.cookies.get(SESSION_COOKIE, "")
        given = str((await request.post()).get("csrf", ""))
        people, sessions = self.guard.people, self.guard.sessions
        person = people is not None and is_person_cookie(cookie)
        if person:
            holds = people.csrf_holds(cookie, given)
        else:
            holds = sessions is not None and sessions.csrf_holds(cookie, given)
        if not cookie or not same_origin(request) or not holds:
            return page(request, "Sign-out refused", "<p class=refused>Sign out with the console's own button: "
                                                     "this form's CSRF key is missing or stale.</p>", status=403)
        if not person:
            response = web.HTTPSeeOther(PREFIX + "/sign-in")
            response.del_cookie(SESSION_COOKIE, path=PREFIX)
            raise response
        provider_logout = await people.client.logout_url(await people.end(cookie))
        if provider_logout is None:
            response = web.HTTPSeeOther(PREFIX + "/oidc/signed-out")
            response.del_cookie(SESSION_COOKIE, path=PREFIX)
            raise response
        # A page that moves on to the provider by itself: the CSP's form-action would stop a redirect there.
        body = (f"<meta http-equiv=refresh content='0;url={show(provider_logout)}'><p>Signed out of toolkeeper; "
                f"now at <a id=provider-sign-out href='{show(provider_logout)}'>the identity provider</a>.</p>")
        response = page(request, "Signing out", body)
        response.del_cookie(SESSION_COOKIE, path=PREFIX)
        return response

    async def home(self, request: web.Request) -> web.Response:
        who = request.get("identity")
        raise web.HTTPSeeOther(destination("", who.roles if who else ()))

    async def script(self, request: web.Request) -> web.Response:
        return web.Response(text=SCRIPT, content_type="text/javascript", headers=SECURITY_HEADERS)
