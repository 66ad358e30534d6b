"""The HTTP server: chat completions through the engine, everything else passed through.

It knows nothing of runners: it builds the engine from the agent file and
hands each chat request to the Chat Completions adapter.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

import aiohttp
from aiohttp import web

from proxy.agentfile import Agent
from proxy.approvals import TOKEN_VARIABLE, ApprovalsConsent, add_admin_routes
from proxy.audit import Redactor, open_audit
from proxy.auditpage import add_audit_page
from proxy.calls import DeclaredCalls
from proxy.chat import ChatCompletions
from proxy.consent import Consent, NoConsent, TerminalConsent, has_terminal
from proxy.engine import Engine
from proxy.history import DEFAULT_TTL, History
from proxy.metrics import Metrics
from proxy.opa import OpaPolicy
from proxy.policy import Policy
from proxy.records import Observer
from proxy.rules import Rules
from proxy.runners import ArgvRunner, Runner
from proxy.store import SQLiteStore
from proxy.upstream import HOP_BY_HOP, Upstream, UpstreamError, forward_headers

log = logging.getLogger("toolkeeper")

UPSTREAM_KEY = web.AppKey("upstream", Upstream)
CHAT_KEY = web.AppKey("chat", ChatCompletions)
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
# Agents send whole conversations; the default 1 MiB would refuse long ones.
MAX_REQUEST_BYTES = 64 * 1024 * 1024


def default_store_path(agent: Agent) -> Path:
    return agent.directory / "toolkeeper.sqlite3"


def default_audit_path(agent: Agent) -> Path:
    return agent.directory / "toolkeeper-audit.sqlite3"


def build_app(
    agent: Agent,
    *,
    consent: Consent | None = None,
    yolo: bool | None = None,
    observers: Iterable[Observer] = (),
    read_timeout: float = 300,
    keepalive: float = 5.0,
    store_path: str | Path | None = None,
    history_ttl: float = DEFAULT_TTL,
    rules: Rules | None = None,
    opa: OpaPolicy | None = None,
    identity_header: str | None = None,
    admin_token: str | None = None,
    consent_mode: str = "auto",
    consent_timeout: float = 300,
    audit_path: str | Path | None = None,
    redact: list[str] | None = None,
) -> web.Application:
    """The app. Consent: `consent` if given; else by `consent_mode`: terminal, approvals (needs the admin
    token), none, or auto (the terminal when there is one, else approvals when a token is set)."""
    store = SQLiteStore(store_path or default_store_path(agent))
    audit = open_audit(audit_path or default_audit_path(agent), Redactor(redact) if redact else None)
    metrics = Metrics()
    approvals = None
    if consent is None:
        if consent_mode == "auto":
            consent_mode = "terminal" if has_terminal() else ("approvals" if admin_token else "none")
        if consent_mode == "approvals":
            if not admin_token:
                raise ValueError(f"the approvals channel needs an admin token: set {TOKEN_VARIABLE}")
            consent = approvals = ApprovalsConsent(store, timeout=consent_timeout)
        elif consent_mode == "terminal":
            consent = TerminalConsent(timeout=consent_timeout)
        else:
            consent = NoConsent()
    history = History(store, history_ttl)
    runners: dict[str, Runner] = {"argv": ArgvRunner()}
    if any(tool.spec.runner == "wasm" for tool in agent.tools.values()):
        from proxy.wasm import shared_runner  # wasmtime loads only for agents that use it

        runners["wasm"] = shared_runner()
    calls = DeclaredCalls(
        runners=runners,
        consent=consent,
        policy=Policy(agent.config.yolo if yolo is None else yolo, rules, opa),
        store=store,
        observers=[metrics.record, *observers],
        audit=audit,
    )
    engine = Engine(agent, calls, history=history, metrics=metrics)
    metrics.counted_elsewhere(
        "toolkeeper_history_restorations_total",
        "Assistant messages given back their hidden exchange (hit), or whose exchange was not found: "
        "expired or edited history (miss).",
        lambda: {(("outcome", outcome),): float(history.counts[outcome]) for outcome in ("hit", "miss")})
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    api_key = os.environ[agent.config.api_key_env] if agent.config.api_key_env else None

    async def upstream_session(app: web.Application):
        # One pooled session for the process: a connection per request would
        # cost a TCP (and TLS) handshake on the hot path.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=True) as session:
            upstream = Upstream(agent.config.upstream, session, api_key=api_key, read_timeout=read_timeout)
            app[UPSTREAM_KEY] = upstream
            app[CHAT_KEY] = ChatCompletions(engine, upstream, keepalive=keepalive, identity_header=identity_header,
                                            metrics=metrics)
            yield
        if opa is not None:
            await opa.close()
        store.close()
        audit.close()

    app.cleanup_ctx.append(upstream_session)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await request.app[CHAT_KEY].handle(request)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "tools": sorted(agent.tools)})

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain", charset="utf-8")

    async def readyz(request: web.Request) -> web.Response:
        """Ready when the stores answer and the upstream client is up."""
        problems = []
        try:
            store.get_call_result("readyz")
        except Exception as exc:
            problems.append(f"store: {exc}")
        try:
            audit.events(after_seq=2**62)
        except Exception as exc:
            problems.append(f"audit: {exc}")
        if UPSTREAM_KEY not in request.app:
            problems.append("upstream client not started")
        body = {"ready": not problems, "problems": problems}
        return web.json_response(body, status=200 if not problems else 503)

    for path in CHAT_PATHS:
        app.router.add_post(path, chat)
    app.router.add_get("/healthz", healthz)
    if admin_token:
        add_admin_routes(app, store, admin_token, approvals)
        add_audit_page(app, audit, admin_token)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/readyz", readyz)
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
