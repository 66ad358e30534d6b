"""Identity, attacked: what an agent, a user or a peer could try against JWT agents, the identity header and /mcp.

Each test is a real `toolkeeper serve` (or, for the key cache, the real `Issuer` against a real HTTP server) and a
real OpenID provider (tests/idp), or an issuer of the test's own where a token must carry what the provider will not
sign (`crit`) or its keys must be garbage. Those marked xfail are problems found and not fixed here: each says what.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import http.client
import http.server
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import jwt
import pytest
from conftest import YOLO, Process, Scripted, audit_cli, call, free_port, recording_tool, write_agent
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from toolkeeper.identity import Issuer, IssuerUnavailable
from toolkeeper.wire.intercept.routing import sign as sign_upstream

AUDIENCE = "http://127.0.0.1/toolkeeper-agents"
KEY = "red-team-desk-key-0123456789"  # the listed agent `desk`
HEADER = "X-Forwarded-User"
INTERCEPT_SECRET = "red-team-intercept-secret-0123456789"
AGENT = YOLO.replace("    tools:\n", '    agents:\n      - {name: desk, key_sha256: "{key}"}\n    tools:\n') \
    + recording_tool("release", "version", "Publish a release.", "The version.") \
    + recording_tool("lookup", "word", "Look a word up.", "The word.")
RULES = """
rules:
  - id: engineering-releases
    effect: deny
    reason: Only engineering releases.
    when: {tool: release, principal: {claims: {department: {not_equals: engineering}}}}
  - id: ada-looks-up
    effect: deny
    reason: Only ada looks words up.
    when: {tool: lookup, principal: {user: {not_equals: ada}}}
"""
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Red:
    """The module's serve: JWT agents and /mcp's OAuth from the provider, the listed key `desk`, the identity header
    believed from loopback (the default), at DEBUG."""

    def __init__(self, process: Process, scripted: Scripted, directory, provider):
        self.process, self.scripted, self.directory, self.provider = process, scripted, directory, provider
        self.root = process.url[: -len("/v1")]
        self.resource = self.root + "/mcp"

    def token(self, user: str = "ada", **claims) -> str:
        now = int(time.time())
        body = {"iss": self.provider.issuer, "aud": AUDIENCE, "sub": user, "client_id": "red-agent",
                "groups": ["platform"], "iat": now, "exp": now + 600, **claims}
        return self.provider.sign({k: v for k, v in body.items() if v is not None})

    def trail(self, *args: str) -> list[dict]:
        run = audit_cli(self.directory / "toolkeeper-audit.sqlite3", "export", *args)
        return [json.loads(line) for line in run.stdout.splitlines()]


def serve(directory, upstream: str, issuer: str, *extra: str, env: dict | None = None) -> Process:
    write_agent(directory, AGENT, key=hashlib.sha256(KEY.encode()).hexdigest())
    (directory / "rules.yaml").write_text(RULES)
    return Process([sys.executable, "-m", "toolkeeper", "serve", str(directory / "agent.yaml"), "--upstream", upstream,
                    "--policy", str(directory / "rules.yaml"), "--log-level", "DEBUG", "--identity-header", HEADER,
                    "--auth-agents-jwt-issuer", issuer, "--auth-agents-jwt-audience", AUDIENCE,
                    "--auth-agents-jwt-claims", "department", *extra],
                   "toolkeeper listening on", env={"TOOLKEEPER_PORT": str(free_port()), **(env or {})}, cwd=directory)


@pytest.fixture(scope="module")
def red(scripted, oidc_provider, tmp_path_factory):
    directory = tmp_path_factory.mktemp("red")
    process = serve(directory, scripted.base_url, oidc_provider.issuer, "--auth-mcp-issuer", oidc_provider.issuer)
    yield Red(process, scripted, directory, oidc_provider)
    said = process.stop()
    assert "Traceback" not in said, said


def send(method: str, url: str, body=None, headers: dict | list | None = None) -> tuple[int, dict, str]:
    """One request, headers as a dict or as (name, value) pairs (a name may repeat): status, headers, body."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    data = json.dumps(body).encode() if body is not None else None
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    connection.putrequest(method, parts.path + (f"?{parts.query}" if parts.query else ""))
    for name, value in [("Content-Type", "application/json"), ("Content-Length", str(len(data or b""))), *pairs]:
        connection.putheader(name, value)
    connection.endheaders(data)
    answer = connection.getresponse()
    text = answer.read().decode(errors="replace")
    connection.close()
    return answer.status, dict(answer.getheaders()), text


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


# -- a JWT agent's token is toolkeeper's to check, never the model server's to see ---------------------------------


def test_a_jwt_agents_token_never_reaches_the_model_server(red):
    """Without `api_key_env` the agent's key went on to the model server as it came: a JWT agent's token too, so
    the model server (a third party) held a live token it could replay at toolkeeper as the user."""
    token = red.token()
    red.scripted.script({"content": "chat"}, {"content": "streamed"}, {"content": "responses"}, {"content": "messages"})
    assert send("POST", red.root + "/v1/chat/completions", CHAT, bearer(token))[0] == 200
    status, _, streamed = send("POST", red.root + "/v1/chat/completions", {**CHAT, "stream": True}, bearer(token))
    assert status == 200 and streamed.rstrip().endswith("data: [DONE]")
    assert send("POST", red.root + "/v1/responses", {"model": "m", "input": "hi"}, bearer(token))[0] == 200
    anthropic = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    assert send("POST", red.root + "/v1/messages", anthropic, {"x-api-key": token})[0] == 200
    status, headers, _ = send("GET", red.root + "/v1/models", None, bearer(token))  # the catch-all passthrough
    assert status == 200 and headers.get("X-Seen-Authorization", "") == ""
    seen = json.dumps([entry["headers"] for entry in red.scripted.requests()])
    assert len(red.scripted.requests()) >= 4 and token.split(".")[2] not in seen
    # a key of the model server's own, beside the token, still goes on: only the token is held back
    red.scripted.script({"content": "messages"})
    both = {"Authorization": f"Bearer {token}", "x-api-key": "sk-ant-the-agents-own"}
    assert send("POST", red.root + "/v1/messages", anthropic, both)[0] == 200
    (sent,) = [entry["headers"] for entry in red.scripted.requests()]
    assert sent.get("x-api-key") == "sk-ant-the-agents-own" and token not in json.dumps(sent)


# -- the agent's name: a token cannot pass for a listed agent -------------------------------------------------------


@pytest.mark.parametrize("claims", [{"client_id": "desk"}, {"client_id": None, "sub": "desk"}])
def test_a_token_cannot_take_a_listed_agents_name(red, claims):
    """`agent.id` and `principal.agent` say `desk` for the holder of desk's key; a client the provider let take that
    name (by its client_id, or by a user's sub when the token names no client) is refused."""
    token = red.token(**claims)
    red.scripted.script({"content": "never"})
    status, _, body = send("POST", red.root + "/v1/chat/completions", CHAT, bearer(token))
    assert status == 401 and "cannot pass for a listed agent" in body
    now = int(time.time())
    access = red.provider.sign({"iss": red.provider.issuer, "aud": red.resource, "sub": claims.get("sub", "ada"),
                                "iat": now, "exp": now + 600, **({"client_id": claims["client_id"]}
                                                                  if claims.get("client_id") else {})},
                               header={"typ": "at+jwt"})
    status, headers, _ = send("POST", red.resource, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                              {**bearer(access), "Accept": "application/json, text/event-stream"})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    assert "cannot pass for a listed agent" in headers["WWW-Authenticate"]


# -- the identity header --------------------------------------------------------------------------------------------


def test_the_identity_header_sent_twice_is_refused(red):
    """A front proxy that appends its header (rather than replacing the client's) leaves the client's value first,
    which is the one read: two values are refused, whoever sends them."""
    twice = [("Authorization", f"Bearer {KEY}"), (HEADER, "ada"), (HEADER, "mallory")]
    status, _, body = send("POST", red.root + "/v1/chat/completions", CHAT, twice)
    assert status == 403 and "sent 2 times" in body
    status, _, body = send("POST", red.resource, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, twice)
    assert status == 403 and "sent 2 times" in body


def test_an_intercepted_request_carries_no_identity_header_from_an_untrusted_peer(scripted, oidc_provider, tmp_path):
    """An intercepted request skipped every agent check (it has its own key), and with it the identity header's:
    from a peer the operator does not trust, `agent.header` and the record's header said what that peer chose."""
    process = serve(tmp_path, scripted.base_url, oidc_provider.issuer, "--trusted-proxy", "10.0.0.0/8",
                    env={"TOOLKEEPER_INTERCEPT_SECRET": INTERCEPT_SECRET,
                         "TOOLKEEPER_INTERCEPT_UPSTREAMS": scripted.root})
    try:
        scripted.script({"tool_calls": [call("release", {"version": "1.0"})]}, {"content": "done"})
        routed = sign_upstream(INTERCEPT_SECRET, scripted.base_url, time.time())
        status, _, body = send("POST", process.url + "/chat/completions", CHAT, {
            "Authorization": "Bearer sk-the-agents-own", "X-Toolkeeper-Upstream": routed, HEADER: "mallory"})
        assert status == 403 and "only believed from a trusted proxy" in body
        run = audit_cli(tmp_path / "toolkeeper-audit.sqlite3", "export")
        assert "mallory" not in run.stdout
        assert scripted.requests() == []  # nothing went on
    finally:
        said = process.stop()
    assert "Traceback" not in said



def mcp_session(url: str, token: str) -> dict:
    """An initialised MCP session at `url` for `token`: the headers its later requests carry."""
    headers = {**bearer(token), "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "red", "version": "1"}}}
    status, answered, body = send("POST", url, initialize, headers)
    assert status == 200, body
    headers["Mcp-Session-Id"] = {name.lower(): value for name, value in answered.items()}["mcp-session-id"]
    assert send("POST", url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)[0] == 202
    return headers


def test_a_jwt_agents_mcp_session_answers_only_to_its_user(scripted, oidc_provider, tmp_path):
    """/mcp without OAuth takes the agents' JWTs through the guard: the session is bound to the user the token names
    (not to the token, which the client refreshes), and the token goes no further than the check."""
    process = serve(tmp_path, scripted.base_url, oidc_provider.issuer)
    url = process.url[: -len("/v1")] + "/mcp"
    now = int(time.time())

    def token(user: str) -> str:
        return oidc_provider.sign({"iss": oidc_provider.issuer, "aud": AUDIENCE, "sub": user, "client_id": "red-agent",
                                   "iat": now, "exp": now + 600, "jti": f"{user}-{time.monotonic()}"})

    try:
        ada = mcp_session(url, token("ada"))
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert send("POST", url, listing, {**ada, **bearer(token("ada"))})[0] == 200  # ada, a refreshed token
        for who, credential in (("bob", token("bob")), ("desk's key", KEY)):
            assert send("POST", url, listing, {**ada, **bearer(credential)})[0] == 404, who
        assert send("DELETE", url, None, {**ada, **bearer(token("bob"))})[0] == 404
        assert send("POST", url, listing, ada)[0] == 200  # still ada's
    finally:
        said = process.stop()
    assert "Traceback" not in said and "eyJ" not in said

# -- whose is what: the hooks door's pairs, the Responses API's stored responses -----------------------------------


def hook_event(phase: str, **extra) -> dict:
    return {"agent": "claude-code", "event": {"hook_event_name": phase, "tool_name": "Bash", "session_id": "ada-session",
                                              "tool_input": {"command": "ls"}, "tool_use_id": "toolu_ada_1",
                                              "cwd": "/tmp", **extra}}


def test_another_user_of_the_same_client_cannot_complete_a_users_hook_call(red):
    """The hooks door paired a call's pre and post events by agent, session and call id: a JWT names the agent by
    its client, which every user of that client shares, so bob could write what ada's call returned."""
    ada, bob = red.token("ada", client_id="claude-hooks"), red.token("bob", client_id="claude-hooks")
    status, _, body = send("POST", red.root + "/toolkeeper/hooks", hook_event("PreToolUse"), bearer(ada))
    assert status == 200, body
    forged = hook_event("PostToolUse", tool_response={"stdout": "forged by bob"})
    status, _, body = send("POST", red.root + "/toolkeeper/hooks", forged, bearer(bob))
    assert status == 200 and json.loads(body)["reason"] == "no call waited"
    real = hook_event("PostToolUse", tool_response={"stdout": "what ls printed"})
    assert json.loads(send("POST", red.root + "/toolkeeper/hooks", real, bearer(ada))[2])["reason"] == "recorded"
    (record,) = [entry for entry in red.trail("--user", "ada") if entry["tool"] == "Bash"]
    assert "forged" not in json.dumps(record) and "what ls printed" in record["answer"]


def test_another_user_cannot_read_or_continue_a_users_stored_response(red):
    """A JWT user's token is held back from the model server, which so takes every user for one client: whose a
    stored response is, toolkeeper says (wire/apis/responses/owners.py)."""
    ada, bob = red.token("ada"), red.token("bob")
    red.scripted.script({"tool_calls": [call("lookup", {"word": "adas-private-word"})]}, {"content": "for ada"})
    status, _, body = send("POST", red.root + "/v1/responses", {"model": "m", "input": "ada asks"}, bearer(ada))
    assert status == 200, body
    response_id = json.loads(body)["id"]
    status, _, body = send("GET", red.root + f"/v1/responses/{response_id}", None, bearer(bob))
    assert status == 404 and "adas-private-word" not in body
    red.scripted.script({"content": "for bob"})
    send("POST", red.root + "/v1/responses", {"model": "m", "input": "bob asks", "previous_response_id": response_id},
         bearer(bob))
    assert all(entry["body"].get("previous_response_id") != response_id for entry in red.scripted.requests())


# -- rules on who the call is for: what is absent ------------------------------------------------------------------


def decided(red) -> dict[str, str]:
    return {entry["arguments"].get("version") or entry["arguments"].get("word"): entry["status"]
            for entry in red.trail() if entry["tool"] in ("release", "lookup")}


def test_a_deny_on_a_listed_claim_a_token_lacks_fails_closed(red):
    """A listed claim the token lacks is there as null: `not_equals: engineering` holds, the release is denied."""
    red.scripted.script({"tool_calls": [call("release", {"version": "no-department"})]}, {"content": "done"})
    send("POST", red.root + "/v1/chat/completions", CHAT, bearer(red.token("ada")))
    red.scripted.script({"tool_calls": [call("release", {"version": "engineering"})]}, {"content": "done"})
    send("POST", red.root + "/v1/chat/completions", CHAT, bearer(red.token("ada", department="engineering")))
    assert decided(red)["no-department"] == "denied" and decided(red)["engineering"] == "ok"


def test_a_deny_on_a_user_or_claim_the_call_lacks_fails_closed(red):
    red.scripted.script({"tool_calls": [call("lookup", {"word": "no-user"})]}, {"content": "done"})
    send("POST", red.root + "/v1/chat/completions", CHAT, bearer(KEY))  # desk's key: a call for no user
    red.scripted.script({"tool_calls": [call("release", {"version": "header-user"})]}, {"content": "done"})
    send("POST", red.root + "/v1/chat/completions", CHAT, {**bearer(KEY), HEADER: "bob"})
    assert decided(red)["no-user"] == "denied" and decided(red)["header-user"] == "denied", decided(red)


# -- tokens: what must not pass, and what may ---------------------------------------------------------------------


def encoded(part: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()


def signed_with(private: rsa.RSAPrivateKey, header: dict, claims: dict) -> str:
    """A JWS with exactly this header, signed RS256 by `private` (PyJWT will not write some of these headers)."""
    signing = f"{encoded(header)}.{encoded(claims)}".encode()
    signature = private.sign(signing, padding.PKCS1v15(), hashes.SHA256())
    return f"{signing.decode()}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


def hmac_with_public_key(red) -> str:
    """HS256 whose secret is the provider's public key, as a verifier that trusts `alg` would take it."""
    key = next(k for k in red.provider.jwks()["keys"] if k["kty"] == "RSA")
    secret = jwt.PyJWK(key).key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    now = int(time.time())
    signing = f"{encoded({'alg': 'HS256', 'typ': 'JWT'})}.{encoded(red_claims(red, now))}".encode()
    mac = base64.urlsafe_b64encode(hmac.new(secret, signing, hashlib.sha256).digest()).rstrip(b"=").decode()
    return f"{signing.decode()}.{mac}"


def red_claims(red, now: int, **changes) -> dict:
    return {"iss": red.provider.issuer, "aud": AUDIENCE, "sub": "ada", "client_id": "red-agent", "iat": now,
            "exp": now + 600, **changes}


def attacks(red) -> dict[str, str]:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(stranger.public_key()))
    now = int(time.time())
    kids = {k["kty"]: k["kid"] for k in red.provider.jwks()["keys"]}
    claims = red_claims(red, now)
    return {
        "jku to the attacker's keys": signed_with(stranger, {"alg": "RS256", "kid": kids["RSA"],
                                                             "jku": "http://127.0.0.1:9/k"}, claims),
        "the attacker's key embedded (jwk)": signed_with(stranger, {"alg": "RS256", "jwk": public}, claims),
        "x5u": signed_with(stranger, {"alg": "RS256", "kid": kids["RSA"], "x5u": "http://127.0.0.1:9/c"}, claims),
        "alg in lower case": signed_with(stranger, {"alg": "rs256", "kid": kids["RSA"]}, claims),
        "HS256 keyed with the public key": hmac_with_public_key(red),
        "RS256 under the EC key's kid": signed_with(stranger, {"alg": "RS256", "kid": kids["EC"]}, claims),
        "a kid with a path": signed_with(stranger, {"alg": "RS256", "kid": f"../{kids['RSA']}"}, claims),
        "no exp": red.provider.sign({k: v for k, v in claims.items() if k != "exp"}),
        "nbf an hour ahead": red.provider.sign(red_claims(red, now, nbf=now + 3600)),
        "iat an hour ahead": red.provider.sign(red_claims(red, now, iat=now + 3600)),
        "iss with a trailing slash": red.provider.sign(red_claims(red, now, iss=red.provider.issuer + "/")),
        "made for /mcp": red.provider.sign(red_claims(red, now, aud=red.resource)),
        "the payload changed after signing": ".".join([(good := red.provider.sign(claims)).split(".")[0],
                                                        encoded({**claims, "sub": "root"}), good.split(".")[2]]),
    }


def test_tokens_that_must_not_pass(red):
    for why, token in attacks(red).items():
        red.scripted.script({"content": "never"})
        status, _, body = send("POST", red.root + "/v1/chat/completions", CHAT, bearer(token))
        assert status == 401, (why, body)
        assert red.scripted.requests() == [], why


def test_what_may_pass_and_which_door_takes_which_audience(red):
    now = int(time.time())
    red.scripted.script({"content": "one of its audiences"})
    token = red.provider.sign(red_claims(red, now, aud=["http://127.0.0.1/elsewhere", AUDIENCE]))
    assert send("POST", red.root + "/v1/chat/completions", CHAT, bearer(token))[0] == 200
    # the agents' token at /mcp (another audience there): a 401 with the challenge, never a session
    status, headers, _ = send("POST", red.resource, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                              {**bearer(red.token()), "Accept": "application/json, text/event-stream"})
    assert status == 401 and "another audience" in headers["WWW-Authenticate"]


# -- an issuer of the test's own: headers the provider will not sign, keys that are garbage, a provider that hangs --


class OwnIssuer:
    """Discovery and /jwks on a real HTTP server; `keys_body`, `hang` and `named` say what it answers."""

    def __init__(self) -> None:
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key()))
        self.keys_body: bytes = json.dumps({"keys": [{**jwk, "kid": "own-1", "alg": "RS256", "use": "sig"}]}).encode()
        self.hang = 0.0
        self.fetches = 0
        self.named: str | None = None  # the issuer its discovery document names (None: its own)
        outer = self

        class Answer(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/jwks":
                    outer.fetches += 1
                    time.sleep(outer.hang)
                    body = outer.keys_body
                else:
                    body = json.dumps({"issuer": outer.named or outer.url, "jwks_uri": outer.url + "/jwks"}).encode()
                with contextlib.suppress(OSError):  # toolkeeper gave up waiting: the answer has no one to go to
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, header: dict | None = None, **changes) -> str:
        now = int(time.time())
        claims = {"iss": self.url, "aud": AUDIENCE, "sub": "ada", "client_id": "own-agent", "iat": now,
                  "exp": now + 600, **changes}
        return signed_with(self.private, {"alg": "RS256", "kid": "own-1", **(header or {})}, claims)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def own_issuer():
    issuer = OwnIssuer()
    yield issuer
    issuer.close()


def test_critical_header_extensions_are_refused(scripted, own_issuer, tmp_path):
    """RFC 7515: a `crit` the verifier does not process makes the token invalid (PyJWT before 2.12 ignored it)."""
    process = serve(tmp_path, scripted.base_url, own_issuer.url)
    try:
        scripted.script({"content": "good"})
        assert send("POST", process.url + "/chat/completions", CHAT, bearer(own_issuer.token()))[0] == 200
        for header in ({"crit": ["exp-policy"], "exp-policy": "lax"}, {"crit": ["b64"], "b64": False}):
            status, _, body = send("POST", process.url + "/chat/completions", CHAT, bearer(own_issuer.token(header)))
            assert status == 401, (header, body)
    finally:
        process.stop()


@pytest.mark.parametrize("answer", ["not json", "huge", "no keys list", "another issuer"])
def test_an_issuer_answering_garbage_fails_closed(scripted, own_issuer, tmp_path, answer):
    if answer == "another issuer":
        own_issuer.named = "http://127.0.0.1:9"
    else:
        own_issuer.keys_body = {"not json": b"<html>oops</html>", "huge": b'{"keys": [' + b" " * (2 << 20) + b"]}",
                                "no keys list": b'{"keys": "none"}'}[answer]
    process = serve(tmp_path, scripted.base_url, own_issuer.url)
    try:
        scripted.script({"content": "never"})
        status, _, body = send("POST", process.url + "/chat/completions", CHAT, bearer(own_issuer.token()))
        assert status == 503 and json.loads(body)["error"]["code"] == "identity_unavailable", body
        assert scripted.requests() == []
    finally:
        said = process.stop()
    assert "Traceback" not in said



def test_an_issuer_whose_name_ends_in_a_slash_is_usable(scripted, own_issuer, tmp_path):
    own_issuer.named = own_issuer.url + "/"
    process = serve(tmp_path, scripted.base_url, own_issuer.url + "/")
    try:
        scripted.script({"content": "accepted"})
        status, _, body = send("POST", process.url + "/chat/completions", CHAT,
                               bearer(own_issuer.token(iss=own_issuer.url + "/")))
        assert status == 200, body
    finally:
        process.stop()

def test_a_flood_of_unknown_key_ids_does_not_hold_a_good_token_back(scripted, own_issuer, tmp_path):
    process = serve(tmp_path, scripted.base_url, own_issuer.url)
    try:
        scripted.script({"content": "first", "repeat": True})
        assert send("POST", process.url + "/chat/completions", CHAT, bearer(own_issuer.token()))[0] == 200
        flood = [threading.Thread(target=send, args=("POST", process.url + "/chat/completions", CHAT,
                                                     bearer(own_issuer.token({"kid": f"made-up-{n}"}))))
                 for n in range(20)]
        for thread in flood:
            thread.start()
        started = time.monotonic()
        assert send("POST", process.url + "/chat/completions", CHAT, bearer(own_issuer.token()))[0] == 200
        assert time.monotonic() - started < 1.0
        for thread in flood:
            thread.join()
        assert own_issuer.fetches <= 3  # the first, and at most one every five seconds for the made-up ids
    finally:
        process.stop()


def test_stale_keys_keep_serving_while_the_provider_hangs(own_issuer, monkeypatch):
    """Past KEYS_FRESH_FOR the keys are fetched again on use; while the provider hangs, each request waited for the
    one before it to time out (FETCH_TIMEOUT each, one after the other) before the stale keys served it."""
    from toolkeeper.identity import issuer as issuer_module

    monkeypatch.setattr(issuer_module, "KEYS_FRESH_FOR", 0.5)
    monkeypatch.setattr(issuer_module, "FETCH_TIMEOUT", 1.0)

    async def run() -> tuple[list, float, float]:
        issuer = Issuer(own_issuer.url, jwks_url=own_issuer.url + "/jwks")
        try:
            assert await issuer.key("own-1", "RS256") is not None
            await asyncio.sleep(0.6)  # the keys are due to be fetched again
            own_issuer.hang = 3.0
            started = time.monotonic()
            found = await asyncio.gather(*(issuer.key("own-1", "RS256") for _ in range(5)))
            took = time.monotonic() - started
            started = time.monotonic()
            found.append(await issuer.key("own-1", "RS256"))  # a moment later: not asked again yet
            return found, took, time.monotonic() - started
        finally:
            await issuer.close()

    found, took, then = asyncio.run(run())
    assert all(key is not None for key in found)
    assert took < 2.5 and then < 0.5, (took, then)


def test_an_issuer_with_no_keys_yet_is_not_asked_by_every_request_in_turn(own_issuer, monkeypatch):
    from toolkeeper.identity import issuer as issuer_module

    monkeypatch.setattr(issuer_module, "FETCH_TIMEOUT", 1.0)
    own_issuer.hang = 3.0

    async def run() -> tuple[list, float]:
        issuer = Issuer(own_issuer.url, jwks_url=own_issuer.url + "/jwks")
        try:
            started = time.monotonic()
            said = await asyncio.gather(*(issuer.key("own-1", "RS256") for _ in range(5)), return_exceptions=True)
            return said, time.monotonic() - started
        finally:
            await issuer.close()

    said, took = asyncio.run(run())
    assert all(isinstance(one, IssuerUnavailable) for one in said) and took < 2.5, (said, took)


# -- what is logged: never a token ---------------------------------------------------------------------------------


def test_no_token_is_logged_at_debug(red):
    """Last in the module: everything above, at DEBUG, and a few more tokens good and bad through every door."""
    red.scripted.script({"content": "logged?"})
    send("POST", red.root + "/v1/chat/completions", CHAT, bearer(red.token(sub="ada\n\x1b[2Jforged log line")))
    send("POST", red.root + "/v1/chat/completions", CHAT, bearer(red.token(exp=int(time.time()) - 3600)))
    send("POST", red.resource, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, bearer(red.token()))
    send("POST", red.root + "/toolkeeper/hooks", hook_event("PreToolUse"), bearer(red.token("grace")))
    now = int(time.time())
    access = red.provider.sign({"iss": red.provider.issuer, "aud": red.resource, "sub": "ada", "client_id": "red-mcp",
                                "iat": now, "exp": now + 600}, header={"typ": "at+jwt"})
    mcp = {**bearer(access), "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "red", "version": "1"}}}
    status, headers, _ = send("POST", red.resource, initialize, mcp)
    assert status == 200
    mcp["Mcp-Session-Id"] = {name.lower(): value for name, value in headers.items()}["mcp-session-id"]
    send("POST", red.resource, {"jsonrpc": "2.0", "method": "notifications/initialized"}, mcp)
    status, _, body = send("POST", red.resource, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "lookup", "arguments": {"word": "at-debug"}}}, mcp)
    assert status == 200 and "at-debug" in body, body
    logged = red.process.stderr()
    assert "eyJ" not in logged and "\x1b" not in logged and "forged log line" not in logged
