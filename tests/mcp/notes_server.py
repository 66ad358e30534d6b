"""An MCP server written with the official SDK, for the tests of toolkeeper's MCP proxy (stdio).

Its state lives in $NOTES_STATE (a folder): `description.txt`, when present, is the
`echo` tool's description, read at each `tools/list` (a server changing a tool's
definition while it runs), and `echo.json`, when present, more fields of its
definition (`title`, `annotations`, `outputSchema`, `_meta`...); `hidden.txt`, when present, names tools (one a
line) it leaves out of its listing; `calls.log` gets one line per call it receives (what reached the server),
`listings.log` one line per `tools/list`; `pid` holds its process id (the test kills it mid-call). When
`list_changed` is present as a call comes, it is removed and the server says `notifications/tools/list_changed`
(on a `subscriptions/listen` stream at the 2026-07-28 protocol, unasked before it) before it answers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged

STATE = Path(os.environ["NOTES_STATE"])
BUS = InMemorySubscriptionBus()


def _schema(**properties: str) -> dict:
    return {"type": "object", "properties": {name: {"type": kind} for name, kind in properties.items()},
            "required": list(properties)}


async def list_tools(ctx, params) -> types.ListToolsResult:
    with open(STATE / "listings.log", "a") as log:
        log.write(f"{os.getpid()}\n")
    described = STATE / "description.txt"
    description = described.read_text() if described.exists() else "Echo the text back."
    more = STATE / "echo.json"
    echo = {"name": "echo", "description": description, "inputSchema": _schema(text="string"),
            **(json.loads(more.read_text()) if more.exists() else {})}
    hidden = set((STATE / "hidden.txt").read_text().split()) if (STATE / "hidden.txt").exists() else set()
    return types.ListToolsResult(tools=[tool for tool in (
        types.Tool.model_validate(echo),
        types.Tool(name="read_note", description="Read a note by its path.", input_schema=_schema(path="string")),
        types.Tool(name="slow", description="Wait some seconds, then answer.", input_schema=_schema(seconds="number")),
        types.Tool(name="wipe", description="Delete every note.", input_schema=_schema()),
    ) if tool.name not in hidden])


async def call_tool(ctx, params) -> types.CallToolResult:
    arguments = params.arguments or {}
    with open(STATE / "calls.log", "a") as log:
        log.write(f"{params.name} {arguments}\n")
    if (STATE / "list_changed").exists():
        (STATE / "list_changed").unlink()
        await BUS.publish(ToolsListChanged())  # the 2026-07-28 protocol: to the subscriptions/listen streams
        await ctx.session.send_tool_list_changed()  # earlier ones: unasked (dropped at 2026-07-28)
    if params.name == "echo":
        text = str(arguments.get("text", ""))
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content={"echoed": text})
    if params.name == "read_note":
        return types.CallToolResult(content=[types.TextContent(text=f"the note at {arguments.get('path')}")])
    if params.name == "slow":
        await anyio.sleep(float(arguments.get("seconds", 1)))
        return types.CallToolResult(content=[types.TextContent(text="done waiting")])
    if params.name == "wipe":
        return types.CallToolResult(content=[types.TextContent(text="wiped")])
    return types.CallToolResult(content=[types.TextContent(text=f"no tool {params.name}")], is_error=True)


async def main() -> None:
    (STATE / "pid").write_text(str(os.getpid()))
    server = Server("notes", on_list_tools=list_tools, on_call_tool=call_tool,
                    on_subscriptions_listen=ListenHandler(BUS))
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    print("notes server starting", file=sys.stderr)
    anyio.run(main)
