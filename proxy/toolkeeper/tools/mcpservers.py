"""The agent's MCP servers, as the agent file lists them (`mcp_servers:`), and a declared tool run by one.

    mcp_servers:
      - name: files
        command: [npx, -y, "@modelcontextprotocol/server-filesystem", /srv/shared]
      - name: tickets
        url: https://mcp.example.com/mcp
        headers: {Authorization: "Bearer ${TICKETS_TOKEN}"}

toolkeeper connects to each and serves its tools as `mcp__<server>__<tool>`.
A secret comes from the environment (`${VAR}` in a header, `env:` names passed
through to a command), never from the file itself, and is never recorded.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from toolkeeper.common import Strict

# No "__" inside, and no "_" at its end: `mcp__<server>__<tool>` is split at the first "__" after the prefix, so a
# server `fake_` would make `mcp__fake___x` read as server `fake`, tool `_x`.
SERVER_NAME = re.compile(r"[a-zA-Z0-9_-]{0,31}[a-zA-Z0-9-]")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
PROXIED_PREFIX = "mcp__"
# Refused to a declared tool (at load, as a reserved name): it could take a proxied tool's name, listed twice on /mcp
# with its calls split between the two, and a rule about one would be read as about the other.
PROXIED_NAMES = f"names starting {PROXIED_PREFIX} are MCP servers' tools, {PROXIED_PREFIX}<server>__<tool>"


class McpServerSpec(Strict):
    """One `mcp_servers:` entry: a command (stdio) or a URL (Streamable HTTP)."""

    name: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    env: tuple[str, ...] | dict[str, str] = ()
    workdir: str | None = None
    timeout: float = Field(default=60, gt=0, le=24 * 3600)  # seconds a call may take before it is abandoned
    tier: Literal["gated", "silent"] = "gated"  # as a declared tool's: gated calls ask unless yolo or a rule allows

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
        if self.url is None and self.headers:
            raise ValueError("`headers:` apply to a `url:` server")
        if self.url is not None and (self.env or self.workdir is not None):
            # refused, not ignored: a reader would believe the server gets them
            raise ValueError("`env:` and `workdir:` apply to a `command:` server; a `url:` server runs elsewhere")
        return self

    def proxied_name(self, tool: str) -> str:
        """The name its tool is served and ruled by, as Claude Code names MCP tools."""
        return f"{PROXIED_PREFIX}{self.name}__{tool}"

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
