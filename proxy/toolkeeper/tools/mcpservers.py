"""The agent's MCP servers, as the agent file lists them (`mcp_servers:`), and a declared tool run by one.

    mcp_servers:
      - name: files
        command: [npx, -y, "@modelcontextprotocol/server-filesystem", /srv/shared]
      - name: tickets
        url: https://mcp.example.com/mcp
        headers: {Authorization: "Bearer ${TICKETS_TOKEN}"}
      - name: wiki
        url: https://wiki.example.com/mcp
        auth: {token_exchange: {issuer: https://id.example.com, client_id: toolkeeper,
                                client_secret_env: WIKI_CLIENT_SECRET, resource: https://wiki.example.com/mcp}}

toolkeeper connects to each and serves its tools as `mcp__<server>__<tool>`.
A secret comes from the environment (`${VAR}` in a header, `env:` names passed
through to a command, `client_secret_env:`), never from the file itself, and is
never recorded. A `url:` server that needs OAuth gets a token of its own:
toolkeeper's (`client_credentials`), or the caller's exchanged for one made for
that server (`token_exchange`, RFC 8693); the caller's token itself is never
sent on.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from toolkeeper.common import Strict
from toolkeeper.tools.labels import Labels, McpToolSettings, SecretsMode

# No "__" inside, and no "_" at its end: `mcp__<server>__<tool>` is split at the first "__" after the prefix, so a
# server `fake_` would make `mcp__fake___x` read as server `fake`, tool `_x`.
SERVER_NAME = re.compile(r"[a-zA-Z0-9_-]{0,31}[a-zA-Z0-9-]")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
PROXIED_PREFIX = "mcp__"
# Refused to a declared tool (at load, as a reserved name): it could take a proxied tool's name, listed twice on /mcp
# with its calls split between the two, and a rule about one would be read as about the other.
PROXIED_NAMES = f"names starting {PROXIED_PREFIX} are MCP servers' tools, {PROXIED_PREFIX}<server>__<tool>"


class OAuthClient(Strict):
    """How toolkeeper gets a token for one server: its client at an authorization server, and whom the token is
    for (`resource`, RFC 8707, and/or `audience`, as the server names itself)."""

    token_url: str | None = None
    issuer: str | None = None  # its discovery document names the token endpoint
    client_id: str = Field(min_length=1)
    client_secret_env: str | None = None  # the variable holding the secret; none: a public client
    scope: str | None = None
    resource: str | None = None
    audience: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> OAuthClient:
        if (self.token_url is None) == (self.issuer is None):
            raise ValueError("give either `token_url:` (the token endpoint) or `issuer:` (its discovery document "
                             "names the token endpoint)")
        for name in ("token_url", "issuer", "resource"):
            value = getattr(self, name)
            if value is not None and not re.match(r"^https?://[^/\s@]+", value):
                raise ValueError(f"`{name}:` must be an http:// or https:// address, without user:password@")
        if self.client_secret_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.client_secret_env):
            raise ValueError("`client_secret_env:` is the name of a variable (the secret itself never goes in "
                             "the file)")
        return self

    def secret(self) -> str | None:
        """The client secret from the environment; KeyError naming the variable when it is not set."""
        return None if self.client_secret_env is None else _variable(self.client_secret_env, "client_secret_env")


class McpServerAuth(Strict):
    """`auth:` of a `url:` server: exactly one way to get its token."""

    client_credentials: OAuthClient | None = None  # toolkeeper's own token, the same for every caller
    token_exchange: OAuthClient | None = None  # each caller's token exchanged for one made for this server

    @model_validator(mode="after")
    def _one_way(self) -> McpServerAuth:
        if (self.client_credentials is None) == (self.token_exchange is None):
            raise ValueError("give one of `client_credentials:` (toolkeeper's own token for this server) or "
                             "`token_exchange:` (the caller's token exchanged for one for this server)")
        if self.token_exchange is not None and not (self.token_exchange.resource or self.token_exchange.audience):
            raise ValueError("`token_exchange:` needs `resource:` or `audience:`: the exchanged token must be made "
                             "for this server, and for it alone")
        return self

    @property
    def client(self) -> OAuthClient:
        return self.client_credentials or self.token_exchange  # type: ignore[return-value]

    @property
    def per_caller(self) -> bool:
        """Whether each caller gets a token (and a connection) of its own."""
        return self.token_exchange is not None


class McpServerSpec(Strict):
    """One `mcp_servers:` entry: a command (stdio) or a URL (Streamable HTTP)."""

    name: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    env: tuple[str, ...] | dict[str, str] = ()
    workdir: str | None = None
    timeout: float = Field(default=60, gt=0, le=24 * 3600)  # seconds a call may take before it is abandoned
    # seconds a listing of its tools decides calls for (engine/mcppins.py); 0: it is listed before every call
    pin_recheck: float = Field(default=60, ge=0, le=24 * 3600)
    tier: Literal["gated", "silent"] = "gated"  # as a declared tool's: gated calls ask unless yolo or a rule allows
    auth: McpServerAuth | None = None  # OAuth: a token fetched for this server (url: servers only)
    labels: Labels = ()  # every tool of the server's (labels.py)
    secrets: SecretsMode = "redact"  # a secret in a tool's result, unless the tool says otherwise
    tools: dict[str, McpToolSettings] = Field(default_factory=dict)  # by the server's own name of the tool

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str) -> str:
        if not SERVER_NAME.fullmatch(value) or "__" in value:
            read_as, _, tool = f"{value}__x".partition("__")
            raise ValueError(f"{value!r}: a server name is 1 to 32 letters, digits, '_' or '-', without '__' and not "
                             f"ending in '_': its tools are named mcp__<server>__<tool>, and such a name is ambiguous "
                             f"(mcp__{value}__x reads as server {read_as!r}, tool {tool!r})")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either `command:` (a list: the server's argv, run over stdio) or `url:` "
                             "(its Streamable HTTP endpoint)")
        if self.command is not None and not self.command:
            raise ValueError("`command:` needs the program, then its arguments")
        if self.url is not None and not re.match(r"^https?://[^/\s@]+", self.url):
            raise ValueError("`url:` must be an http:// or https:// address, without user:password@")
        if self.url is None and (self.headers or self.auth is not None):
            raise ValueError("`headers:` and `auth:` apply to a `url:` server")
        if self.auth is not None and any(name.lower() == "authorization" for name in self.headers):
            raise ValueError("`auth:` sets the Authorization header: give it, or an Authorization header, not both")
        if self.url is not None and (self.env or self.workdir is not None):
            # refused, not ignored: a reader would believe the server gets them
            raise ValueError("`env:` and `workdir:` apply to a `command:` server; a `url:` server runs elsewhere")
        return self

    def proxied_name(self, tool: str) -> str:
        """The name its tool is served and ruled by, as Claude Code names MCP tools."""
        return f"{PROXIED_PREFIX}{self.name}__{tool}"

    def labels_of(self, tool: str) -> tuple[str, ...]:
        """A tool's labels: the server's, and the tool's own."""
        own = self.tools.get(tool)
        return tuple(sorted({*self.labels, *own.labels})) if own is not None else self.labels

    def secrets_of(self, tool: str) -> SecretsMode:
        own = self.tools.get(tool)
        return own.secrets if own is not None and own.secrets is not None else self.secrets

    def resolved_headers(self) -> dict[str, str]:
        """The headers with `${VAR}` taken from the environment; a missing variable is an error, not an empty
        secret."""
        return {name: VARIABLE.sub(lambda found, name=name: _variable(found.group(1), f"header {name}"), value)
                for name, value in self.headers.items()}

    def environment(self) -> dict[str, str]:
        if isinstance(self.env, dict):
            return dict(self.env)
        return {name: os.environ[name] for name in self.env if name in os.environ}

    def missing_variables(self) -> list[str]:
        """The variables its headers name that the environment does not set."""
        return [name for value in self.headers.values() for name in VARIABLE.findall(value) if name not in os.environ]


class McpTarget(Strict):
    """`mcp: {server: NAME, tool: TOOL}` on a declared tool: that server's tool runs the call."""

    server: str
    tool: str = Field(min_length=1)


def _variable(name: str, where: str) -> str:
    if name not in os.environ:
        raise KeyError(f"the variable {name} ({where}) is not set")
    return os.environ[name]
