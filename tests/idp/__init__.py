"""The suite's OpenID provider: panva's oidc-provider (npm, OpenID certified) run by provider.mjs beside this
file, and a client that signs in through its login form the way a browser does.

    with TestProvider() as idp:
        tokens = idp.password_tokens("ada")            # code flow + PKCE as toolkeeper-console
        idp.set_redirects("toolkeeper-console", ["http://127.0.0.1:8123/auth/callback"])
        url = idp.follow_login(authorization_url, "ada")  # an authorization URL someone else built

Users: ada, grace, linus, bob, each with password "<name>-password" (see USERS). Static clients:
toolkeeper-console (code + refresh, secret CONSOLE_SECRET) and toolkeeper-agents (client_credentials and
token exchange, secret AGENTS_SECRET). Dynamic registration is open at the discovery's registration_endpoint.
Only the standard library here (and PyJWT, lazily, for decode()).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().with_name("provider.mjs")

CONSOLE = "toolkeeper-console"
CONSOLE_SECRET = "console-secret-0123456789abcdef"
AGENTS = "toolkeeper-agents"
AGENTS_SECRET = "agents-secret-0123456789abcdef"
SECRETS = {CONSOLE: CONSOLE_SECRET, AGENTS: AGENTS_SECRET}

# The console's redirect URI until someone sets others (nothing listens there: flows stop before it).
DEFAULT_REDIRECT = "http://127.0.0.1:9/callback"
DEFAULT_SCOPE = "openid profile email groups"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"

# The users as the provider starts (set_groups changes groups in the provider, not here).
USERS = {
    "ada": {"password": "ada-password", "name": "Ada Lovelace", "email": "ada@example.com",
            "groups": ["platform", "approvers"]},
    "grace": {"password": "grace-password", "name": "Grace Hopper", "email": "grace@example.com",
              "groups": ["auditors"]},
    "linus": {"password": "linus-password", "name": "Linus Torvalds", "email": "linus@example.com",
              "groups": ["approvers"]},
    "bob": {"password": "bob-password", "name": "Bob Nobody", "email": "bob@example.com", "groups": ["visitors"]},
}

_KNOWN = object()  # client_secret default: the static client's own secret, none for any other client


class OIDCError(Exception):
    """An OAuth error answer ({"error": ...}) or a flow that went wrong; .status is the HTTP status if any."""

    def __init__(self, error: str, description: str = "", status: int | None = None, body: Any = None):
        super().__init__(f"{error}: {description}" if description else error)
        self.error, self.description, self.status, self.body = error, description, status, body


class LoginRefused(OIDCError):
    """The login form came back after the password was sent: wrong login or password."""


@dataclasses.dataclass
class Authorization:
    """What an authorization-code flow ends with, and what redeeming the code needs."""

    code: str
    state: str
    code_verifier: str
    redirect_uri: str
    client_id: str
    nonce: str
    url: str  # the final redirect, as the browser was sent to it


class TestProvider:
    """oidc-provider in a Node process of its own, on a free port of 127.0.0.1."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, redirect_uris: list[str] | tuple[str, ...] = (DEFAULT_REDIRECT,), port: int = 0):
        self.redirect_uris = list(redirect_uris)
        self.port = port
        self.popen: subprocess.Popen | None = None
        self.ready: dict = {}
        self.issuer = ""

    # --- the process ---------------------------------------------------------------------------------
    def start(self, timeout: float = 30) -> TestProvider:
        node = shutil.which("node")
        if not node:
            raise RuntimeError("the OpenID provider needs Node.js (node on PATH)")
        if not (ROOT / ".npm/node_modules/oidc-provider").is_dir():
            raise RuntimeError("oidc-provider is not installed in .npm/: run scripts/test once")
        args = [node, str(SCRIPT), "--port", str(self.port)]
        for uri in self.redirect_uris:
            args += ["--redirect", uri]
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=ROOT,
                                      start_new_session=True)
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:  # until EOF: stdout keeps being drained after the ready line
            for line in self.popen.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self.ready:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                line = None
            if line is None:  # timed out, or the process ended
                said = self.stderr()
                self.stop()
                raise RuntimeError(f"the OpenID provider did not start within {timeout} s: {said}")
            with contextlib.suppress(ValueError):
                self.ready = json.loads(line)
        self.issuer = self.ready["issuer"]
        return self

    def stderr(self) -> str:
        self._log.seek(0)
        return self._log.read()

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self.popen.stdout.close()
        self._log.close()
        self.popen = None

    def __enter__(self) -> TestProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the provider's documents and the test control endpoints ------------------------------------
    def metadata(self) -> dict:
        """The discovery document."""
        return _json("GET", self.issuer + "/.well-known/openid-configuration")

    def jwks(self) -> dict:
        return _json("GET", self.issuer + "/jwks")

    def rotate_keys(self, drop_old: bool = False) -> str:
        """A new RS256 key signs from now on; the old one stays published unless drop_old. Its kid."""
        return _json("POST", self.issuer + "/test/rotate", {"drop_old": drop_old})["kid"]

    def set_groups(self, user: str, groups: list[str]) -> None:
        """The user's groups in every later ID token, access token, refresh and userinfo answer."""
        _json("POST", self.issuer + "/test/groups", {"user": user, "groups": list(groups)})

    def sign(self, claims: dict, alg: str = "RS256", header: dict | None = None, kid: str | None = None) -> str:
        """A compact JWS of exactly these claims, signed with the provider's current (or kid's) key."""
        body: dict[str, Any] = {"claims": claims, "alg": alg, "header": header or {}}
        if kid:
            body["kid"] = kid
        return _json("POST", self.issuer + "/test/sign", body)["token"]

    def set_redirects(self, client_id: str, uris: list[str]) -> None:
        """Sets a static client's redirect URIs (its post-logout URIs become them and their origins' /). The
        provider's own defaults stay: a session's provider serves every test of a worker, and the flows that use
        the default (password_tokens) must not fail because a console test came first."""
        kept = [*uris, *(uri for uri in self.redirect_uris if uri not in uris)]
        _json("POST", self.issuer + "/test/redirects", {"client_id": client_id, "redirect_uris": kept})

    # --- signing in, as a browser ----------------------------------------------------------------------
    def follow_login(self, authorization_url: str, user: str, password: str | None = None) -> str:
        """Opens an authorization URL, signs in with the login form (consent is granted by the provider)
        and returns the URL the provider finally redirects to, outside itself (code and state, or an
        error), without following it."""
        return Browser().sign_in(authorization_url, user, _password(user, password),
                                  lambda url: not url.startswith(self.issuer + "/"))

    def authorization_url(self, *, client_id: str = CONSOLE, redirect_uri: str | None = None,
                          scope: str = DEFAULT_SCOPE, resource: str | None = None,
                          extra: dict | None = None) -> tuple[str, Authorization]:
        """An authorization request with PKCE (S256), state and nonce: its URL, and what to redeem it with
        (code still empty)."""
        redirect_uri = redirect_uri or self.redirect_uris[0]
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        flow = Authorization(code="", state=secrets.token_urlsafe(16), code_verifier=verifier,
                             redirect_uri=redirect_uri, client_id=client_id, nonce=secrets.token_urlsafe(16), url="")
        params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "scope": scope,
                  "state": flow.state, "nonce": flow.nonce, "code_challenge": challenge,
                  "code_challenge_method": "S256", "resource": resource, **(extra or {})}
        if "openid" not in scope.split():  # a plain OAuth request: oidc-provider refuses a nonce there
            params["nonce"] = flow.nonce = ""
        params = {k: v for k, v in params.items() if v}
        return f"{self.metadata()['authorization_endpoint']}?{urllib.parse.urlencode(params)}", flow

    def login_code_flow(self, user: str, password: str | None = None, *, client_id: str = CONSOLE,
                        redirect_uri: str | None = None, scope: str = DEFAULT_SCOPE, resource: str | None = None,
                        extra: dict | None = None) -> Authorization:
        """Authorization code + PKCE up to the redirect to redirect_uri: the code and state, checked."""
        url, flow = self.authorization_url(client_id=client_id, redirect_uri=redirect_uri, scope=scope,
                                           resource=resource, extra=extra)
        final = Browser().sign_in(url, user, _password(user, password),
                                   lambda u: u.startswith(flow.redirect_uri) or not u.startswith(self.issuer + "/"))
        if not final.startswith(flow.redirect_uri):
            raise OIDCError("unexpected_redirect", final)
        answer = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(final).query))
        if "error" in answer:
            raise OIDCError(answer["error"], answer.get("error_description", ""), body=answer)
        if answer.get("state") != flow.state:
            raise OIDCError("state_mismatch", final)
        return dataclasses.replace(flow, code=answer["code"], url=final)

    # --- the token endpoint ----------------------------------------------------------------------------
    def token_request(self, params: dict, *, client_id: str, client_secret: Any = _KNOWN,
                      auth: str = "basic") -> dict:
        """POST /token with client authentication: "basic" (client_secret_basic), "post" (client_secret_post)
        or a public client's client_id alone when there is no secret. The JSON answer; OIDCError on error."""
        secret = SECRETS.get(client_id) if client_secret is _KNOWN else client_secret
        headers = {}
        body = {k: v for k, v in params.items() if v is not None}
        if secret is None:
            body["client_id"] = client_id
        elif auth == "post":
            body |= {"client_id": client_id, "client_secret": secret}
        else:
            pair = f"{urllib.parse.quote(client_id, safe='')}:{urllib.parse.quote(secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        return _json("POST", self.metadata()["token_endpoint"], form=body, headers=headers)

    def tokens(self, code: str | Authorization, *, code_verifier: str | None = None, redirect_uri: str | None = None,
               client_id: str | None = None, client_secret: Any = _KNOWN, resource: str | None = None,
               auth: str = "basic") -> dict:
        """Redeems a code (an Authorization from login_code_flow carries the rest): the token answer."""
        if isinstance(code, Authorization):
            code_verifier = code_verifier or code.code_verifier
            redirect_uri = redirect_uri or code.redirect_uri
            client_id = client_id or code.client_id
            code = code.code
        params = {"grant_type": "authorization_code", "code": code, "code_verifier": code_verifier,
                  "redirect_uri": redirect_uri or self.redirect_uris[0], "resource": resource}
        return self.token_request(params, client_id=client_id or CONSOLE, client_secret=client_secret, auth=auth)

    def password_tokens(self, user: str, password: str | None = None, *, client: str = CONSOLE,
                        client_secret: Any = _KNOWN, redirect_uri: str | None = None, scope: str = DEFAULT_SCOPE,
                        resource: str | None = None) -> dict:
        """Signs the user in and redeems the code: access_token, id_token, refresh_token..."""
        flow = self.login_code_flow(user, password, client_id=client, redirect_uri=redirect_uri, scope=scope,
                                    resource=resource)
        return self.tokens(flow, client_secret=client_secret)

    def refresh(self, refresh_token: str, *, client_id: str = CONSOLE, client_secret: Any = _KNOWN,
                scope: str | None = None, resource: str | None = None) -> dict:
        params = {"grant_type": "refresh_token", "refresh_token": refresh_token, "scope": scope, "resource": resource}
        return self.token_request(params, client_id=client_id, client_secret=client_secret)

    def client_credentials(self, *, client_id: str = AGENTS, client_secret: Any = _KNOWN,
                           resource: str | None = None, scope: str | None = None) -> dict:
        params = {"grant_type": "client_credentials", "resource": resource, "scope": scope}
        return self.token_request(params, client_id=client_id, client_secret=client_secret)

    def token_exchange(self, subject_token: str, *, resource: str | None = None, audience: str | None = None,
                       scope: str | None = None, subject_token_type: str = ACCESS_TOKEN_TYPE,
                       client_id: str = AGENTS, client_secret: Any = _KNOWN) -> dict:
        """RFC 8693: a token for resource/audience, with the client as actor (act.sub)."""
        params = {"grant_type": TOKEN_EXCHANGE, "subject_token": subject_token,
                  "subject_token_type": subject_token_type, "resource": resource, "audience": audience, "scope": scope}
        return self.token_request(params, client_id=client_id, client_secret=client_secret)

    # --- the rest ----------------------------------------------------------------------------------------
    def register_client(self, metadata: dict) -> dict:
        """Dynamic client registration (open): the registered client's metadata, client_id included."""
        return _json("POST", self.metadata()["registration_endpoint"], metadata)

    def userinfo(self, access_token: str) -> dict:
        return _json("GET", self.metadata()["userinfo_endpoint"], headers={"Authorization": f"Bearer {access_token}"})

    def decode(self, token: str, audience: str | list[str] | None = None, **options: Any) -> dict:
        """A JWT's claims, its signature checked with PyJWT against the provider's JWKS (and iss, exp, aud)."""
        import jwt

        key = jwt.PyJWKClient(self.issuer + "/jwks", cache_jwk_set=False).get_signing_key_from_jwt(token)
        return jwt.decode(token, key.key, algorithms=["RS256", "ES256"], issuer=self.issuer, audience=audience,
                          options={"verify_aud": audience is not None, **options})


def _password(user: str, password: str | None) -> str:
    return password if password is not None else USERS.get(user, {}).get("password", f"{user}-password")


def _json(method: str, url: str, body: dict | None = None, *, form: dict | None = None,
          headers: dict | None = None) -> dict:
    """A JSON request (or a form one); the JSON answer, or OIDCError with the OAuth error it carries."""
    headers = dict(headers or {})
    data = None
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    elif body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as failed:
        text = failed.read().decode(errors="replace")
        try:
            answer = json.loads(text)
        except ValueError:
            raise OIDCError("http_error", text[:500], failed.code, text) from None
        raise OIDCError(answer.get("error", "http_error"), answer.get("error_description", ""), failed.code,
                        answer) from None


class _Forms(HTMLParser):
    """The forms of a page: action, method, fields (hidden and named ones, with their values)."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict] = []
        self.errors: list[str] = []
        self._in_error = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append({"action": a.get("action", ""), "method": a.get("method", "get").lower(),
                               "fields": {}, "password": False})
        elif tag in ("input", "button", "select", "textarea") and self.forms and a.get("name"):
            form = self.forms[-1]
            if a.get("type") == "password":
                form["password"] = True
            if tag != "button":  # a button's value counts only when it is the one clicked
                form["fields"][a["name"]] = a.get("value", "")
        self._in_error = "error" in a.get("class", "") or a.get("id") == "error"

    def handle_data(self, data: str) -> None:
        if self._in_error and data.strip():
            self.errors.append(data.strip())


class Browser:
    """Cookies kept, redirects seen one by one, forms filled in: enough of a browser for the provider's pages.
    One Browser is one user agent: its provider session lasts as long as it does (sign in, then log out)."""

    def __init__(self) -> None:
        class Stay(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: object, **kwargs: object) -> None:
                return None  # the 3xx comes back as an HTTPError: we look at each Location ourselves

        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()), Stay())

    @staticmethod
    def forms(html: str) -> list[dict]:
        """A page's forms: {"action", "method", "fields" (named inputs and their values), "password"}."""
        page = _Forms()
        page.feed(html)
        return page.forms

    def open(self, url: str, form: dict | None = None) -> tuple[int, Any, str]:
        """GET url (POST form, when given), redirects not followed: status, headers, body."""
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            with self.opener.open(urllib.request.Request(url, data=data), timeout=30) as answer:
                return answer.status, answer.headers, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as answer:
            return answer.code, answer.headers, answer.read().decode(errors="replace")

    def sign_in(self, url: str, user: str, password: str, leaves: Any) -> str:
        """Follows the provider from url until a redirect for which leaves(location) is true: that location."""
        form: dict | None = None
        sent_password = False
        for _ in range(30):
            status, headers, body = self.open(url, form)
            if 300 <= status < 400:
                url, form = urllib.parse.urljoin(url, headers["Location"]), None
                if leaves(url):
                    return url
                continue
            page = _Forms()
            page.feed(body)
            if status != 200 or not page.forms:
                raise OIDCError("unexpected_page", f"{status} at {url}: {_text(body)[:500]}", status, body)
            chosen = next((f for f in page.forms if f["password"]), page.forms[0])
            if chosen["password"]:
                if sent_password:
                    raise LoginRefused("login_refused", " ".join(page.errors) or "the login form came back", status)
                chosen["fields"] |= {"login": user, "password": password}
                sent_password = True
            url = urllib.parse.urljoin(url, chosen["action"] or url)
            form = chosen["fields"]
            if chosen["method"] != "post":
                url, form = f"{url.split('?')[0]}?{urllib.parse.urlencode(form)}", None
        raise OIDCError("too_many_steps", f"still at {url}")


def _text(html: str) -> str:
    class Text(HTMLParser):
        parts: list[str] = []

        def handle_data(self, data: str) -> None:
            self.parts.append(data.strip())

    reader = Text()
    reader.parts = []
    reader.feed(html)
    return " ".join(p for p in reader.parts if p)
