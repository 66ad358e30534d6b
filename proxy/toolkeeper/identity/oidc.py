"""People signing in to the console through the company's OpenID provider: the client side of it.

The authorization-code flow with PKCE (S256), `state` and `nonce`, as OpenID
Connect Core and RFC 9700 (OAuth security best practice) ask of a confidential
web client: the authorization URL comes from discovery; the code is redeemed
at the token endpoint with the client's secret (HTTP Basic; a public client
sends its id alone); the ID token is checked by TokenChecker (signature from
the JWKS, algorithm allow-list, issuer, audience = the client id, expiry) and
its nonce against the one this sign-in sent. The person's groups (the
`groups_claim`, from the ID token, else userinfo) become toolkeeper's roles
through the operator's mapping; a person whose groups give none is refused,
told which groups would do. Refreshing re-reads the groups the same way, so a
person removed from a group loses its role within the refresh window.

No HTTP routes here: the console (wire/admin/console/oidc.py) calls these,
and keeps what a sign-in leaves in the store.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import orjson

from toolkeeper.identity.issuer import FETCH_TIMEOUT, MAX_DOCUMENT_BYTES, IdentityError, Issuer, IssuerUnavailable
from toolkeeper.identity.principal import groups_of
from toolkeeper.identity.tokens import DEFAULT_ALGORITHMS, TokenChecker, TokenRefused

ROLE_ORDER = ("admin", "approver", "auditor")  # the strongest first: a person's home page follows it
MAX_TEXT = 256  # a name, an email, a username: what a page and a record show, never a document


class SignInRefused(IdentityError):
    """The provider, or toolkeeper, refused this sign-in: the message says why, for the person."""


class NoRole(SignInRefused):
    """The person signed in, but none of their groups gives a toolkeeper role."""

    def __init__(self, person: Person, wanted: dict[str, tuple[str, ...]]):
        self.person = person
        self.wanted = wanted  # each role, and the groups that give it
        said = "; ".join(f"{role}: {', '.join(groups)}" for role, groups in wanted.items()) or "none is mapped"
        super().__init__(f"{person.name} is signed in at the identity provider, but none of their groups "
                         f"({', '.join(person.groups) or 'no groups'}) gives a role in toolkeeper. The groups that "
                         f"would: {said}.")


@dataclass(frozen=True)
class Person:
    """Someone signed in through the provider, as its ID token (or userinfo) says, with the roles it maps to."""

    subject: str
    issuer: str
    name: str
    email: str | None = None
    username: str | None = None  # preferred_username
    groups: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()

    @property
    def handle(self) -> str:
        """What records and notices name them by: the email, else the username, else the subject."""
        return self.email or self.username or self.subject

    def document(self) -> dict[str, Any]:
        """For the approval and the audit record: who answered, as the provider vouched for them."""
        return {"name": self.name, "subject": self.subject, "issuer": self.issuer, "email": self.email,
                "username": self.username, "groups": list(self.groups), "roles": list(self.roles)}

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> Person:
        return cls(subject=document["subject"], issuer=document["issuer"], name=document["name"],
                   email=document.get("email"), username=document.get("username"),
                   groups=tuple(document.get("groups") or ()), roles=tuple(document.get("roles") or ()))


@dataclass(frozen=True)
class SignIn:
    """One sign-in under way: what the callback must find again (kept server-side, never in the URL)."""

    state: str
    nonce: str
    verifier: str  # PKCE: only its S256 challenge went to the provider
    url: str = ""  # the provider's authorization URL to send the browser to


@dataclass(frozen=True)
class Grant:
    """What redeeming a code (or refreshing) gives: the person, and the tokens the session keeps sealed."""

    person: Person
    refresh_token: str | None
    id_token: str | None


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) and value else None


def _challenge(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class OidcClient:
    """toolkeeper as the provider's client for the console: one per serve, its issuer shared."""

    def __init__(self, issuer: Issuer, client_id: str, client_secret: str | None, *, redirect_uri: str,
                 signed_out_uri: str, roles: dict[str, set[str]],
                 scopes: tuple[str, ...] = ("openid", "profile", "email"), groups_claim: str = "groups",
                 refresh_every: float = 300.0,
                 algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS):
        self.issuer = issuer
        self.client_id = client_id
        self.client_secret = client_secret
        self.redirect_uri = redirect_uri
        self.signed_out_uri = signed_out_uri
        self.roles = roles
        self.scopes = scopes if "openid" in scopes else ("openid", *scopes)
        self.groups_claim = groups_claim
        self.refresh_every = refresh_every
        self.checker = TokenChecker(issuer, (client_id,), algorithms=algorithms)
        self._session: aiohttp.ClientSession | None = None

    @property
    def issuer_url(self) -> str:
        return self.issuer.url

    @property
    def provider(self) -> str:
        """The provider's name on the console's button: its issuer's host."""
        return urlsplit(self.issuer.url).netloc or self.issuer.url

    def roles_for(self, groups: tuple[str, ...]) -> tuple[str, ...]:
        given = set().union(*(self.roles.get(group, set()) for group in groups))
        return tuple(role for role in ROLE_ORDER if role in given)

    def groups_wanted(self) -> dict[str, tuple[str, ...]]:
        """Each role, and the groups that give it: what a person refused for want of a role is told."""
        return {role: tuple(sorted(group for group, roles in self.roles.items() if role in roles))
                for role in ROLE_ORDER if any(role in roles for roles in self.roles.values())}

    async def start(self) -> SignIn:
        """A new sign-in: fresh state, nonce and PKCE verifier, and the URL that asks the provider for a code."""
        endpoint = await self.issuer.endpoint("authorization_endpoint")
        sign_in = SignIn(state=secrets.token_urlsafe(32), nonce=secrets.token_urlsafe(32),
                         verifier=secrets.token_urlsafe(48))
        query = urlencode({"response_type": "code", "client_id": self.client_id, "redirect_uri": self.redirect_uri,
                           "scope": " ".join(self.scopes), "state": sign_in.state, "nonce": sign_in.nonce,
                           "code_challenge": _challenge(sign_in.verifier), "code_challenge_method": "S256"})
        separator = "&" if "?" in endpoint else "?"
        return SignIn(sign_in.state, sign_in.nonce, sign_in.verifier, f"{endpoint}{separator}{query}")

    async def redeem(self, code: str, sign_in: SignIn) -> Grant:
        """The code the callback brought, redeemed and checked: the person (NoRole when no group maps)."""
        answer = await self._token({"grant_type": "authorization_code", "code": code,
                                    "redirect_uri": self.redirect_uri, "code_verifier": sign_in.verifier})
        id_token = answer.get("id_token")
        if not isinstance(id_token, str):
            raise SignInRefused("the identity provider answered without an ID token (is `openid` among the scopes?)")
        claims = await self._id_claims(id_token, nonce=sign_in.nonce)
        person = await self._person(claims, answer.get("access_token"))
        if not person.roles:
            raise NoRole(person, self.groups_wanted())
        return Grant(person, _text_token(answer.get("refresh_token")), id_token)

    async def refresh(self, refresh_token: str, person: Person) -> Grant:
        """The person's groups read again with the refresh token: from a new ID token when the answer has one,
        else from userinfo. SignInRefused when the provider no longer honours the session."""
        answer = await self._token({"grant_type": "refresh_token", "refresh_token": refresh_token})
        id_token = answer.get("id_token") if isinstance(answer.get("id_token"), str) else None
        claims = await self._id_claims(id_token) if id_token else {"sub": person.subject, "iss": person.issuer}
        if claims.get("sub") != person.subject:
            raise SignInRefused("the identity provider's refreshed ID token names another person")
        renewed = await self._person(claims, answer.get("access_token"), known=person)
        return Grant(renewed, _text_token(answer.get("refresh_token")) or refresh_token, id_token)

    async def logout_url(self, id_token: str | None) -> str | None:
        """Where the browser ends its session at the provider (RP-initiated logout), when it has an
        end_session_endpoint; None when it has none (or cannot be asked now: toolkeeper's own session is over)."""
        try:
            endpoint = (await self.issuer.metadata()).get("end_session_endpoint")
        except IssuerUnavailable:
            return None
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            return None
        query = {"client_id": self.client_id, "post_logout_redirect_uri": self.signed_out_uri}
        if id_token:
            query["id_token_hint"] = id_token
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}"

    async def _id_claims(self, id_token: str, nonce: str | None = None) -> dict[str, Any]:
        claims = await self.checker.claims(id_token, nonce=nonce)
        audiences = claims.get("aud")
        if isinstance(audiences, list) and len(audiences) > 1 and claims.get("azp") != self.client_id:
            raise TokenRefused("the ID token names several audiences and another authorized party than toolkeeper")
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise TokenRefused("the ID token names no subject")
        return claims

    async def _person(self, claims: dict[str, Any], access_token: Any, known: Person | None = None) -> Person:
        """The person the claims describe, with the groups from userinfo when the ID token leaves them out (as
        some providers do). `known`: the person as first signed in, for the names a refresh's answer omits."""
        if self.groups_claim not in claims and isinstance(access_token, str):
            extra = await self._userinfo(access_token)
            if extra.get("sub") == claims["sub"]:  # userinfo about someone else is no answer (OIDC Core 5.3.2)
                claims = {**extra, **claims}
        groups = groups_of(claims.get(self.groups_claim))
        subject = claims["sub"][:MAX_TEXT]
        name = _text(claims.get("name")) or (known.name if known else None)
        email = _text(claims.get("email")) or (known.email if known else None)
        username = _text(claims.get("preferred_username")) or (known.username if known else None)
        return Person(subject=subject, issuer=self.issuer.url, name=name or username or email or subject,
                      email=email, username=username, groups=groups, roles=self.roles_for(groups))

    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT))
        return self._session

    async def _token(self, form: dict[str, str]) -> dict[str, Any]:
        """A token request with the client's authentication (client_secret_basic, or a public client's id)."""
        endpoint = await self.issuer.endpoint("token_endpoint")
        headers = {"Accept": "application/json"}
        if self.client_secret:
            pair = f"{quote(self.client_id, safe='')}:{quote(self.client_secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form = {**form, "client_id": self.client_id}
        status, answer = await self._exchange("POST", endpoint, headers, form)
        if status >= 500 or not isinstance(answer, dict):
            raise IssuerUnavailable(f"the identity provider's token endpoint answered {status}")
        if status != 200 or "error" in answer:
            error = str(answer.get("error") or status)[:80]
            described = str(answer.get("error_description") or "")[:200]
            raise SignInRefused(f"the identity provider refused: {error}" + (f" ({described})" if described else ""))
        return answer

    async def _userinfo(self, access_token: str) -> dict[str, Any]:
        try:
            endpoint = await self.issuer.endpoint("userinfo_endpoint")
        except IssuerUnavailable:
            return {}  # a provider without userinfo: the ID token is all there is
        status, answer = await self._exchange("GET", endpoint, {"Authorization": f"Bearer {access_token}",
                                                                "Accept": "application/json"}, None)
        if status >= 500:
            raise IssuerUnavailable(f"the identity provider's userinfo endpoint answered {status}")
        return answer if status == 200 and isinstance(answer, dict) else {}

    async def _exchange(self, method: str, url: str, headers: dict[str, str],
                        form: dict[str, str] | None) -> tuple[int, Any]:
        session = await self._client()
        try:
            async with session.request(method, url, headers=headers, data=form) as response:
                body = await response.content.read(MAX_DOCUMENT_BYTES + 1)
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise IssuerUnavailable(f"the identity provider at {self.issuer.url} did not answer "
                                    f"({type(exc).__name__})") from None
        try:
            return status, orjson.loads(body) if len(body) <= MAX_DOCUMENT_BYTES else None
        except orjson.JSONDecodeError:
            return status, None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _text_token(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= 16 * 1024 else None
