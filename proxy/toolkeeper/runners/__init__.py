"""Runners: execute one declared call, already rendered, decided and recorded.

`argv` starts a process (never a shell) in its own process group; `wasm` runs
a WASI module in wasmtime with memory, time and fuel limits. Runners never
decide, record, or know the turn (an MCP server that takes the caller's own
token is told whom a call acts for: `Caller`, `acting_for`).
"""

from typing import Any

from toolkeeper.runners.argv import ArgvRunner
from toolkeeper.runners.base import OutputBuffer, Runner, RunResult, declared_environment, tool_environment
from toolkeeper.runners.mcp import (
    McpCallerRequired,
    McpConnection,
    McpRunner,
    McpServerError,
    McpServers,
    McpServerTimeout,
)
from toolkeeper.runners.mcpauth import Caller, acting_for

__all__ = [
    "ArgvRunner",
    "Caller",
    "McpCallerRequired",
    "McpConnection",
    "McpRunner",
    "McpServerError",
    "McpServerTimeout",
    "McpServers",
    "OutputBuffer",
    "RunResult",
    "Runner",
    "WasmRunner",
    "acting_for",
    "declared_environment",
    "runners_for",
    "shared_wasm_runner",
    "tool_environment",
]


def shared_wasm_runner() -> Any:
    """The process's wasm runner; wasmtime is imported only when an agent file declares a wasm tool."""
    from toolkeeper.runners.wasm import shared_runner

    return shared_runner()


def runners_for(runner_names: set[str]) -> dict[str, Runner]:
    """The runners a set of declared tools needs, by the tools' `runner` ("argv", "wasm")."""
    runners: dict[str, Runner] = {"argv": ArgvRunner()}
    if "wasm" in runner_names:
        runners["wasm"] = shared_wasm_runner()
    return runners


def __getattr__(name: str) -> Any:
    if name == "WasmRunner":
        from toolkeeper.runners.wasm import WasmRunner

        return WasmRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
