"""The composition root: the one place that knows every layer and wires them together.

    agent file + Settings -> stores, audit trail, policy sources, consent channel,
    runners -> CallHandler -> Engine -> the HTTP app (proxy routes + /toolkeeper/)

Nothing else builds these objects; each layer gets what it needs from here.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiohttp import web

from toolkeeper import __version__
from toolkeeper.audit import Observer, Redactor, SQLAudit, open_audit
from toolkeeper.common import is_loopback
from toolkeeper.engine import CallHandler, Engine, History, HookCalls, McpDoor
from toolkeeper.identity import Identity, build_identity
from toolkeeper.metrics import Metrics
from toolkeeper.policy import (
    ApprovalsConsent,
    Consent,
    NoConsent,
    OpaPolicy,
    Policy,
    Rules,
    RulesError,
    TerminalConsent,
    has_terminal,
    prepare_secrets,
    rules_in_force,
    scrub_secrets,
)
from toolkeeper.runners import McpRunner, McpServers, Runner, runners_for
from toolkeeper.settings import TOKEN_VARIABLE, Settings, describe_hooks_undecided
from toolkeeper.store import Store, open_store
from toolkeeper.tools import Agent, AgentFileError, lint_agent, load_agent_file, load_agent_keys
from toolkeeper.tracing import Tracing
from toolkeeper.wire import (
    AdminGuard,
    Check,
    Console,
    Doors,
    LimitsView,
    Notifier,
    admin_app,
    approvals_api,
    build_server,
    limits_api,
    pins_api,
    proxy_app,
    tools_api,
)

log = logging.getLogger("toolkeeper")


@dataclass
class Stores:
    """What toolkeeper keeps: hidden history, retries and approvals (the store), and the audit trail."""

    store: Store
    audit: SQLAudit

    @classmethod
    def open(cls, agent: Agent, settings: Settings) -> Stores:
        # the trail keeps no secret the detector finds, whatever its name; its plugins load now, not in a request
        prepare_secrets()
        redactor = Redactor.from_settings(settings.redact, settings.redact_only, scrub_secrets)
        audit = open_audit(settings.kept("audit", agent.directory), redactor)
        closed = audit.close_interrupted()
        if closed:
            log.warning("%d calls were left running by a toolkeeper that stopped: closed as interrupted", closed)
        try:
            store = open_store(settings.kept("store", agent.directory))
        except BaseException:
            audit.close()
            raise
        return cls(store, audit)

    def checks(self) -> dict[str, Check]:
        """For /readyz: each raises when its store does not answer."""
        return {"store": self.store.check, "audit": lambda: asyncio.to_thread(self.audit.check)}

    async def close(self) -> None:
        await self.store.close()
        self.audit.close()


def build_app(agent: Agent, settings: Settings, *, consent: Consent | None = None,
              observers: Iterable[Observer] = ()) -> web.Application:
    """The app for one agent file. `consent` and `observers` stand in for the channel and add record readers
    (the demo answers for the user, tests read records); everything else comes from `settings`."""
    tracing = Tracing.start(settings.otlp_endpoint, settings.otlp_protocol, __version__)  # None: off
    identity = build_identity(settings)  # before anything opens: a wrong `auth:` stops serve with what is wrong
    stores = Stores.open(agent, settings)
    opa = OpaPolicy(settings.opa_url, settings.opa_path, settings.opa_timeout) if settings.opa_url else None
    rules = agent_rules(settings, agent)
    policy = Policy(agent.config.yolo, rules, opa)
    metrics = Metrics()
    # asks sent to the policy's `notify:` channels: the policy read when each is sent (a reload replaces it)
    notifier = None if consent else notifier_for(settings, rules, lambda: handler.policy, stores.store, metrics)
    consent = consent or consent_channel(settings, stores.store, notifier)
    for rule in rules.rules if rules else ():  # the shadow rules' series, there from the start
        if rule.mode == "shadow":
            metrics.expect("toolkeeper_shadow_matches_total", effect=rule.effect, rule=rule.id)
    metrics.named_groups(configured_groups(rules, settings))
    servers = McpServers(agent.config.mcp_servers, agent.directory)
    handler = CallHandler(runners=tool_runners(agent, servers), consent=consent,
                          policy=policy, store=stores.store, observers=[metrics.record, *observers],
                          audit=stores.audit, forwarded_ttl=settings.history_ttl, metrics=metrics,
                          session_ttl=settings.history_ttl)
    history = History(stores.store, settings.history_ttl, metrics)
    engine = Engine(agent, handler, history=history, metrics=metrics)

    guard = AdminGuard(settings.admin_token, stores.store, people=identity.people, tokens=settings.auth_tokens)
    # the limits of the policy in force, whichever that is when asked (a reload replaces it)
    limits = LimitsView(lambda: handler.policy, stores.store, stores.audit, metrics)
    metrics.readers.append(limits.gauges)  # read from the store at each scrape: the same on every replica
    admin = admin_app(guard, approvals_api(stores.store), Console(stores.audit, stores.store, guard),
                      tools_api(lambda: sorted(engine.agent.tools)), pins_api(stores.store, stores.audit),
                      limits_api(limits))
    api_key = os.environ[agent.config.api_key_env] if agent.config.api_key_env else None
    mcp_server = build_server(McpDoor(engine, servers, stores.store), consent, __version__, tracing)
    doors = Doors(mcp_server, HookCalls(engine.agent_calls, settings.hooks_undecided), settings.host)
    app = proxy_app(engine, settings, upstream_url=agent.config.upstream, api_key=api_key, metrics=metrics,
                    admin=admin, agent_keys=agent_keys(agent, settings), checks=stores.checks(), store=stores.store,
                    doors=doors, tracing=tracing, identity=identity)

    async def close(app: web.Application) -> None:
        await servers.close()
        await identity.close()
        if opa is not None:
            await opa.close()
        await stores.close()
        if tracing is not None:  # the batched spans sent, from a thread: a collector away may take seconds
            await asyncio.to_thread(tracing.shutdown)

    app.on_cleanup.append(close)
    if notifier is not None:  # its deliveries end before the store closes
        app.on_shutdown.append(lambda app: notifier.close())
    app[RELOAD] = Reloader(engine, settings, identity)
    app[MCP_SERVER] = mcp_server
    app[IDENTITY] = identity
    return app


def tool_runners(agent: Agent, servers: McpServers) -> dict[str, Runner]:
    """The runners the declared tools need; an MCP server's tool runs through the agent's connection to it."""
    runners = runners_for({tool.spec.runner for tool in agent.tools.values()})
    if servers:
        runners["mcp"] = McpRunner(servers)
    return runners


class Reloader:
    """SIGHUP: the agent file and the rules read again, and used by the turns that begin after; when either
    does not load, the ones in force stay (logged). The audit record names the revisions that decided."""

    def __init__(self, engine: Engine, settings: Settings, identity: Identity | None = None):
        self.engine = engine
        self.settings = settings
        self.identity = identity

    def describe(self) -> str:
        """Which sources decide, what the hooks door answers for a call none decides, and who may call (when
        `auth:` says), for the start line."""
        who = self.identity.describe() if self.identity is not None else ""
        return (f"{self.engine.handler.policy.describe()}, {describe_hooks_undecided(self.settings.hooks_undecided)}"
                + (f", {who}" if who else ""))

    def __call__(self) -> bool:
        old = self.engine.agent
        try:
            agent = load_agent_file(old.path, upstream=self.settings.upstream)
            errors = [finding.line() for finding in lint_agent(agent) if finding.severity == "error"]
            if errors:
                raise AgentFileError(f"{agent.path}: " + "; ".join(errors))
            rules = agent_rules(self.settings, agent)
            runners = runners_for({tool.spec.runner for tool in agent.tools.values()})
        except (AgentFileError, RulesError, OSError, ValueError) as exc:
            log.error("reload failed, the agent file and the rules in force are kept: %s", exc)
            return False
        for key in ("upstream", "api_key_env", "agents", "mcp_servers"):
            if getattr(agent.config, key) != getattr(old.config, key):
                log.warning("the agent file's %s changed: it takes effect at the next restart", key)
        handler = self.engine.handler
        handler.reload(policy=Policy(agent.config.yolo, rules, handler.policy.opa), runners=runners)
        handler.metrics.named_groups(configured_groups(rules, self.settings))
        self.engine.use(agent)
        log.info("reloaded: %d declared tools from %s @%s, %s", len(agent.tools), agent.path, agent.revision,
                 self.describe())
        return True


RELOAD = web.AppKey("reload", Reloader)
MCP_SERVER = web.AppKey("mcp_server", object)  # the MCP server of /mcp, also served over stdio by `toolkeeper mcp`
IDENTITY = web.AppKey("identity", Identity)  # who calls: the checkers the `auth:` settings asked for


def agent_keys(agent: Agent, settings: Settings) -> dict[str, str]:
    """The agents allowed in, by the SHA-256 of their keys: the agent file's `agents:` and --agent-keys."""
    keys = {entry.key_sha256: entry.name for entry in agent.config.agents}
    if settings.agent_keys:
        keys.update(load_agent_keys(settings.agent_keys))
    if agent.config.api_key_env and not keys:
        log.warning("toolkeeper holds the upstream key (api_key_env) and no agent keys are listed: every request "
                    "is refused until `agents:` or --agent-keys names the agents")
    elif not keys and not is_loopback(settings.host):
        log.warning("serving on %s with no agent keys listed: anyone who can reach this port can send requests "
                    "whose model calls the declared tools; list the agents (`agents:` or --agent-keys)",
                    settings.host)
    return keys


def agent_rules(settings: Settings, agent: Agent) -> Rules | None:
    """The YAML rules in force (`policy.rules_in_force`), each warning about this agent file logged."""
    rules = rules_in_force(settings.policy, settings.opa_url)
    for warning in rules.warnings(agent) if rules else ():
        log.warning("%s", warning)
    scoped = [limit.id for limit in (rules.limits if rules else ()) if {"user", "agent", "group"} & set(limit.scope)]
    if scoped and not (agent.config.agents or settings.agent_keys or settings.auth_agents_jwt_issuer):
        log.warning("limits %s count by user, agent or group, and no agent keys are listed nor JWTs required: an "
                    "agent is known by a hash of whatever key it sends, so one that sends a new key each time is "
                    "counted afresh; list the agents (`agents:`, --agent-keys) or require JWTs", ", ".join(scoped))
    return rules


def configured_groups(rules: Rules | None, settings: Settings) -> set[str]:
    """The groups /metrics counts calls by (metrics.py says why no others): those the rules test, and those
    `auth.oidc.roles` maps to a role."""
    return (rules.named_groups() if rules else set()) | {pair.rpartition("=")[0] for pair in settings.auth_oidc_roles}


def consent_mode(settings: Settings) -> str:
    """--consent, with `auto` resolved: the terminal when there is one, else approvals when a token is set or
    people sign in through the OpenID provider."""
    if settings.consent != "auto":
        return settings.consent
    answerable = settings.admin_token or settings.auth_oidc_issuer  # someone can reach the approvals API
    return "terminal" if has_terminal() else ("approvals" if answerable else "none")


def notifier_for(settings: Settings, rules: Rules | None, policy: Callable[[], Policy], store: Store,
                 metrics: Metrics) -> Notifier | None:
    """What sends each ask to its `notify:` channels, when asks wait in the approvals store (a person answers
    them from the link, anywhere); the policy may declare channels later, at a reload. None for the terminal,
    whose asks reach no one else."""
    if consent_mode(settings) != "approvals":
        if rules is not None and rules.channels:
            log.warning("the policy declares notify: channels, but --consent is %s, not approvals: no ask is sent "
                        "to them", consent_mode(settings))
        return None
    console_url = (settings.public_url or settings.local_url).rstrip("/")
    if rules is not None and rules.channels and not settings.public_url:
        log.warning("the links in the notify: channels' messages lead to %s, the address serve listens on: set "
                    "--public-url to the address people reach toolkeeper at", console_url)
    notifier = Notifier(policy, store, metrics, console_url)
    notifier.expect_series(rules)
    return notifier


def consent_channel(settings: Settings, store: Store, notifier: Notifier | None = None) -> Consent:
    """Who is asked: the terminal, the approvals API (needs the admin token, or people signing in through the
    provider), or no one.

    `auto`: the terminal when there is one, else approvals when someone can answer there, else no one.
    """
    mode = consent_mode(settings)
    if mode == "approvals":
        if not settings.admin_token and not settings.auth_oidc_issuer:
            raise ValueError(f"the approvals channel needs someone to answer it: set {TOKEN_VARIABLE}, or auth.oidc")
        return ApprovalsConsent(store, timeout=settings.consent_timeout,
                                announce=notifier.announce if notifier is not None else None)
    if mode == "terminal":
        return TerminalConsent(timeout=settings.consent_timeout)
    return NoConsent()

