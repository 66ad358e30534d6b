"""Every `serve` option, declared once: its default, its help, and where else it may come from.

`toolkeeper serve` builds its command line from these fields, and
`app.build_app(agent, settings)` reads nothing else. Adding an option is one
field here and the code that reads it. Each option comes, by precedence, from

    its flag (--read-timeout 30)  >  TOOLKEEPER_READ_TIMEOUT=30  >  --config FILE (read_timeout: 30)  >  default

A secret (the admin token, a database URL with its password) may also come
from a file, the way container platforms mount them: TOOLKEEPER_ADMIN_TOKEN_FILE
or `admin_token_file:` names the file. Secrets never appear in a repr or a log.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from toolkeeper.common import is_loopback

TOKEN_VARIABLE = "TOOLKEEPER_ADMIN_TOKEN"  # noqa: S105 - the variable's name, not a token
PREFIX = "TOOLKEEPER_"
CONFIG_VARIABLE = "TOOLKEEPER_CONFIG"
STORE_FILE = "toolkeeper.sqlite3"  # serve's store and trail, next to the agent file unless set
AUDIT_FILE = "toolkeeper-audit.sqlite3"
# What the hooks door answers for a call no rule decides (docs/how-to/govern-an-agent-through-its-hooks.md):
# defer, the default, so that installing the hook never grants what the agent would have asked about.
HOOKS_UNDECIDED = ("defer", "allow", "ask")


def describe_hooks_undecided(undecided: str) -> str:
    """What an agent's hook is answered for a call no rule decides, in words (serve's start line, `check`)."""
    meaning = {"defer": "no decision, the agent's own permission flow applies",
               "allow": "allowed, skipping the agent's own permission prompt",
               "ask": "a person is asked"}[undecided]
    return f"hooks_undecided {undecided} (a hook call no rule decides: {meaning})"


class SettingsError(ValueError):
    pass


MIN_TOKEN_LENGTH = 32
PLACEHOLDERS = frozenset({"change-me", "changeme", "change_me", "secret", "password", "admin", "token", "example",
                          "xxx", "x", "test", "replace-me", "todo"})


def option(default: Any, help: str, *, choices: tuple[str, ...] | None = None, metavar: str | None = None,
           flag: bool = True, secret: bool = False) -> Any:
    """A setting: `flag=False` for one that never comes from the command line (the token: a command line is
    visible to every user of the machine); `secret` for one that may come from a file and is never shown."""
    return field(default=default, repr=not secret,
                 metadata={"help": help, "choices": choices, "metavar": metavar, "flag": flag, "secret": secret})


@dataclass(frozen=True)
class Settings:
    agent_file: str | None = option(None, "the agent file (YAML) declaring the tools, instead of serve's argument; the "
                                     "other commands find serve's store and trail next to it", metavar="FILE")
    host: str = option("127.0.0.1", "the address to listen on")
    port: int = option(8787, "the port to listen on; 0 picks a free one")
    upstream: str | None = option(None, "the model server's base URL, instead of the agent file's `upstream:`")
    read_timeout: float = option(300.0, "seconds to wait for the model server's next byte")
    keepalive: float = option(5.0, "seconds between SSE keep-alive comments while a tool runs")
    workers: int = option(1, "processes serving the port, sharing the store (0: one per core)")
    store: str | None = option(None, "hidden history, retries and approvals: an SQLite file (default: "
                                     "toolkeeper.sqlite3 next to the agent file) or a postgresql:// URL, shared by "
                                     "several replicas", secret=True)
    audit: str | None = option(None, "the audit trail: an SQLite file (default: toolkeeper-audit.sqlite3 next to "
                                     "the agent file) or a postgresql:// URL, shared by several replicas",
                               secret=True)
    redact: tuple[str, ...] = option((), "also redact argument values whose names hold PATTERN's words (api_key, "
                                         "apiKey, x-api-key hold `key`; keyword does not), beside the defaults "
                                         "(key, and apikey, sshkey...; a word ending in token, secret, password, "
                                         "passwd, passphrase, credential, authorization); a word may hold *; "
                                         "repeatable",
                                     metavar="PATTERN")
    redact_only: tuple[str, ...] = option((), "redact only values whose names hold PATTERN's words, replacing the "
                                              "defaults; repeatable", metavar="PATTERN")
    history_ttl: float = option(24 * 3600.0, "seconds a hidden exchange is kept for the agent's next request")
    policy: str | None = option(None, "the security team's rules (YAML); default: the shipped "
                                      "policies/default.yaml; `none` for no rules")
    opa_url: str | None = option(None, "the security team's OPA server (http://host:8181); its Rego decides beside "
                                       "the YAML rules (which then apply only when --policy is given)")
    opa_path: str = option("toolkeeper/decision", "the rule OPA evaluates")
    opa_timeout: float = option(1.0, "seconds OPA has to answer; past them the call is denied")
    identity_header: str | None = option(None, "a request header the deployment sets to name the agent; policies "
                                               "read it as agent.header")
    consent: str = option("auto", "who is asked before a gated call: the terminal, the approvals API (needs "
                                  f"${TOKEN_VARIABLE}), or no one (every ask is a deny); auto: the terminal when "
                                  "there is one, else approvals when the token is set",
                          choices=("auto", "terminal", "approvals", "none"))
    consent_timeout: float = option(300.0, "seconds a call waits for an answer before it is denied")
    hooks_undecided: str = option("defer", "what an agent's hook is answered for a call no rule (YAML or OPA) "
                                           "decides: defer (no decision: the agent's own permission flow "
                                           "applies, recorded `deferred`), allow (skip the agent's own prompt), "
                                           "or ask (a person approves it, as for a rule's ask); in the config "
                                           "file also `hooks: {undecided: ...}`",
                                  choices=HOOKS_UNDECIDED)
    allow_origin: tuple[str, ...] = option((), "a web origin (https://app.example) whose pages may call toolkeeper "
                                                "(repeatable; default: none, every request with a browser Origin "
                                                "is refused)", metavar="ORIGIN")
    pass_ungoverned: tuple[str, ...] = option((), "a tool-capable model endpoint toolkeeper does not govern "
                                                  "(/v1/realtime, an Assistants run, a WebSocket on a model "
                                                  "path) to pass on instead of refusing: its tool calls escape "
                                                  "every rule and record (repeatable; logged and counted)",
                                           metavar="PATH")
    agent_keys: str | None = option(None, "a YAML file listing agents and the SHA-256 of their keys (`agents:`, "
                                          "as in the agent file); a request must then present a known key")
    idle_timeout: float = option(15.0, "seconds a connection may stay without a complete request (before its "
                                       "headers, or between requests) before it is closed")
    otlp_endpoint: str | None = option(None, "an OpenTelemetry collector's OTLP address (http://host:4318; gRPC: "
                                             "http://host:4317), instead of $OTEL_EXPORTER_OTLP_ENDPOINT: a span "
                                             "per agent request, model round and declared call (needs the `otel` "
                                             "extra)", metavar="URL")
    otlp_protocol: str | None = option(None, "how spans go to the collector, instead of "
                                             "$OTEL_EXPORTER_OTLP_PROTOCOL (default http/protobuf)",
                                       choices=("http/protobuf", "grpc"))
    event_loop: str = option("auto", "the event loop serve runs on: auto (uvloop where it is installed, which "
                                     "it is wherever it installs: Linux and macOS on CPython; asyncio elsewhere), "
                                     "uvloop (libuv's, in C: less CPU per request), or asyncio (Python's own)",
                             choices=("asyncio", "uvloop", "auto"))
    log_level: str = option("INFO", "DEBUG, INFO, WARNING or ERROR")
    public_url: str | None = option(None, "the URL people and MCP clients reach toolkeeper at "
                                          "(https://toolkeeper.example): the console's sign-in callback, the links "
                                          "notify: channels send, and /mcp's resource identifier; default: the "
                                          "address serve listens on",
                                    metavar="URL")
    trusted_proxy: tuple[str, ...] = option((), "a front proxy's address or network (10.0.0.0/8) whose "
                                                 "--identity-header is believed (repeatable; default: loopback "
                                                 "only); the header from any other peer is refused",
                                            metavar="CIDR")
    auth_algorithms: tuple[str, ...] = option(("RS256", "PS256", "ES256", "EdDSA"),
                                              "the signatures accepted on ID and access tokens (public-key ones "
                                              "only: never none, never HS*)", metavar="ALG")
    auth_oidc_issuer: str | None = option(None, "people sign in to the console through this OpenID provider "
                                                "(its issuer URL; discovery reads its "
                                                "/.well-known/openid-configuration)", metavar="URL")
    auth_oidc_client_id: str | None = option(None, "toolkeeper's client id at the OpenID provider")
    auth_oidc_client_secret: str | None = option(None, "its client secret, from $TOOLKEEPER_AUTH_OIDC_CLIENT_SECRET "
                                                       "or a file", flag=False, secret=True)
    auth_oidc_scopes: tuple[str, ...] = option(("openid", "profile", "email"), "the scopes sign-in asks for "
                                               "(add the one that releases the groups claim)", metavar="SCOPE")
    auth_oidc_groups_claim: str = option("groups", "the ID token's claim that lists the person's groups")
    auth_oidc_roles: tuple[str, ...] = option((), "a group and the role it gives (admin, approver, auditor): "
                                                  "GROUP=ROLE, repeatable; in the config file a mapping "
                                                  "`roles: {platform: admin}`", metavar="GROUP=ROLE")
    auth_oidc_refresh: float = option(300.0, "seconds a person's groups are trusted before the session asks the "
                                             "provider again (a person removed from a group loses its role "
                                             "within this)")
    auth_tokens: str = option("people", "who may use named tokens: people (the console's token sign-in too) or "
                                        "automation-only (the CLI and scripts; people sign in through OIDC)",
                              choices=("people", "automation-only"))
    auth_agents_jwt_issuer: str | None = option(None, "agents may present a JWT from this issuer instead of a "
                                                      "static key", metavar="URL")
    auth_agents_jwt_audience: tuple[str, ...] = option((), "the audience an agent's JWT must name (repeatable)")
    auth_agents_jwt_jwks_url: str | None = option(None, "the issuer's keys (default: its discovery document's "
                                                        "jwks_uri)", metavar="URL")
    auth_agents_jwt_user_claim: str = option("sub", "the JWT claim that names the user a call is for")
    auth_agents_jwt_agent_claim: str | None = option(None, "the JWT claim that names the agent (default: "
                                                           "client_id, else azp, else sub)")
    auth_agents_jwt_groups_claim: str = option("groups", "the JWT claim that lists the user's groups")
    auth_agents_jwt_claims: tuple[str, ...] = option((), "a JWT claim rules may read as principal.claims.NAME "
                                                         "(repeatable; never the raw token)", metavar="NAME")
    auth_mcp_issuer: str | None = option(None, "/mcp is an OAuth 2.1 protected resource whose access tokens "
                                               "come from this authorization server (the MCP authorization "
                                               "specification)", metavar="URL")
    auth_mcp_scopes: tuple[str, ...] = option((), "the scopes an access token for /mcp must hold, all of them "
                                                   "(its resource metadata lists them)", metavar="SCOPE")
    admin_token: str | None = option(None, f"the admin API's token, from ${TOKEN_VARIABLE}", flag=False,
                                     secret=True)
    agent_key: str | None = option(None, "the agent key `toolkeeper hook` presents to serve (one listed under "
                                         "`agents:`), from $TOOLKEEPER_AGENT_KEY", flag=False, secret=True)
    reuse_port: bool = option(False, "listen with SO_REUSEPORT, so that a supervisor holding the port (toolkeeper "
                                     "intercept) keeps it between restarts", flag=False)
    intercept_secret: str | None = option(None, "the key `toolkeeper intercept` signs X-Toolkeeper-Upstream with "
                                                "(it sets it for the toolkeeper it starts)", flag=False, secret=True)
    intercept_upstreams: tuple[str, ...] = option((), "the origins (https://host) `toolkeeper intercept` routes: "
                                                      "the only upstreams a signed header may name", flag=False)

    def check_exposure(self) -> None:
        """Beyond loopback, the admin token guards the approvals and the trail from the network: a placeholder,
        or one short enough to guess, is refused when serve starts (the commands that read the store need no
        such check: they listen on nothing)."""
        token = self.admin_token
        if token is not None and not is_loopback(self.host) and (
                len(token) < MIN_TOKEN_LENGTH or token.strip().lower() in PLACEHOLDERS):
            raise SettingsError(f"{TOKEN_VARIABLE} is a placeholder or shorter than {MIN_TOKEN_LENGTH} characters, "
                                f"and toolkeeper would listen on {self.host}, beyond this machine: make one with "
                                "`openssl rand -hex 32` (or listen on 127.0.0.1)")

    def kept(self, what: str, agent_directory: Path | None = None) -> str:
        """Where serve keeps its `store` or its `audit` trail: the setting, else its file next to the agent file
        (serve's loaded one, else `agent_file`; in the current directory when none is named)."""
        given = getattr(self, what)
        if given:
            return given
        name = STORE_FILE if what == "store" else AUDIT_FILE
        if agent_directory is None and self.agent_file:
            agent_directory = Path(self.agent_file).resolve().parent  # as the agent file's loader resolves it
        return str(agent_directory / name) if agent_directory else name

    @property
    def local_url(self) -> str:
        """Where a command on this machine reaches serve: its address, a wildcard one as loopback."""
        host = self.host.strip("[]")
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # noqa: S104
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @classmethod
    def client_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """What the commands that talk to serve, or read its store and trail, take to find them: the same config
        file and TOOLKEEPER_* variables as serve."""
        parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                            help=f"serve's config file, to find what it serves (default: ${CONFIG_VARIABLE})")
        parser.add_argument("--agent-file", metavar="FILE", default=argparse.SUPPRESS,
                            help="serve's agent file: its store and trail are next to it unless set (default: "
                            "$TOOLKEEPER_AGENT_FILE, or `agent_file:` in the config file)")

    @classmethod
    def for_command(cls, arguments: argparse.Namespace) -> Settings:
        """A command's settings, or its exit with what is wrong."""
        try:
            return cls.from_arguments(arguments)
        except SettingsError as exc:
            print(f"toolkeeper: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per setting (`read_timeout` -> `--read-timeout`), typed by its default; a flag not given is
        None, so the environment and the config file can fill it."""
        parser.add_argument("--config", metavar="FILE", help="read options from a YAML file of flat keys named like "
                            f"the long options (read_timeout: 30); default: ${CONFIG_VARIABLE}")
        for setting in fields(cls):
            meta = setting.metadata
            if not meta["flag"]:
                continue
            shown = f" (default {setting.default})" if setting.default not in (None, ()) else ""
            kwargs: dict[str, Any] = {"help": meta["help"] + shown, "default": None, "dest": setting.name}
            if meta["choices"]:
                kwargs["choices"] = meta["choices"]
            if meta["metavar"]:
                kwargs["metavar"] = meta["metavar"]
            if isinstance(setting.default, tuple):
                kwargs["action"] = "append"
            elif isinstance(setting.default, (int, float)) and not isinstance(setting.default, bool):
                kwargs["type"] = type(setting.default)
            parser.add_argument("--" + setting.name.replace("_", "-"), **kwargs)

    @classmethod
    def from_arguments(cls, arguments: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
        """Flags > TOOLKEEPER_* variables > the config file > defaults; raises SettingsError saying what is wrong."""
        environ = dict(os.environ) if environ is None else environ
        config = getattr(arguments, "config", None) or environ.get(CONFIG_VARIABLE)
        values: dict[str, tuple[Any, str]] = {}  # each value, and where it came from (for what is wrong with it)
        values.update({name: (value, str(config)) for name, value in (read_config(config) if config else {}).items()})
        values.update({name: (value, PREFIX + name.upper()) for name, value in from_environment(environ).items()})
        values.update({s.name: (getattr(arguments, s.name), "--" + s.name.replace("_", "-")) for s in fields(cls)
                       if s.metadata["flag"] and getattr(arguments, s.name, None) is not None})
        return cls(**{name: typed(name, value, where) for name, (value, where) in values.items()})


SETTINGS = {setting.name: setting for setting in fields(Settings)}


def typed(name: str, value: Any, where: str = "") -> Any:
    """A value from a flag, a variable or the file (`where`: which, said when it is wrong), as the setting's type (a
    list for a repeatable one)."""
    said = f"{where}: {name}" if where else name
    setting = SETTINGS[name]
    default = setting.default
    try:
        if isinstance(default, tuple):
            if isinstance(value, dict):  # pairs, from the config file: {platform: admin} is platform=admin
                value = [f"{key}={item}" for key, items in value.items()
                         for item in (items if isinstance(items, list) else [items])]
            items = value.split(",") if isinstance(value, str) else value
            value = tuple(str(item).strip() for item in items if str(item).strip())
        elif isinstance(default, bool):
            value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
        elif isinstance(default, (int, float)):
            value = type(default)(value)
        elif value is not None:
            value = str(value)
    except (TypeError, ValueError):
        kind = {int: "an integer", float: "a number"}.get(type(default), "a text")
        raise SettingsError(f"{said}: {value!r} is not {kind}") from None
    choices = setting.metadata["choices"]
    if choices and value not in choices:
        raise SettingsError(f"{said}: {value!r} is not one of {', '.join(choices)}")
    return value


def from_environment(environ: dict[str, str]) -> dict[str, Any]:
    """TOOLKEEPER_READ_TIMEOUT=30, TOOLKEEPER_ALLOW_ORIGIN=https://a,https://b; a secret also from *_FILE, which
    wins over the plain variable (an image may set the plain one as its default)."""
    values: dict[str, Any] = {}
    for name, setting in SETTINGS.items():
        variable = PREFIX + name.upper()
        if setting.metadata["secret"] and environ.get(variable + "_FILE"):
            values[name] = read_secret(environ[variable + "_FILE"], variable + "_FILE")
        elif environ.get(variable):
            values[name] = environ[variable]
    return values


def read_config(path: str) -> dict[str, Any]:
    """The config file: keys named like the long options (dashes or underscores), or grouped by their first word
    (`hooks: {undecided: ask}`); `<secret>_file` names a file holding a secret."""
    import yaml  # only when a config file is used

    try:
        with open(path, encoding="utf-8") as handle:
            loaded = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise SettingsError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"the config file {path} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise SettingsError(f"the config file {path} must be a mapping of option names to values")
    values: dict[str, Any] = {}
    for key, value in _grouped(loaded):
        name = str(key).replace("-", "_")
        if name.endswith("_file") and name[:-5] in SETTINGS and SETTINGS[name[:-5]].metadata["secret"]:
            values[name[:-5]] = read_secret(str(value), f"{key} in {path}")
        elif name in SETTINGS:
            values[name] = value
        else:
            known = ", ".join(sorted(SETTINGS))
            raise SettingsError(f"{path}: unknown option {key!r} (known: {known})")
    return values


def _grouped(loaded: dict[Any, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The config file's keys, a group's spelled out: `hooks: {undecided: ask}` is `hooks_undecided: ask`, and
    `auth: {oidc: {issuer: ...}}` is `auth_oidc_issuer`. A mapping is a group, unless it is the value of a
    setting that takes pairs (`auth: {oidc: {roles: {platform: admin}}}`)."""
    keys: list[tuple[str, Any]] = []
    for key, value in loaded.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name.replace("-", "_") not in SETTINGS:
            keys += _grouped(value, name + "_")
        else:
            keys.append((name, value))
    return keys


def read_secret(path: str, where: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise SettingsError(f"cannot read the secret file named by {where}: {exc.strerror or exc}") from None
