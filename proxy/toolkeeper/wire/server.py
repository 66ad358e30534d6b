"""The HTTP server: the agent APIs through the engine, /toolkeeper/ answered here, the rest passed through.

It knows nothing of runners or policies: it is handed an engine and an admin
sub-app by the composition root (`toolkeeper.app`), and owns the one pooled
upstream session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from toolkeeper.common import dumps
from toolkeeper.engine import CHARACTERS_PER_TOKEN, Engine, HookCalls, LimitReached
from toolkeeper.identity import Identity
from toolkeeper.metrics import Metrics
from toolkeeper.settings import Settings
from toolkeeper.store import Store, StoreError
from toolkeeper.tracing import Tracing
from toolkeeper.wire.admin import PREFIX as ADMIN_PREFIX
from toolkeeper.wire.apis import ChatCompletions, MessagesAPI, ResponsesAPI, count_tokens_body, response_not_found
from toolkeeper.wire.endpoints import Endpoints, legacy_completion
from toolkeeper.wire.errors import OPENAI, UpstreamError, shape_of, store_unavailable, unreachable
from toolkeeper.wire.guard import OPEN_PATHS, AgentKeys, OriginGuard
from toolkeeper.wire.hooks_api import PATH as HOOKS_PATH
from toolkeeper.wire.hooks_api import HooksEndpoint
from toolkeeper.wire.intercept import HEADER as INTERCEPT_HEADER
from toolkeeper.wire.intercept import InterceptedUpstream
from toolkeeper.wire.mcp import METADATA_PATHS, McpEndpoint, ProtectedResource
from toolkeeper.wire.mcp import PATH as MCP_PATH
from toolkeeper.wire.upstream import HOP_BY_HOP, OWN_COOKIE, UPSTREAM_KEY, Upstream, forward_headers, upstream_for

log = logging.getLogger("toolkeeper")

@dataclass
class Doors:
    """The doors into an agent beside the model API: `/mcp` (MCP's Streamable HTTP) and the agents' hooks."""

    mcp_server: Any = None  # the SDK's server answering `/mcp`
    hook_calls: HookCalls | None = None
    host: str = "127.0.0.1"

    def add_routes(self, app: web.Application, keys: AgentKeys, identity_header: str | None = None,
                   mcp_scopes: tuple[str, ...] = ()) -> None:
        """`identity_header`: serve's --identity-header, read at these doors as on the model APIs (`agent.header`);
        `mcp_scopes`: those /mcp's access tokens must hold, when it is an OAuth protected resource (`auth.mcp`)."""
        identity = keys.identity
        resource = ProtectedResource(identity, mcp_scopes, keys) \
            if self.mcp_server is not None and identity is not None and identity.mcp is not None else None
        # answered here whatever the settings: an open path must never fall through to the model server
        for path in METADATA_PATHS:
            app.router.add_route("*", path, partial(resource_metadata, resource))
        if self.mcp_server is not None:
            endpoint = McpEndpoint(self.mcp_server, keys_required=keys.required, host=self.host,
                                   identity_header=identity_header, resource=resource)
            app.cleanup_ctx.append(endpoint.lifetime)
            app.router.add_route("*", MCP_PATH, endpoint.handle)
        if self.hook_calls is not None:
            hooks = HooksEndpoint(self.hook_calls, keys, self.host, identity_header=identity_header)
            app.router.add_post(HOOKS_PATH, hooks.handle)


async def resource_metadata(resource: ProtectedResource | None, request: web.Request) -> web.StreamResponse:
    """/mcp's resource metadata (RFC 9728): where its access tokens come from; 404 when /mcp takes none."""
    if request.method not in ("GET", "HEAD"):
        return web.json_response({"error": "method_not_allowed"}, status=405, headers={"Allow": "GET, HEAD"})
    if resource is None:
        return web.json_response({"error": "not_found", "error_description": "/mcp is not an OAuth protected "
                                  "resource here (no auth.mcp.issuer)"}, status=404)
    return await resource.metadata(request)


CHAT_KEY = web.AppKey("chat", ChatCompletions)
RESPONSES_KEY = web.AppKey("responses", ResponsesAPI)
MESSAGES_KEY = web.AppKey("messages", MessagesAPI)
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
RESPONSES_PATHS = ("/v1/responses", "/responses")
MESSAGES_PATHS = ("/v1/messages", "/messages")
# Agents send whole conversations; the default 1 MiB would refuse long ones.
MAX_REQUEST_BYTES = 64 * 1024 * 1024

CHECK_EVERY = 1.0  # seconds between readiness checks
CHECK_WAIT = 2.0  # seconds a component has to answer one
STALE_AFTER = CHECK_EVERY + CHECK_WAIT + 1.0  # a check hanging longer than this: not ready
# A readiness check: it raises when its component does not answer.
Check = Callable[[], Awaitable[object]]


def proxy_app(engine: Engine, settings: Settings, *, upstream_url: str, api_key: str | None, metrics: Metrics,
              admin: web.Application, checks: dict[str, Check], agent_keys: dict[str, str],
              store: Store, doors: Doors | None = None, tracing: Tracing | None = None,
              identity: Identity | None = None) -> web.Application:
    origins = OriginGuard(settings.allow_origin)
    endpoints = Endpoints(settings.pass_ungoverned, metrics)

    async def elsewhere(request: web.Request) -> web.StreamResponse:
        return await other_endpoint(request, endpoints)

    intercepted = InterceptedUpstream(settings.intercept_secret, settings.intercept_upstreams,
                                      own=(*OPEN_PATHS, ADMIN_PREFIX), elsewhere=elsewhere)
    # toolkeeper holding the upstream key means agents must prove who they are
    keys = AgentKeys(agent_keys, required=api_key is not None, identity=identity,
                     identity_header=settings.identity_header)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[guards(origins, intercepted, keys)])
    app.on_response_prepare.append(origins.on_prepare)
    probes = Probes(engine, metrics, checks)

    async def upstream_session(app: web.Application):
        # One pooled session for the process: a connection per request would
        # cost a TCP (and TLS) handshake on the hot path.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=True) as session:
            upstream = Upstream(upstream_url, session, api_key=api_key, read_timeout=settings.read_timeout)
            app[UPSTREAM_KEY] = upstream
            adapter = {"keepalive": settings.keepalive, "identity_header": settings.identity_header,
                       "metrics": metrics, "tracing": tracing}
            app[CHAT_KEY] = ChatCompletions(engine, upstream, **adapter)
            app[RESPONSES_KEY] = ResponsesAPI(engine, upstream, store=store, **adapter)
            app[MESSAGES_KEY] = MessagesAPI(engine, upstream, **adapter)
            yield

    app.cleanup_ctx.append(upstream_session)
    app.cleanup_ctx.append(probes.watch)
    for path in CHAT_PATHS:
        app.router.add_post(path, chat)
    for path in RESPONSES_PATHS:
        app.router.add_post(path, responses)
        app.router.add_get(path + "/{id}", stored_response)
    for path in MESSAGES_PATHS:
        app.router.add_post(path, messages)
        app.router.add_post(path + "/count_tokens", count_tokens)
    app.router.add_get("/healthz", probes.healthz)
    app.router.add_get("/metrics", probes.metrics_page)
    app.router.add_get("/readyz", probes.readyz)
    (doors or Doors()).add_routes(app, keys, settings.identity_header, settings.auth_mcp_scopes)
    app.add_subapp(ADMIN_PREFIX, admin)
    app.router.add_route("*", "/{tail:.*}", elsewhere)
    return app


def guards(origins: OriginGuard, intercepted: InterceptedUpstream, keys: AgentKeys) -> Callable:
    """The three guards, in order (a web page's origin, an intercepted request's upstream, the agent's key), as one
    middleware: a request none of them has anything to say about (no `Origin`, no intercept header, no keys
    required) goes straight to its handler, one layer instead of three on every agent request."""
    @web.middleware
    async def guarded(request: web.Request, handler: Callable) -> web.StreamResponse:
        headers = request.headers
        if not keys.checks and "Origin" not in headers and INTERCEPT_HEADER not in headers:
            return await handler(request)
        return await origins.middleware(request, partial(intercepted.middleware, handler=partial(
            keys.middleware, handler=handler)))

    return guarded


async def chat(request: web.Request) -> web.StreamResponse:
    return await request.app[CHAT_KEY].handle(request)


async def responses(request: web.Request) -> web.StreamResponse:
    return await request.app[RESPONSES_KEY].handle(request)


async def messages(request: web.Request) -> web.StreamResponse:
    return await request.app[MESSAGES_KEY].handle(request)


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """Anthropic's token count, with the declared tools the model would get counted too."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return await passthrough(request)
    api = request.app[MESSAGES_KEY]
    declared = [api.engine.schemas[name] for name in api.engine.active_tools(body)]
    return await passthrough(request, body=dumps(count_tokens_body(body, declared)))


async def stored_response(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses/{id}: an id the agent received stands for the last round of its turn, and reads back as
    the agent received it."""
    response_id = request.match_info["id"]
    try:
        found = await request.app[RESPONSES_KEY].retrieve(request, response_id)
    except StoreError as exc:
        return OPENAI.response(store_unavailable(exc))
    if found is None:  # not this tenant's, and the model server cannot tell (responses/owners.py)
        return response_not_found(response_id)
    upstream_id, shown = found
    if shown is None:
        return await passthrough(request, path=f"/responses/{upstream_id}")
    if request.query.get("stream", "false") != "false":
        return OPENAI.refusal(400, "this response is read back whole, as the agent received it: retrieve it "
                                   "without stream", "stream_not_supported")
    return web.Response(body=dumps(shown), content_type="application/json")


class Probes:
    """/healthz, /readyz and /metrics: for orchestrators and scrapers."""

    def __init__(self, engine: Engine, metrics: Metrics, checks: dict[str, Check]):
        self.engine = engine
        self.metrics = metrics
        self.checks = checks
        self.problems: list[str] = ["not checked yet"]
        self.checked = time.monotonic()

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})  # healthy or not, to anyone: what it serves is the admin API's

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=await self.metrics.page(), headers={"Content-Type": self.metrics.content_type})

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready when every component answered its last check, made in the background (a database that hangs
        never holds this answer up) and recent, and the upstream client is up."""
        problems = list(self.problems)
        age = time.monotonic() - self.checked
        if age > STALE_AFTER:
            problems.append(f"the components have not answered a check for {age:.0f} s")
        if UPSTREAM_KEY not in request.app:
            problems.append("upstream client not started")
        body = {"ready": not problems, "problems": problems}
        return web.json_response(body, status=200 if not problems else 503)

    async def watch(self, app: web.Application):
        """A cleanup context: checks the components every CHECK_EVERY seconds while the app runs."""
        task = asyncio.get_running_loop().create_task(self._check_forever())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _check_forever(self) -> None:
        while True:
            self.problems = await self.check_once()
            self.checked = time.monotonic()
            await asyncio.sleep(CHECK_EVERY)

    async def check_once(self) -> list[str]:
        problems = []
        for name, check in self.checks.items():
            try:
                async with asyncio.timeout(CHECK_WAIT):  # not wait_for: on 3.11 it can swallow a cancellation
                    await check()
            except TimeoutError:
                problems.append(f"{name}: no answer within {CHECK_WAIT:g} s")
            except Exception as exc:
                problems.append(f"{name}: {exc}")
        return problems


def _sets_own_cookie(name: str, value: str) -> bool:
    """A model server's Set-Cookie for one of toolkeeper's cookies (a console session it would plant)."""
    return name.lower() == "set-cookie" and value.lstrip().lower().startswith(OWN_COOKIE)


async def other_endpoint(request: web.Request, endpoints: Endpoints) -> web.StreamResponse:
    """A request no agent API answers: a data endpoint goes upstream untouched, an ungoverned one is refused."""
    body = parsed = None
    if request.method == "POST" and legacy_completion(request.path):
        body = await request.read()  # a legacy completion: tool-capable only when its body offers tools
        with contextlib.suppress(orjson.JSONDecodeError):
            parsed = orjson.loads(body)
    verdict = endpoints.verdict(request, parsed if isinstance(parsed, dict) else None)
    if verdict.refusal:
        return shape_of(request.path).refusal(403, verdict.refusal, "ungoverned_endpoint")
    try:  # a stored response's other doors (DELETE, input_items, /compact's previous_response_id): its owner's only
        refused, body = await request.app[RESPONSES_KEY].refused_elsewhere(request, body)
    except StoreError as exc:
        return OPENAI.response(store_unavailable(exc))
    return refused or await budgeted(request, body)


async def budgeted(request: web.Request, body: bytes | None) -> web.StreamResponse:
    """A request toolkeeper passes on (a model endpoint it does not speak, embeddings) under the caller's token
    budgets: refused once one is spent, and counted by its size (the answer goes as it came, its usage unread)."""
    chat = request.app[CHAT_KEY]
    limiter = chat.engine.handler.limiter
    budgets = limiter.budgets(chat.context(request, b"")) if request.method == "POST" else []
    if not budgets or limiter.store is None:
        return await passthrough(request, body=body)
    try:
        await limiter.before_round(budgets)
    except LimitReached as exc:
        return shape_of(request.path).response(UpstreamError.limit_reached(exc.reason))
    except StoreError as exc:
        return OPENAI.response(store_unavailable(exc))
    body = body if body is not None else await request.read()
    relayed = [0]
    try:
        return await passthrough(request, body=body, relayed=relayed)
    finally:
        await limiter.count_tokens(budgets, (len(body) + relayed[0]) // CHARACTERS_PER_TOKEN)


async def passthrough(request: web.Request, *, path: str | None = None, body: bytes | None = None,
                      relayed: list[int] | None = None) -> web.StreamResponse:
    """What is not an agent API request (and not refused) goes upstream untouched, streamed both ways (`relayed`:
    the answer's bytes, counted)."""
    upstream = upstream_for(request, request.app[UPSTREAM_KEY])
    if path is None:
        path = request.path[3:] if request.path.startswith("/v1/") else request.path
    url = upstream.url(path) + (f"?{request.query_string}" if request.query_string else "")
    data = body if body is not None else (request.content if request.body_exists else None)
    headers = forward_headers(request.headers, upstream.api_key)
    # bytes go back as the upstream encoded them, so ask only for what the agent accepts
    headers["Accept-Encoding"] = request.headers.get("Accept-Encoding", "identity")
    try:
        async with upstream.session.request(
            request.method, url, headers=headers, data=data,
            timeout=upstream.timeout, allow_redirects=False, auto_decompress=False,
        ) as answer:
            response = web.StreamResponse(status=answer.status, reason=answer.reason)
            for name, value in answer.headers.items():
                if name.lower() not in HOP_BY_HOP and not _sets_own_cookie(name, value):
                    response.headers.add(name, value)
            # whatever the model server sends shares the console's origin: it may show, never script it (an SVG, a
            # page with no or a wrong Content-Type included); API clients ignore both headers
            response.headers["Content-Security-Policy"] = "sandbox"
            response.headers["X-Content-Type-Options"] = "nosniff"
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                if relayed is not None:
                    relayed[0] += len(chunk)
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientError, TimeoutError) as exc:
        return OPENAI.response(unreachable(exc) if isinstance(exc, aiohttp.ClientError) else UpstreamError.ours(
            504, "the model server did not answer in time", "upstream_timeout"))
