"""Who may reach /toolkeeper/: the admin token or a named token (a bearer header), or a console session cookie
(a token's, or a person's signed in through the OpenID provider); then whether any of that holder's roles may
reach the path, and, for a session's change, its CSRF key and toolkeeper's own origin.

The admin API is on when the admin token is set or people sign in through the provider (`auth.oidc`); with
neither, every path under /toolkeeper/ answers 404. `auth.tokens: automation-only` keeps named tokens (and the
admin token) for scripts' bearer headers, and takes the console's token sign-in away from people.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from toolkeeper.audit import AuditError
from toolkeeper.common import printable
from toolkeeper.identity import ROLE_ORDER, IssuerUnavailable, OidcClient, Person
from toolkeeper.settings import TOKEN_VARIABLE
from toolkeeper.store import Store, StoreError
from toolkeeper.wire.admin.people import PersonSessions, is_person_cookie
from toolkeeper.wire.admin.sessions import SESSION_COOKIE, Sessions, same

PREFIX = "/toolkeeper"
# What every page toolkeeper serves carries (the console's layout adds its own script's permission)
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'", "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff"}
SAFE_METHODS = ("GET", "HEAD")

Refusal = Callable[[web.Request], Awaitable[web.StreamResponse | None]]  # None: the guard's own 401


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def refused(request: web.Request, message: str, *, status: int = 403, title: str = "Not for this role") -> web.Response:
    """A refusal: a page for a person's browser (it asks for HTML), JSON for a script."""
    if "text/html" not in request.headers.get("Accept", ""):
        return json_error(status, message)
    body = (f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title><h1>{html.escape(title)}</h1>"
            f"<p>{html.escape(printable(message))}</p><p><a href='{PREFIX}/'>back</a></p>")
    return web.Response(status=status, text=body, content_type="text/html", headers=PAGE_HEADERS)


# Who may reach what: a named token's role (`toolkeeper tokens add NAME --role ROLE`), the admin token's `admin`,
# and a person's roles (`auth.oidc.roles`), any one of which will do.
ROLES = {PREFIX + "/approvals": {"approver", "admin"}, PREFIX + "/queue": {"approver", "admin"},
         PREFIX + "/audit": {"auditor", "admin"}, PREFIX + "/mcp": {"admin"}}


@dataclass(frozen=True)
class Holder:
    """Who holds a request: a token's name and role, or a person signed in through the provider with theirs."""

    name: str
    roles: frozenset[str]
    person: Person | None = None
    master: bool = False  # the admin token: it may say whom it answers for (`--as`)

    @property
    def role(self) -> str:
        """The roles, as a person reads them: `approver and auditor`."""
        return " and ".join(role for role in ROLE_ORDER if role in self.roles) or "no role"

    def may(self, allowed: Collection[str]) -> bool:
        return not self.roles.isdisjoint(allowed)

    @property
    def approver(self) -> str:
        """What an answer records as its approver: a person's email (else username, else subject), a token's name."""
        return self.person.handle if self.person is not None else self.name

    @property
    def identity(self) -> dict | None:
        """A person's identity, as an answer records it beside the approver's name."""
        return self.person.document() if self.person is not None else None


def token_holder(pair: tuple[str, str]) -> Holder:
    return Holder(pair[0], frozenset({pair[1]}))


def person_holder(person: Person) -> Holder:
    return Holder(person.name, frozenset(person.roles), person)


MASTER = Holder("admin", frozenset({"admin"}), master=True)  # the admin token: `tokens add` never gives this name


class AdminGuard:
    """The one check of who calls: the admin token or a named token (a bearer header), or a console session
    cookie; then whether one of that holder's roles may reach the path, and, for a session's change, its CSRF key.
    `people`: the provider people sign in through; `tokens`: `automation-only` keeps tokens out of the console."""

    def __init__(self, token: str | None, store: Store | None = None, *, people: OidcClient | None = None,
                 tokens: str = "people"):
        self.token = token
        self.store = store
        self.tokens_for_people = tokens != "automation-only"
        self.sessions = Sessions(token, store) if token and self.tokens_for_people else None
        self.people = PersonSessions(people, store) if people is not None and store is not None else None
        self.public: set[str] = set()  # paths anyone may reach: the sign-in form, the provider's callback
        self.refusals: list[tuple[str, Refusal]] = []  # a page's own way of saying "sign in first"

    @property
    def on(self) -> bool:
        """Whether the admin API answers at all: someone can be let in."""
        return self.token is not None or self.people is not None

    @property
    def console(self) -> bool:
        """Whether a browser can hold a session: a person through the provider, or a token signed in."""
        return self.sessions is not None or self.people is not None

    def bearer(self, request: web.Request) -> bool:
        return bool(self.token) and same(given_token(request), self.token)  # type: ignore[arg-type]

    async def identity(self, request: web.Request) -> Holder | None:
        """Who calls, or None: the admin token's holder is MASTER (it may say who it answers for, as `--as`); a
        named token is its own name; a session is its token's, or its person's (their groups read again when the
        refresh window has passed: IssuerUnavailable when the provider must be asked and does not answer)."""
        if self.bearer(request):
            return MASTER
        given = given_token(request)
        if given:  # tokens are ASCII: anything else is no token, not a lookup
            found = await self.store.token_holder(given) if self.store is not None and given.isascii() else None
            return token_holder(found) if found else None
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and self.people is not None and is_person_cookie(cookie):
            request["session"] = cookie
            person = await self.people.person(cookie)
            if person is None:
                return None
            request["csrf"] = self.people.csrf(cookie)  # what the page's forms send back
            return person_holder(person)
        if cookie and self.sessions is not None:
            request["session"] = cookie
            holder = await self.sessions.holder(cookie)
            if holder is None:
                return None
            request["csrf"] = self.sessions.csrf(cookie)
            return MASTER if holder == (MASTER.name, MASTER.name) else token_holder(holder)
        return None

    def _csrf_holds(self, cookie: str, given: str) -> bool:
        if self.people is not None and is_person_cookie(cookie):
            return self.people.csrf_holds(cookie, given)
        return self.sessions is not None and self.sessions.csrf_holds(cookie, given)

    async def forged(self, request: web.Request) -> str | None:
        """Why a change a session cookie authenticates is refused: another site's origin, or no CSRF key."""
        if "session" not in request or request.method in SAFE_METHODS:
            return None
        if not same_origin(request):
            return f"a change from another origin ({printable(request.headers['Origin'])}) is refused"
        given = request.headers.get("X-CSRF-Token") or str((await request.post()).get("csrf", ""))
        if not self._csrf_holds(request["session"], given):
            return "the form's CSRF key is missing or stale: reload the page and try again"
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if not self.on:
            return json_error(404, f"the admin API is off: start toolkeeper with {TOKEN_VARIABLE} set, or with "
                                   "people signing in through an OpenID provider (auth.oidc)")
        try:
            who = None if request.path in self.public else await self.identity(request)
            if request.path in self.public or who is not None:
                allowed = next((roles for prefix, roles in ROLES.items() if request.path.startswith(prefix)), None)
                if who is not None and allowed is not None and not who.may(allowed):
                    return refused(request, f"{who.name} ({who.role}) may not reach {request.path}: it needs the "
                                            f"{' or '.join(sorted(allowed))} role")
                if who is not None and (forged := await self.forged(request)):
                    return json_error(403, forged)
                request["identity"] = who
                return await handler(request)
        except IssuerUnavailable as exc:
            provider = self.people.client.provider if self.people is not None else "the identity provider"
            return refused(request, f"Signing in through {provider} is unavailable: {exc}. Nothing is served on a "
                                    "session that cannot be checked; try again when the provider answers.",
                           status=503, title="The identity provider is unavailable")
        except StoreError as exc:
            return json_error(503, f"the store did not answer: {exc}")
        except AuditError as exc:
            return json_error(503, str(exc))
        for prefix, refuse in self.refusals:
            if request.path.startswith(prefix) and (answer := await refuse(request)) is not None:
                return answer
        return json_error(401, f"a valid token is required (Authorization: Bearer ${TOKEN_VARIABLE}, or a named "
                               "token from `toolkeeper tokens add`)")


def served_over_https(request: web.Request) -> bool:
    """HTTPS here, or at the TLS-terminating proxy in front (which says so): the cookie is then Secure."""
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def same_origin(request: web.Request) -> bool:
    """No Origin (not a browser's cross-origin request), or this host's own, over HTTPS at a proxy in front too."""
    origin = request.headers.get("Origin")
    return origin is None or urlsplit(origin).netloc == request.host


def given_token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header.startswith("Bearer ") else ""
