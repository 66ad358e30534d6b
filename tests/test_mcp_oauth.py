"""/mcp as an OAuth 2.1 protected resource, and the agent's MCP servers that need OAuth, against a real OpenID
provider (tests/idp: oidc-provider) and a real `toolkeeper serve`.

The official MCP SDK's OAuth client finds the flow from the 401 alone (resource metadata, the provider's metadata,
dynamic registration, PKCE, the resource indicator), signs in as a person would, and its calls are recorded for
its user; a group rule decides a call; bad tokens are refused; a session stays its owner's. Behind toolkeeper, an
MCP server written with the SDK checks bearer tokens for its own audience: toolkeeper reaches it with a token of
its own (client credentials) or with the caller's exchanged (RFC 8693), never with the caller's token itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path

import jwt
import pytest
from conftest import ROOT, Process, audit_cli, free_port, recording_tool, write_agent

AGENT_KEY = "mcp-oauth-agent-key-0123456789"
AGENTS_SECRET = "agents-secret-0123456789abcdef"  # the test provider's toolkeeper-agents client
REDIRECT = "http://127.0.0.1:9/mcp-callback"  # nothing listens: the flow stops at the redirect, as a browser's would
OAUTH_SERVER = ROOT / "tests" / "mcp" / "oauth_server.py"

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    agents:
      - {name: desk, key_sha256: "{key}"}
    mcp_servers:
      - name: own
        url: "{server}"
        auth: {client_credentials: {issuer: "{issuer}", client_id: toolkeeper-agents,
                                    client_secret_env: MCP_AGENTS_SECRET, resource: "{server}"}}
      - name: foryou
        url: "{server}"
        auth: {token_exchange: {issuer: "{issuer}", client_id: toolkeeper-agents,
                                client_secret_env: MCP_AGENTS_SECRET, resource: "{server}"}}
    tools:
""" + recording_tool("lookup", "word", "Look a word up. Returns its definition.", "The word.") + recording_tool(
    "release", "version", "Publish a release. Returns the release log.", "The version.") + """
"""
RULES = """
rules:
  - id: platform-only
    effect: deny
    reason: only the platform group may release
    when: {tool: release, principal: {groups: {none: [platform]}}}
"""


class Served:
    def __init__(self, process: Process, directory: Path, port: int, server_url: str, server_log: Path):
        self.process, self.directory, self.server_url, self.server_log = process, directory, server_url, server_log
        self.url = f"http://127.0.0.1:{port}"
        self.resource = self.url + "/mcp"

    def trail(self) -> list[dict]:
        run = audit_cli(self.directory / "toolkeeper-audit.sqlite3", "export", "--format", "jsonl")
        assert run.returncode == 0, run.stderr
        return [json.loads(line) for line in run.stdout.splitlines()]

    def received(self) -> list[dict]:
        """What the MCP server behind toolkeeper was sent: each request's token (its digest) and claims."""
        text = self.server_log.read_text() if self.server_log.exists() else ""
        return [json.loads(line) for line in text.splitlines()]


def serve(directory: Path, port: int, issuer: str, scopes: tuple[str, ...] = ("groups",)) -> Process:
    config = directory / "toolkeeper.yaml"
    config.write_text(json.dumps({"auth": {"mcp": {"issuer": issuer, "scopes": list(scopes)}}}))
    return Process([sys.executable, "-m", "toolkeeper", "serve", str(directory / "agent.yaml"), "--policy",
                    str(directory / "rules.yaml"), "--config", str(config), "--log-level", "WARNING"],
                   "toolkeeper listening on", env={"TOOLKEEPER_PORT": str(port), "MCP_AGENTS_SECRET": AGENTS_SECRET},
                   cwd=directory)


def listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture(scope="module")
def served(oidc_provider, tmp_path_factory):
    directory = tmp_path_factory.mktemp("mcp-oauth")
    server_port, port = free_port(), free_port()
    server_url = f"http://127.0.0.1:{server_port}/mcp"
    server_log = directory / "received.jsonl"
    server = Process([sys.executable, str(OAUTH_SERVER), "--port", str(server_port), "--issuer",
                      oidc_provider.issuer, "--log", str(server_log)], "oauth server listening on")
    listening(server_port)
    write_agent(directory, AGENT, key=hashlib.sha256(AGENT_KEY.encode()).hexdigest(), server=server_url,
                issuer=oidc_provider.issuer)
    (directory / "rules.yaml").write_text(RULES)
    process = serve(directory, port, oidc_provider.issuer)
    try:
        yield Served(process, directory, port, server_url, server_log)
    finally:
        said = process.stop()
        server.stop()
        assert "Traceback" not in said, said
        assert "eyJ" not in said, "a token in the log"  # every JWT starts so: none is ever logged


# --- the official SDK's OAuth client ---------------------------------------------------------------------


class Memory:
    """The SDK's token storage, in memory: the registered client and its tokens."""

    def __init__(self) -> None:
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens) -> None:
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, info) -> None:
        self.client = info


@asynccontextmanager
async def signed_in(served: Served, idp, user: str, storage: Memory | None = None):
    """An MCP client of the SDK that signs `user` in through the provider's login form when /mcp asks."""
    import httpx2
    from mcp import Client
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

    landed: list[str] = []

    async def redirect(url: str) -> None:
        landed.append(await asyncio.to_thread(idp.follow_login, url, user))

    async def callback() -> AuthorizationCodeResult:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(landed.pop()).query))
        assert "code" in query, query
        return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))

    metadata = OAuthClientMetadata(client_name="mcp-oauth-tests", redirect_uris=[REDIRECT])
    auth = OAuthClientProvider(served.resource, metadata, storage or Memory(), redirect_handler=redirect,
                               callback_handler=callback)
    async with httpx2.AsyncClient(auth=auth, timeout=60) as http, \
            Client(streamable_http_client(served.resource, http_client=http)) as client:
        yield client


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


def principal_of(record: dict) -> dict:
    """The record's principal: its own field, or the policy input's."""
    return record.get("principal") or (record.get("policy_input") or {}).get("principal") or {}


def test_the_sdk_client_completes_the_flow_and_its_calls_are_recorded_for_its_user(served, oidc_provider):
    storage = Memory()

    async def run():
        async with signed_in(served, oidc_provider, "ada", storage) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            return names, await client.call_tool("lookup", {"word": "otter"})

    names, result = asyncio.run(run())
    assert {"lookup", "release", "mcp__own__whoami", "mcp__foryou__whoami"} <= names
    assert not result.is_error and "otter" in text_of(result)
    # the token the SDK got is one made for /mcp, found through the resource metadata alone
    claims = oidc_provider.decode(storage.tokens.access_token, audience=served.resource)
    assert claims["sub"] == "ada" and claims["aud"] == served.resource
    assert storage.client.client_id == claims["client_id"]  # registered dynamically
    (record,) = [entry for entry in served.trail() if entry["tool"] == "lookup" and entry["status"] == "ok"]
    principal = principal_of(record)
    assert principal["user"] == "ada"
    assert principal["groups"] == ["platform", "approvers"]
    assert principal["issuer"] == oidc_provider.issuer
    assert principal["agent"] == storage.client.client_id == record["agent"]
    assert storage.tokens.access_token not in json.dumps(record)  # no token in the record
    run = audit_cli(served.directory / "toolkeeper-audit.sqlite3", "export", "--format", "jsonl", "--user", "ada")
    assert record["record_id"] in {json.loads(line)["record_id"] for line in run.stdout.splitlines()}, run.stderr


# --- the protected resource, read as raw HTTP ---------------------------------------------------------------


def request(url: str, *, method: str = "GET", body: dict | None = None, headers: dict | None = None):
    """(status, headers, body as JSON or text)."""
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Accept": "application/json, text/event-stream", **({"Content-Type": "application/json"} if data else {}),
            **(headers or {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=sent),
                                    timeout=20) as answer:
            status, got, raw = answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as refused:
        status, got, raw = refused.code, refused.headers, refused.read()
    try:
        return status, got, json.loads(raw)
    except ValueError:
        return status, got, raw.decode()


LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}


def test_without_a_token_the_401_names_the_resource_metadata(served, oidc_provider):
    metadata_url = f"{served.url}/.well-known/oauth-protected-resource/mcp"
    status, headers, body = request(served.resource, method="POST", body=LIST)
    assert status == 401
    assert headers["WWW-Authenticate"] == f'Bearer resource_metadata="{metadata_url}", scope="groups"'
    assert "error=" not in headers["WWW-Authenticate"]  # no token, no error (RFC 6750, 3.1)
    expected = {"resource": served.resource, "authorization_servers": [oidc_provider.issuer],
                "bearer_methods_supported": ["header"], "scopes_supported": ["groups"], "resource_name": "toolkeeper"}
    for url in (metadata_url, f"{served.url}/.well-known/oauth-protected-resource"):
        status, headers, body = request(url)  # open: no key, no token
        assert status == 200 and body == expected, url
    # only reading it is open: any other method needs a key like any other path (it is never passed upstream)
    assert request(metadata_url, method="POST", body={})[0] == 401


def bad_tokens(idp, resource: str) -> dict[str, str]:
    from cryptography.hazmat.primitives.asymmetric import rsa

    now = int(time.time())
    claims = {"iss": idp.issuer, "sub": "ada", "aud": resource, "iat": now, "exp": now + 300, "scope": "groups",
              "client_id": "someone", "groups": ["platform"]}
    kid = jwt.get_unverified_header(idp.sign(claims))["kid"]
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return {
        "another audience": idp.password_tokens("ada", resource="http://127.0.0.1:9/other")["access_token"],
        "has expired": idp.sign({**claims, "iat": now - 900, "exp": now - 300}, header={"typ": "at+jwt"}),
        "does not verify": jwt.encode(claims, stranger, algorithm="RS256", headers={"kid": kid}),
        "'none'": jwt.encode(claims, None, algorithm="none"),
        "not a signed JWT": "not-a-token",
    }


def test_bad_tokens_are_refused_as_invalid_tokens(served, oidc_provider):
    for why, token in bad_tokens(oidc_provider, served.resource).items():
        status, headers, body = request(served.resource, method="POST", body=LIST,
                                        headers={"Authorization": f"Bearer {token}"})
        assert status == 401, why
        challenge = headers["WWW-Authenticate"]
        assert challenge.startswith(f'Bearer resource_metadata="{served.url}/.well-known/oauth-protected-resource/mcp"')
        assert 'error="invalid_token"' in challenge and why in challenge, (why, challenge)
        assert body["error"] == "invalid_token" and why in body["error_description"]
    # a good token without the scope /mcp lists: 403, so the client asks for more
    now = int(time.time())
    scopeless = oidc_provider.sign({"iss": oidc_provider.issuer, "sub": "ada", "aud": served.resource, "iat": now,
                                    "exp": now + 300, "client_id": "someone"}, header={"typ": "at+jwt"})
    status, headers, _ = request(served.resource, method="POST", body=LIST,
                                 headers={"Authorization": f"Bearer {scopeless}"})
    assert status == 403 and 'error="insufficient_scope"' in headers["WWW-Authenticate"]
    assert 'scope="groups"' in headers["WWW-Authenticate"]
    logged = served.process.stderr()
    assert "Traceback" not in logged and "eyJ" not in logged
    assert "MCP: an access token was refused: the token has expired" in logged  # why, never the token


def test_an_issuer_that_is_down_refuses_every_token(oidc_provider, tmp_path):
    write_agent(tmp_path, AGENT, key="0" * 64, server="http://127.0.0.1:9/mcp", issuer="http://127.0.0.1:9")
    (tmp_path / "rules.yaml").write_text(RULES)
    port = free_port()
    process = serve(tmp_path, port, "http://127.0.0.1:9")
    try:
        token = oidc_provider.password_tokens("ada", resource=f"http://127.0.0.1:{port}/mcp")["access_token"]
        status, _, body = request(f"http://127.0.0.1:{port}/mcp", method="POST", body=LIST,
                                  headers={"Authorization": f"Bearer {token}"})
    finally:
        process.stop()
    assert status == 503 and body["error"] == "temporarily_unavailable"


def test_a_group_rule_decides_a_call_for_each_person(served, oidc_provider):
    async def release(user: str):
        async with signed_in(served, oidc_provider, user) as client:
            return await client.call_tool("release", {"version": f"9.{user}"})

    for_ada, for_bob = asyncio.run(release("ada")), asyncio.run(release("bob"))
    assert not for_ada.is_error, text_of(for_ada)
    assert for_bob.is_error and "only the platform group may release" in text_of(for_bob)
    records = {entry["arguments"]["version"]: entry for entry in served.trail() if entry["tool"] == "release"}
    assert records["9.ada"]["status"] == "ok" and principal_of(records["9.ada"])["user"] == "ada"
    denied = records["9.bob"]
    assert (denied["status"], denied["decision_rule"]) == ("denied", "platform-only")
    assert principal_of(denied)["user"] == "bob" and principal_of(denied)["groups"] == ["visitors"]


def test_a_session_answers_only_to_its_owner(served, oidc_provider):
    def token(user: str) -> str:
        return oidc_provider.password_tokens(user, resource=served.resource)["access_token"]

    ada, ada_again, bob = token("ada"), token("ada"), token("bob")
    status, headers, _ = request(served.resource, method="POST", body=INITIALIZE,
                                 headers={"Authorization": f"Bearer {ada}"})
    assert status == 200
    session = headers["Mcp-Session-Id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert request(served.resource, method="POST", body=initialized, headers={
        "Authorization": f"Bearer {ada}", "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-06-18"})[0] == 202
    for who, presented, expected in (("bob", bob, 404), ("ada, another token", ada_again, 200),
                                     ("a listed agent key", AGENT_KEY, 404)):
        status, _, _ = request(served.resource, method="POST", body=LIST, headers={
            "Authorization": f"Bearer {presented}", "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-06-18"})
        assert status == expected, who


# --- the agent's MCP servers that need OAuth ----------------------------------------------------------------


def test_servers_behind_get_their_own_tokens_never_the_callers(served, oidc_provider):
    storage = Memory()

    async def run():
        async with signed_in(served, oidc_provider, "ada", storage) as client:
            return (await client.call_tool("mcp__own__whoami", {}), await client.call_tool("mcp__foryou__whoami", {}))

    own, exchanged = asyncio.run(run())
    assert not own.is_error and not exchanged.is_error, (text_of(own), text_of(exchanged))
    server = served.server_url
    own, exchanged = json.loads(text_of(own)), json.loads(text_of(exchanged))
    # client credentials: toolkeeper's own token, made for that server
    assert (own["sub"], own["aud"], own.get("act")) == ("toolkeeper-agents", server, None)
    # token exchange: made for that server, for ada, with toolkeeper as the actor
    assert (exchanged["sub"], exchanged["aud"], exchanged["act"]) == ("ada", server, {"sub": "toolkeeper-agents"})
    caller = hashlib.sha256(storage.tokens.access_token.encode()).hexdigest()
    received = served.received()
    assert received and all(entry["token_sha256"] != caller for entry in received)
    assert all(entry["aud"] == server for entry in received)
    records = [entry for entry in served.trail() if entry["tool"].endswith("__whoami")]
    assert {entry["status"] for entry in records} == {"ok"}
    assert all(principal_of(entry)["user"] == "ada" for entry in records)


def test_a_call_with_no_token_to_exchange_is_refused_and_recorded(served):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    before = len(served.received())

    async def run():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {AGENT_KEY}"}, timeout=60) as http, \
                Client(streamable_http_client(served.resource, http_client=http)) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            return names, await client.call_tool("mcp__foryou__whoami", {}), await client.call_tool(
                "mcp__own__whoami", {})

    names, refused, own = asyncio.run(run())
    assert "mcp__foryou__whoami" not in names and "mcp__own__whoami" in names  # a listed key: no token to exchange
    assert refused.is_error and "came with none to exchange" in text_of(refused)
    assert not own.is_error  # toolkeeper's own token serves any caller
    assert all(entry["sub"] == "toolkeeper-agents" for entry in served.received()[before:])
    (record,) = [entry for entry in served.trail() if entry["tool"] == "mcp__foryou__whoami" and entry["agent"] == "desk"]
    assert record["status"] == "denied" and "came with none to exchange" in record["decision_reason"]


def test_a_jwt_agents_declared_tool_reaches_its_server_with_the_token_exchanged(scripted, served, oidc_provider,
                                                                              tmp_path):
    """Through the Chat Completions door: a declared tool run by the token-exchange server's tool acts for the user
    of the agent's JWT; an agent with a static key gets the refusal, and the server nothing."""
    from conftest import call, user

    audience = "http://127.0.0.1/toolkeeper-agents"
    agent = AGENT.replace("    tools:\n", "    tools:\n      - name: whoami_here\n        description: Say who.\n"
                          "        mcp: {server: foryou, tool: whoami}\n", 1)
    write_agent(tmp_path, agent, key=hashlib.sha256(AGENT_KEY.encode()).hexdigest(),
                server=served.server_url, issuer=oidc_provider.issuer)
    (tmp_path / "rules.yaml").write_text(RULES)
    process = Process([sys.executable, "-m", "toolkeeper", "serve", str(tmp_path / "agent.yaml"), "--port", "0",
                       "--upstream", scripted.base_url, "--log-level", "WARNING",
                       "--auth-agents-jwt-issuer", oidc_provider.issuer, "--auth-agents-jwt-audience", audience],
                      "toolkeeper listening on", env={"MCP_AGENTS_SECRET": AGENTS_SECRET}, cwd=tmp_path)
    from openai import OpenAI

    token = oidc_provider.password_tokens("ada", resource=audience)["access_token"]
    answers = []
    try:
        for key in (token, AGENT_KEY):
            scripted.script({"tool_calls": [call("whoami_here", {})]}, {"content": "done"})
            with OpenAI(base_url=process.url, api_key=key, max_retries=0) as client:
                client.chat.completions.create(model="m", messages=user())
            answers.append([m["content"] for m in scripted.bodies()[-1]["messages"] if m["role"] == "tool"][-1])
    finally:
        said = process.stop()
    assert "Traceback" not in said, said
    for_ada = json.loads(answers[0])
    assert (for_ada["sub"], for_ada["act"]) == ("ada", {"sub": "toolkeeper-agents"})
    assert for_ada["token_sha256"] != hashlib.sha256(token.encode()).hexdigest()
    assert "came with none to exchange" in answers[1]
