"""The composition root: the one place that knows every layer and wires them together.

    agent file + Settings -> stores, audit trail, policy sources, consent channel,
    runners -> CallHandler -> Engine -> the HTTP app (proxy routes + /toolkeeper/)

Nothing else builds these objects; each layer gets what it needs from here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web

from toolkeeper.audit import Observer, Redactor, SQLAudit, open_audit
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
from toolkeeper.tools import Agent, load_agent_keys
from toolkeeper.wire import AdminGuard, AuditPage, Check, admin_app, approvals_api, proxy_app

log = logging.getLogger("toolkeeper")

POLICY = web.AppKey("policy", Policy)
STORE_FILE = "toolkeeper.sqlite3"
AUDIT_FILE = "toolkeeper-audit.sqlite3"


@dataclass
class Stores:
    """What toolkeeper keeps: hidden history and retries, approvals, and the audit trail."""

    store: SQLiteStore
    approvals: ApprovalsStore
    audit: SQLAudit

    @classmethod
    def open(cls, agent: Agent, settings: Settings) -> Stores:
        store_path = settings.store or agent.directory / STORE_FILE
        redactor = Redactor.from_settings(settings.redact, settings.redact_only)
        audit = open_audit(settings.audit or agent.directory / AUDIT_FILE, redactor)
        closed = audit.close_interrupted()
        if closed:
            log.warning("%d calls were left running by a toolkeeper that stopped: closed as interrupted", closed)
        return cls(SQLiteStore(store_path), ApprovalsStore(store_path), audit)

    def checks(self) -> dict[str, Check]:
        """For /readyz: each raises when its store does not answer."""
        return {"store": lambda: self.store.get_call_result("readyz"), "audit": self.audit.check}

    def close(self) -> None:
        self.store.close()
        self.approvals.close()
        self.audit.close()


def build_app(agent: Agent, settings: Settings, *, consent: Consent | None = None,
              observers: Iterable[Observer] = ()) -> web.Application:
    """The app for one agent file. `consent` and `observers` stand in for the channel and add record readers
    (the demo answers for the user, tests read records); everything else comes from `settings`."""
    stores = Stores.open(agent, settings)
    policy = Policy(agent.config.yolo, *policy_sources(settings))
    for warning in policy.rules.warnings(agent) if policy.rules else ():
        log.warning("%s", warning)
    consent = consent or consent_channel(settings, stores.approvals)
    metrics = Metrics()
    calls = CallHandler(runners=runners_for({tool.spec.runner for tool in agent.tools.values()}), consent=consent,
                        policy=policy, store=stores.store, observers=[metrics.record, *observers],
                        audit=stores.audit, forwarded_ttl=settings.history_ttl)
    history = History(stores.store, settings.history_ttl)
    engine = Engine(agent, calls, history=history, metrics=metrics)
    metrics.counted_elsewhere(
        "toolkeeper_history_restorations_total",
        "Assistant messages given back their hidden exchange (hit), or whose exchange was not found: "
        "expired or edited history (miss).",
        lambda: {(("outcome", outcome),): float(history.counts[outcome]) for outcome in ("hit", "miss")})

    guard = AdminGuard(settings.admin_token)
    channel = consent if isinstance(consent, ApprovalsConsent) else None
    admin = admin_app(guard, approvals_api(stores.approvals, channel), AuditPage(stores.audit, guard))
    api_key = os.environ[agent.config.api_key_env] if agent.config.api_key_env else None
    app = proxy_app(engine, settings, upstream_url=agent.config.upstream, api_key=api_key, metrics=metrics,
                    admin=admin, agent_keys=agent_keys(agent, settings), checks=stores.checks(), store=stores.store)

    async def close(app: web.Application) -> None:
        if policy.opa is not None:
            await policy.opa.close()
        stores.close()

    app.on_cleanup.append(close)
    app[POLICY] = policy
    return app


def agent_keys(agent: Agent, settings: Settings) -> dict[str, str]:
    """The agents allowed in, by the SHA-256 of their keys: the agent file's `agents:` and --agent-keys."""
    keys = {entry.key_sha256: entry.name for entry in agent.config.agents}
    if settings.agent_keys:
        keys.update(load_agent_keys(settings.agent_keys))
    if agent.config.api_key_env and not keys:
        log.warning("toolkeeper holds the upstream key (api_key_env) and no agent keys are listed: every request "
                    "is refused until `agents:` or --agent-keys names the agents")
    return keys


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

