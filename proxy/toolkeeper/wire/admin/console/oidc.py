"""Signing in through the company's OpenID provider: the console's three pages for it.

    GET /toolkeeper/oidc/login        a new sign-in: to the provider, with state, nonce and PKCE
    GET /toolkeeper/oidc/callback     the provider sends the person back here with a code
    GET /toolkeeper/oidc/signed-out   where the provider sends them after signing out there

Anyone may open these (they are how one signs in), and none of them changes
anything a signed-in person holds: a sign-in is kept in the store until its
callback comes back, in the browser that began it (a cookie of its own,
SameSite=Lax so that the provider's redirect carries it), and once only.
Each refusal is a page that says why: a `state` this toolkeeper never sent
(or sent and saw used), a code the provider will not redeem, a person whose
groups give no role (told which would), a provider that does not answer.

The session cookie is SameSite=Strict, so a browser arriving from the
provider's site would not send it on the redirect that follows: the callback
answers with a page that moves on by itself (a navigation of toolkeeper's own).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection

from aiohttp import web

from toolkeeper.common import printable
from toolkeeper.identity import ROLE_ORDER, IdentityError, IssuerUnavailable, NoRole
from toolkeeper.wire.admin.console.layout import link, page, show
from toolkeeper.wire.admin.guard import PREFIX, AdminGuard, served_over_https
from toolkeeper.wire.admin.people import PERSON_SECONDS, SIGN_IN_COOKIE, SIGN_IN_SECONDS
from toolkeeper.wire.admin.sessions import SESSION_COOKIE, Attempts

log = logging.getLogger("toolkeeper")

HOME = {"admin": "/queue", "approver": "/queue", "auditor": "/audit"}
PATHS = ("/oidc/login", "/oidc/callback", "/oidc/signed-out")
MAX_GOTO = 2048
# Sign-ins one address may begin in 5 minutes: each is a row in the store until its callback or its expiry, so a
# script opening /oidc/login in a loop is told to wait instead of filling the store.
MAX_BEGUN = 30
# An OAuth error code (RFC 6749 4.1.2.1) as a page may repeat it: anyone can make a callback URL, so no free text
ERROR_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def destination(goto: str, roles: Collection[str] = ()) -> str:
    """Where to go after signing in: a console page asked for, never a sign-in step or another site; else the
    home of the strongest of the roles."""
    if (goto.startswith(PREFIX + "/") and len(goto) <= MAX_GOTO
            and not goto.startswith((PREFIX + "/sign-", PREFIX + "/oidc/", PREFIX + "//"))):
        return goto
    return PREFIX + next((HOME[role] for role in ROLE_ORDER if role in roles), "/sign-in")


class OidcPages:
    """The sign-in routes of the provider people sign in through (the guard's `people`)."""

    def __init__(self, guard: AdminGuard):
        assert guard.people is not None
        self.guard = guard
        self.people = guard.people
        self.begun = Attempts(most=MAX_BEGUN)

    @property
    def provider(self) -> str:
        return self.people.client.provider

    def __call__(self, app: web.Application) -> None:
        self.guard.public.update(PREFIX + path for path in PATHS)
        app.router.add_get("/oidc/login", self.login)
        app.router.add_get("/oidc/callback", self.callback)
        app.router.add_get("/oidc/signed-out", self.signed_out)

    def button(self, goto: str) -> str:
        """The sign-in page's way in through the provider: a link, not a form, since the pages' CSP lets a form
        lead nowhere but here (`form-action 'self'`, which holds for the redirect that follows too)."""
        return (f"<p><a class=button id=oidc href='{link('/oidc/login', {'next': goto})}'>Sign in with "
                f"{show(self.provider)}</a></p>")

    def unavailable(self, request: web.Request, exc: IssuerUnavailable) -> web.Response:
        body = (f"<p class=refused>Signing in through {show(self.provider)} is unavailable: the identity provider "
                f"did not answer ({show(exc)}).</p><p>Nothing is let in that it cannot vouch for. Try again when it "
                f"answers.</p><p><a href='{link('/sign-in')}'>Back to the sign-in page</a></p>")
        return page(request, "The identity provider is unavailable", body, status=503)

    def refusal(self, request: web.Request, message: str, status: int = 400) -> web.Response:
        body = (f"<p class=refused>{show(message)}</p>"
                f"<p><a href='{link('/sign-in')}'>Back to the sign-in page</a></p>")
        return page(request, "Sign-in refused", body, status=status)

    async def login(self, request: web.Request) -> web.Response:
        wait = self.begun.attempt(request.remote or "?")
        if wait:
            return self.refusal(request, f"Too many sign-ins begun from this address: try again in {wait:.0f} s.",
                                429)
        try:
            provider_url, binding = await self.people.begin(destination(request.query.get("next", "")))
        except IssuerUnavailable as exc:
            log.warning("a sign-in could not begin: %s", printable(str(exc)))
            return self.unavailable(request, exc)
        response = web.HTTPSeeOther(provider_url)
        response.set_cookie(SIGN_IN_COOKIE, binding, httponly=True, samesite="Lax", path=PREFIX + "/oidc/",
                            secure=served_over_https(request), max_age=int(SIGN_IN_SECONDS))
        raise response

    async def callback(self, request: web.Request) -> web.Response:
        query = request.query
        state, code, binding = query.get("state", ""), query.get("code", ""), request.cookies.get(SIGN_IN_COOKIE, "")
        if "error" in query or not code:
            await self.people.abandon(state)  # its state is spent: no later callback may bring it
            error = query.get("error", "")
            error = error if ERROR_CODE.fullmatch(error) else "no code"
            log.info("a sign-in came back without a code: %s (%s)", printable(error),
                     printable(query.get("error_description", ""))[:300])
            return self.refusal(request, f"{self.provider} did not sign you in ({error}).", 401)
        try:
            cookie, person, goto = await self.people.finish(state, code, binding,
                                                            replacing=request.cookies.get(SESSION_COOKIE, ""))
        except IssuerUnavailable as exc:
            log.warning("a sign-in could not finish: %s", printable(str(exc)))
            return self.unavailable(request, exc)
        except NoRole as exc:
            log.info("%s was refused: no group maps to a role", printable(exc.person.handle))
            return self._no_role(request, exc)
        except IdentityError as exc:  # the state, the code or the ID token: each says which check failed
            log.info("a sign-in was refused: %s", printable(str(exc)))
            return self.refusal(request, f"The sign-in was refused: {exc}")
        goto = destination(goto, person.roles)
        who = f"{person.name}" + (f" ({person.email})" if person.email else "")
        body = (f"<meta http-equiv=refresh content='0;url={show(goto)}'>"
                f"<p>Signed in as {show(who)}: {show(' and '.join(person.roles))}.</p>"
                f"<p><a id=continue href='{show(goto)}'>Continue</a></p>")
        response = page(request, "Signed in", body)
        response.set_cookie(SESSION_COOKIE, cookie, httponly=True, samesite="Strict", path=PREFIX,
                            secure=served_over_https(request), max_age=PERSON_SECONDS)
        response.del_cookie(SIGN_IN_COOKIE, path=PREFIX + "/oidc/")
        return response

    def _no_role(self, request: web.Request, exc: NoRole) -> web.Response:
        person = exc.person
        wanted = "".join(f"<li>{show(role)}: {show(', '.join(groups))}</li>" for role, groups in exc.wanted.items())
        body = (f"<p class=refused>{show(person.name)} ({show(person.handle)}) signed in at {show(self.provider)}, "
                f"but none of their groups gives a role in toolkeeper.</p>"
                f"<p>Their groups: <span id=groups>{show(', '.join(person.groups) or 'none')}</span>.</p>"
                f"<p>The groups that would do:</p><ul id=wanted>{wanted}</ul>"
                "<p>Ask the identity provider's administrators to add you to one of them.</p>"
                f"<p><a href='{link('/sign-in')}'>Back to the sign-in page</a></p>")
        return page(request, "No role in toolkeeper", body, status=403)

    async def signed_out(self, request: web.Request) -> web.Response:
        body = (f"<p class=notice>You are signed out of toolkeeper and of {show(self.provider)}.</p>"
                f"{self.button(PREFIX + '/')}")
        return page(request, "Signed out", body)
