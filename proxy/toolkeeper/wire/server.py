"""The HTTP server: chat completions through the engine, /toolkeeper/ answered here, the rest passed through.

It knows nothing of runners or policies: it is handed an engine and an admin
sub-app by the composition root (`toolkeeper.app`), and owns the one pooled
upstream session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
from aiohttp import web

from toolkeeper.engine import Engine
from toolkeeper.metrics import Metrics
from toolkeeper.settings import Settings
from toolkeeper.wire.admin import PREFIX as ADMIN_PREFIX
from toolkeeper.wire.chat import ChatCompletions
from toolkeeper.wire.guard import AgentKeys, OriginGuard
from toolkeeper.wire.upstream import HOP_BY_HOP, Upstream, UpstreamError, forward_headers

UPSTREAM_KEY = web.AppKey("upstream", Upstream)
CHAT_KEY = web.AppKey("chat", ChatCompletions)
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
# Agents send whole conversations; the default 1 MiB would refuse long ones.
MAX_REQUEST_BYTES = 64 * 1024 * 1024

CHECK_WAIT = 3.0
# A readiness check: it raises when its component does not answer.
Check = Callable[[], object]


def proxy_app(engine: Engine, settings: Settings, *, upstream_url: str, api_key: str | None, metrics: Metrics,
              admin: web.Application, checks: dict[str, Check], agent_keys: dict[str, str]) -> web.Application:
    origins = OriginGuard(settings.allow_origin)
    # toolkeeper holding the upstream key means agents must prove who they are
    keys = AgentKeys(agent_keys, required=api_key is not None)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[origins.middleware, keys.middleware])
    app.on_response_prepare.append(origins.on_prepare)

    async def upstream_session(app: web.Application):
        # One pooled session for the process: a connection per request would
        # cost a TCP (and TLS) handshake on the hot path.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=True) as session:
            upstream = Upstream(upstream_url, session, api_key=api_key, read_timeout=settings.read_timeout)
            app[UPSTREAM_KEY] = upstream
            app[CHAT_KEY] = ChatCompletions(engine, upstream, keepalive=settings.keepalive,
                                            identity_header=settings.identity_header, metrics=metrics)
            yield

    app.cleanup_ctx.append(upstream_session)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await request.app[CHAT_KEY].handle(request)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "tools": sorted(engine.agent.tools)})

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain", charset="utf-8")

    async def readyz(request: web.Request) -> web.Response:
        """Ready when every component answers and the upstream client is up."""
        problems = []
        for name, check in checks.items():
            try:
                # in a thread, bounded: a database that hangs must not freeze the event loop, nor this answer
                await asyncio.wait_for(asyncio.to_thread(check), CHECK_WAIT)
            except TimeoutError:
                problems.append(f"{name}: no answer within {CHECK_WAIT:g} s")
            except Exception as exc:
                problems.append(f"{name}: {exc}")
        if UPSTREAM_KEY not in request.app:
            problems.append("upstream client not started")
        body = {"ready": not problems, "problems": problems}
        return web.json_response(body, status=200 if not problems else 503)

    for path in CHAT_PATHS:
        app.router.add_post(path, chat)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/readyz", readyz)
    app.add_subapp(ADMIN_PREFIX, admin)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    return app


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Anything that is not a chat request goes upstream untouched, streamed both ways."""
    upstream: Upstream = request.app[UPSTREAM_KEY]
    path = request.path[3:] if request.path.startswith("/v1/") else request.path
    url = upstream.url(path) + (f"?{request.query_string}" if request.query_string else "")
    data = request.content if request.body_exists else None
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
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientError, TimeoutError) as exc:
        error = UpstreamError.ours(502, f"cannot reach the model server: {exc}", "upstream_unreachable")
        return web.Response(status=error.status, body=error.body, content_type="application/json")
