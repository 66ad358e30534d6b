"""The composition root: the one place that knows every layer and wires them together.

    agent file + Settings -> stores, audit trail, policy sources, consent channel,
    runners -> CallHandler -> Engine -> the HTTP app (proxy routes + /toolkeeper/)

Nothing else builds these objects; each layer gets what it needs from here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from aiohttp import web

from toolkeeper.audit import Observer, Redactor, open_audit
from toolkeeper.engine import CallHandler, Engine, History, SQLiteStore
from toolkeeper.metrics import Metrics
from toolkeeper.policy import (
    ApprovalsConsent,
    ApprovalsStore,
    Consent,
    NoConsent,
    OpaPolicy,
    Policy,
    Rules,
    TerminalConsent,
    default_rules_path,
    has_terminal,
    load_rules,
)
from toolkeeper.runners import runners_for
from toolkeeper.settings import TOKEN_VARIABLE, Settings
from toolkeeper.tools import Agent
from toolkeeper.wire import AdminGuard, AuditPage, admin_app, approvals_api, proxy_app

POLICY = web.AppKey("policy", Policy)
STORE_FILE = "toolkeeper.sqlite3"
AUDIT_FILE = "toolkeeper-audit.sqlite3"


def build_app(agent: Agent, settings: Settings, *, consent: Consent | None = None,
              observers: Iterable[Observer] = ()) -> web.Application:
    """The app for one agent file. `consent` and `observers` stand in for the channel and add record readers
    (the demo answers for the user, tests read records); everything else comes from `settings`."""
    store_path = settings.store or agent.directory / STORE_FILE
    store = SQLiteStore(store_path)
    approvals = ApprovalsStore(store_path)
    audit = open_audit(settings.audit or agent.directory / AUDIT_FILE,
                       Redactor(settings.redact) if settings.redact else None)
    rules, opa = policy_sources(settings)
    channel = None
    if consent is None:
        consent = channel = consent_channel(settings, approvals)
    metrics = Metrics()
    history = History(store, settings.history_ttl)
    policy = Policy(agent.config.yolo, rules, opa)
    calls = CallHandler(
        runners=runners_for({tool.spec.runner for tool in agent.tools.values()}),
        consent=consent,
        policy=policy,
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

    guard = AdminGuard(settings.admin_token)
    admin = admin_app(guard, approvals_api(approvals, channel if isinstance(channel, ApprovalsConsent) else None),
                      AuditPage(audit, guard))
    api_key = os.environ[agent.config.api_key_env] if agent.config.api_key_env else None
    app = proxy_app(engine, settings, upstream_url=agent.config.upstream, api_key=api_key, metrics=metrics,
                    admin=admin, checks={"store": lambda: store.get_call_result("readyz"),
                                         "audit": lambda: audit.events(after_seq=2**62)})

    async def close(app: web.Application) -> None:
        if opa is not None:
            await opa.close()
        store.close()
        approvals.close()
        audit.close()

    app.on_cleanup.append(close)
    app[POLICY] = policy
    return app


def policy_sources(settings: Settings) -> tuple[Rules | None, OpaPolicy | None]:
    """The YAML rules (the shipped default unless --policy says otherwise) and the OPA server, if any."""
    if settings.policy == "none" or (settings.opa_url and not settings.policy):
        rules = None
    else:
        rules = load_rules(settings.policy or default_rules_path())
    opa = OpaPolicy(settings.opa_url, settings.opa_path, settings.opa_timeout) if settings.opa_url else None
    return rules, opa


def consent_channel(settings: Settings, approvals: ApprovalsStore) -> Consent:
    """Who is asked: the terminal, the approvals API (needs the admin token), or no one.

    `auto`: the terminal when there is one, else approvals when a token is set, else no one.
    """
    mode = settings.consent
    if mode == "auto":
        mode = "terminal" if has_terminal() else ("approvals" if settings.admin_token else "none")
    if mode == "approvals":
        if not settings.admin_token:
            raise ValueError(f"the approvals channel needs an admin token: set {TOKEN_VARIABLE}")
        return ApprovalsConsent(approvals, timeout=settings.consent_timeout)
    if mode == "terminal":
        return TerminalConsent(timeout=settings.consent_timeout)
    return NoConsent()

