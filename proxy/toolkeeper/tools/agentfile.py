"""The agent file: declared tools, validated once at load into frozen objects.

Every other list toolkeeper keeps about its tools (the schemas sent to the
model, the silent set, the reserved names) is derived from what is loaded here;
nothing is declared twice.

A broken file raises `AgentFileError`, whose message names the file, the tool
and the key, so `toolkeeper serve` can exit before it listens.
"""

from __future__ import annotations

import os
import re
import shutil
import unicodedata
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from toolkeeper.common import Strict, load_yaml_model, regex, sha256_hex
from toolkeeper.tools.labels import Labels, SecretsMode
from toolkeeper.tools.mcpservers import PROXIED_NAMES, PROXIED_PREFIX, McpServerSpec, McpTarget
from toolkeeper.tools.templates import CommandTemplate, TemplateError

# The usual built-in tool names of agents (Claude Code, Codex, OpenHands, Aider,
# Cline, Goose, the OpenAI Agents SDK...), plus the names toolkeeper injects
# itself. A declared tool may never take one, even when the agent does not send
# that tool today, so that turning it on later does not break the file.
# Documented in docs/reference/agent-file.md.
DEFAULT_RESERVED_NAMES = frozenset(
    {
        # toolkeeper's own
        "search_tools",
        # shells and code execution
        "bash", "shell", "sh", "exec", "execute", "execute_command", "run", "run_command",
        "run_shell_command", "terminal", "local_shell", "python", "code_interpreter",
        "computer", "computer_use", "str_replace_editor", "str_replace_based_edit_tool",
        # files
        "read", "read_file", "write", "write_file", "edit", "edit_file", "multi_edit",
        "multiedit", "apply_patch", "create_file", "delete_file", "list_dir", "list_directory",
        "ls", "glob", "grep", "find", "file_search", "view", "notebook_edit",
        # web and search
        "web_search", "web_fetch", "fetch", "browser", "browse", "image_generation",
        # agent plumbing
        "task", "agent", "todo_write", "todowrite", "todo_read", "think", "ask_user",
        "ask_followup_question", "attempt_completion", "read_skill", "skill", "memory",
    }
)

NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # matched whole: `bash\n` is not `bash`
PARAMETER_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}")
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "busybox"})

# Tool output handed back to the model is cut to this many bytes (head and tail
# kept) unless a tool sets `max_output`: every byte is read again each round.
DEFAULT_MAX_OUTPUT = 16 * 1024


def fold_name(name: str) -> str:
    """The form names are compared in, so look-alike Unicode names collide."""
    return unicodedata.normalize("NFKC", name).casefold()


class AgentFileError(Exception):
    """The agent file cannot be used; the message names the file, tool and key."""


ScalarType = Literal["string", "integer", "number", "boolean"]


class Parameter(Strict):
    type: Literal["string", "integer", "number", "boolean", "array", "object"] = "string"
    description: str = ""
    required: bool | None = None
    default: Any = None
    enum: tuple[Any, ...] | None = None
    pattern: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    items: ScalarType = "string"
    allow_dash: bool = False

    @property
    def has_default(self) -> bool:
        return "default" in self.model_fields_set

    @property
    def is_required(self) -> bool:
        if self.required is not None:
            return self.required
        return not self.has_default

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        return regex(value)

    @model_validator(mode="after")
    def _consistent(self) -> Parameter:
        if self.required and self.has_default:
            raise ValueError("a parameter with a default is not required; drop one of the two")
        if self.enum is not None and not self.enum:
            raise ValueError("enum must list at least one value")
        if self.enum is not None and self.has_default and self.default is not None and self.default not in self.enum:
            raise ValueError(f"the default {self.default!r} is not one of the enum's values")
        if self.type in ("array", "object") and (self.pattern or self.minimum is not None or self.maximum is not None):
            raise ValueError("pattern, minimum and maximum apply to scalar parameters only")
        return self


class Mount(Strict):
    path: str
    writable: bool = False


class ToolSpec(Strict):
    """One `tools:` entry, as written in the agent file."""

    name: str
    description: str
    parameters: dict[str, Parameter] = Field(default_factory=dict)
    command: tuple[str, ...] | None = None
    wasm: str | None = None
    mcp: McpTarget | None = None  # one of the agent's MCP servers' tools runs it (`mcp_servers:`)
    stdin: Literal["json"] | None = None
    timeout: float = Field(default=60, gt=0, le=24 * 3600)
    workdir: str | None = None
    env: tuple[str, ...] | dict[str, str] = ()
    tier: Literal["gated", "silent"] = "gated"
    visibility: Literal["inline", "discoverable"] = "inline"
    keywords: tuple[str, ...] = ()
    labels: Labels = ()  # what its calls bring into a session (untrusted, private, egress, a team's own)
    secrets: SecretsMode = "redact"  # what becomes of a secret found in its result before the model reads it
    max_output: int = Field(default=DEFAULT_MAX_OUTPUT, ge=256, le=16 * 1024 * 1024)
    # wasm-only keys, accepted here so the file format is stable
    memory: int | None = Field(default=None, gt=0, le=4096)
    fuel: int | None = Field(default=None, gt=0)
    mounts: dict[str, Mount] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError("a tool name is 1 to 64 letters, digits, '_' or '-'")
        return value

    @field_validator("description")
    @classmethod
    def _description_given(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("say what the tool does, when to use it and what it returns")
        return value.strip()

    @field_validator("parameters")
    @classmethod
    def _parameter_names(cls, value: dict[str, Parameter]) -> dict[str, Parameter]:
        for name in value:
            if not PARAMETER_NAME.fullmatch(name):
                raise ValueError(f"parameter name {name!r} must be a letter or '_' then letters, digits or '_'")
        return value

    @property
    def runner(self) -> str:
        return "mcp" if self.mcp else "wasm" if self.wasm else "argv"


class AgentKey(Strict):
    """An agent allowed to use toolkeeper, and the SHA-256 (hex) of the key it presents."""

    name: str = Field(min_length=1, max_length=64)
    key_sha256: str

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("the SHA-256 of the key, as 64 hex digits (printf %s \"$KEY\" | sha256sum)")
        return value.lower()


def _unique_agents(agents: tuple[AgentKey, ...]) -> tuple[AgentKey, ...]:
    names = [agent.name for agent in agents]
    digests = [agent.key_sha256 for agent in agents]
    if len(set(names)) != len(names) or len(set(digests)) != len(digests):
        raise ValueError("each agent needs its own name and its own key")
    return agents


class KeysFile(Strict):
    """`--agent-keys FILE`: the agents, kept apart from the agent file."""

    agents: tuple[AgentKey, ...] = ()

    @field_validator("agents")
    @classmethod
    def _unique(cls, value: tuple[AgentKey, ...]) -> tuple[AgentKey, ...]:
        return _unique_agents(value)


class AgentFile(Strict):
    upstream: str = "https://api.openai.com/v1"
    api_key_env: str | None = None
    yolo: bool = False
    reserved: tuple[str, ...] = ()
    schema_style: Literal["plain", "standard"] = Field(default="plain", alias="schema")
    agents: tuple[AgentKey, ...] = ()  # required when api_key_env is set: toolkeeper then holds the key
    mcp_servers: tuple[McpServerSpec, ...] = ()  # the agent's MCP servers, served through toolkeeper's rules
    tools: tuple[ToolSpec, ...] = ()

    @field_validator("agents")
    @classmethod
    def _unique(cls, value: tuple[AgentKey, ...]) -> tuple[AgentKey, ...]:
        return _unique_agents(value)

    @field_validator("mcp_servers")
    @classmethod
    def _unique_servers(cls, value: tuple[McpServerSpec, ...]) -> tuple[McpServerSpec, ...]:
        names = [server.name for server in value]
        if len(set(names)) != len(names):
            raise ValueError("each MCP server needs its own name")
        return value

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("upstream")
    @classmethod
    def _upstream_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("upstream must be an http:// or https:// base URL, like https://api.openai.com/v1")
        if "@" in value.split("/", 3)[2]:
            # never echo the value: it holds a password
            raise ValueError("upstream must not carry user:password@ (it would show in logs and fight the agent's "
                             "own Authorization); give the key with api_key_env instead")
        return value.rstrip("/")


class MountedDir:
    def __init__(self, path: Path, writable: bool):
        self.path = path
        self.writable = writable


class DeclaredTool:
    """A loaded tool: its declaration plus everything derived from it at load."""

    def __init__(self, spec: ToolSpec, template: CommandTemplate, workdir: Path, wasm_path: Path | None = None,
                 mounts: dict[str, MountedDir] | None = None):
        self.spec = spec
        self.template = template
        self.workdir = workdir
        self.wasm_path = wasm_path
        self.mounts = mounts or {}

    @property
    def name(self) -> str:
        return self.spec.name


class Agent:
    """A loaded agent file: the declarations and where they live."""

    def __init__(self, path: Path, config: AgentFile, tools: list[DeclaredTool], revision: str = ""):
        self.path = path
        self.config = config
        self.tools = {tool.name: tool for tool in tools}
        self.revision = revision  # the file's SHA-256 (start): records say which declarations were in force

    @property
    def directory(self) -> Path:
        return self.path.parent


def load_agent_file(path: str | os.PathLike[str], *, upstream: str | None = None, serving: bool = True) -> Agent:
    """Read, validate and compile an agent file, or raise AgentFileError. `serving=False` (check, schema, eval's
    own reading) does not need the upstream key's variable to be set."""
    path = Path(path).resolve()
    config, _, _ = load_yaml_model(path, AgentFile, AgentFileError, what="the agent file", entries="tools",
                                   entry="tool", name_key="name", override={"upstream": upstream} if upstream else None)

    reserved = {fold_name(name) for name in DEFAULT_RESERVED_NAMES | set(config.reserved)}
    seen: dict[str, str] = {}
    tools = []
    for tool in config.tools:
        where = f"{path}: tool {tool.name!r}"
        folded = fold_name(tool.name)
        if folded in reserved or folded.startswith(PROXIED_PREFIX):  # mcp__: an MCP server's tool's name, on /mcp
            why = PROXIED_NAMES if folded.startswith(PROXIED_PREFIX) else "agents' built-in tools and `reserved:`"
            raise AgentFileError(f"{where}: key 'name': {tool.name!r} is a reserved name ({why}); choose another name")
        if folded in seen:
            raise AgentFileError(f"{where}: key 'name': declared twice (also as {seen[folded]!r})")
        seen[folded] = tool.name
        tools.append(_compile_mcp_tool(config, tool, where) if tool.mcp else _compile_tool(path, tool, where))
    if serving and config.api_key_env and config.api_key_env not in os.environ:
        raise AgentFileError(f"{path}: key 'api_key_env': the variable {config.api_key_env} is not set")
    return Agent(path, config, tools, sha256_hex(path.read_bytes())[:12])


def load_agent_keys(path: str | os.PathLike[str]) -> dict[str, str]:
    """A keys file: the SHA-256 of each agent's key -> the agent's name."""
    path = Path(path).resolve()
    keys, _, _ = load_yaml_model(path, KeysFile, AgentFileError, what="the agent keys file", entries="agents",
                                 entry="agent", name_key="name")
    return {agent.key_sha256: agent.name for agent in keys.agents}


def _compile_tool(path: Path, tool: ToolSpec, where: str) -> DeclaredTool:
    if not tool.wasm:
        for key in ("memory", "fuel", "mounts"):
            if getattr(tool, key):
                raise AgentFileError(f"{where}: key {key!r}: applies to wasm tools only")
    if not tool.command:
        raise AgentFileError(f"{where}: key 'command': a tool needs a command (a list, one argv entry per element)")
    for name, param in tool.parameters.items():
        if param.type == "object" and tool.stdin != "json":
            raise AgentFileError(f"{where}: key 'parameters.{name}': object parameters need `stdin: json`")
    try:
        template = CommandTemplate.parse(tool.command, tool.parameters)
    except TemplateError as exc:
        raise AgentFileError(f"{where}: key 'command': {exc}") from None
    if tool.wasm:
        return _compile_wasm_tool(path, tool, template, where)
    _refuse_shell_with_placeholders(template, where)

    workdir = (path.parent / tool.workdir).resolve() if tool.workdir else path.parent
    if not workdir.is_dir():
        raise AgentFileError(f"{where}: key 'workdir': {workdir} is not a directory")
    program = template.program
    if "/" in program:
        resolved = workdir / program
        if not (resolved.is_file() and os.access(resolved, os.X_OK)):
            raise AgentFileError(f"{where}: key 'command': {program} is not an executable file in {workdir}")
    elif shutil.which(program, path=minimal_path(tool)) is None:
        raise AgentFileError(
            f"{where}: key 'command': {program} is not found on the tool's PATH ({minimal_path(tool)})")
    return DeclaredTool(tool, template, workdir)


def _compile_mcp_tool(config: AgentFile, tool: ToolSpec, where: str) -> DeclaredTool:
    """A declared tool run by an MCP server's tool: its arguments go to that tool as an object, no argv."""
    for key in ("command", "wasm", "stdin", "workdir", "memory", "fuel", "mounts"):
        if getattr(tool, key):
            raise AgentFileError(f"{where}: key {key!r}: a tool run by an MCP server (`mcp:`) takes no {key}")
    servers = [server.name for server in config.mcp_servers]
    target = tool.mcp.server if tool.mcp else ""
    if target not in servers:
        raise AgentFileError(f"{where}: key 'mcp.server': {target!r} is not listed under `mcp_servers:` "
                             f"({', '.join(servers) or 'none is'})")
    return DeclaredTool(tool, CommandTemplate(entries=(), allow_dash=frozenset(), arrays=frozenset()), Path.cwd())


def _compile_wasm_tool(path: Path, tool: ToolSpec, template: CommandTemplate, where: str) -> DeclaredTool:
    if tool.workdir:
        raise AgentFileError(f"{where}: key 'workdir': a wasm tool has no working directory; give it `mounts:`")
    module = (path.parent / tool.wasm).resolve()
    if not module.is_file():
        raise AgentFileError(f"{where}: key 'wasm': {module} is not a file")
    mounts = {}
    for guest, mount in tool.mounts.items():
        if not guest.startswith("/") or ".." in guest.split("/"):
            raise AgentFileError(f"{where}: key 'mounts.{guest}': the path the module sees must be absolute, "
                                 "like /data")
        host = (path.parent / mount.path).resolve()
        if not host.is_dir():
            raise AgentFileError(f"{where}: key 'mounts.{guest}.path': {host} is not a directory")
        mounts[guest] = MountedDir(host, mount.writable)
    from toolkeeper.tools.wasmmodule import WasmModuleError, compiled_modules  # wasmtime: for wasm tools only

    try:
        compiled_modules().module(module)  # compiled now, and kept for the calls
    except WasmModuleError as exc:
        raise AgentFileError(f"{where}: key 'wasm': {exc}") from None
    return DeclaredTool(tool, template, path.parent, wasm_path=module, mounts=mounts)


def _refuse_shell_with_placeholders(template: CommandTemplate, where: str) -> None:
    """`sh -c "... {{x}}"` is a shell line built from the model's values: refused."""
    entries = list(template.entries)
    # look through `env` and `/usr/bin/env VAR=x` prefixes to the real program
    while entries and os.path.basename(entries[0].text) == "env":
        entries = entries[1:]
        while entries and ("=" in entries[0].text or entries[0].text.startswith("-")):
            entries = entries[1:]
    if not entries or os.path.basename(entries[0].text) not in SHELLS:
        return
    runs_a_line = any(e.text.startswith("-") and not e.text.startswith("--") and "c" in e.text for e in entries[1:])
    if runs_a_line and template.placeholders:
        raise AgentFileError(
            f"{where}: key 'command': a shell running a command line (-c) with placeholders would let the model's "
            "values become shell syntax; put the command in a script and pass the values as arguments"
        )


def minimal_path(tool: ToolSpec) -> str:
    if isinstance(tool.env, dict) and "PATH" in tool.env:
        return tool.env["PATH"]
    if isinstance(tool.env, tuple) and "PATH" in tool.env and "PATH" in os.environ:
        return os.environ["PATH"]
    return "/usr/local/bin:/usr/bin:/bin"
