"""`toolkeeper demo`: the example agent file, a built-in offline model, the real openai client.

It starts a scripted model server and toolkeeper on free local ports, sends
one request through the `openai` client as any agent would, and prints what
happened on the way: the schemas the model received, its declared call, the
argv that ran, the output, and the final answer the agent got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from aiohttp import web

from toolkeeper.app import build_app
from toolkeeper.audit import ExecutionRecord
from toolkeeper.common import shipped_file
from toolkeeper.policy import ConsentAnswer, ConsentRequest
from toolkeeper.scripted import ScriptedModel, serve_scripted
from toolkeeper.settings import Settings
from toolkeeper.tools import load_agent_file

QUESTION = "Please ship version 1.4.2 to the beta channel, with the notes 'Faster search'."
SCRIPT = [
    {"content": "I'll publish the release now. ",
     "tool_calls": [{"name": "release", "arguments": {"version": "1.4.2", "channel": "beta",
                                                      "notes": "Faster search"}}]},
    {"content": "Done: version 1.4.2 is published on the beta channel. The release log says:\n{tool_result}"},
]


def add_parser(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser("demo", help="run the example agent file against a built-in offline model")
    demo.set_defaults(run=lambda args: asyncio.run(run_demo()))


def example_agent_file() -> Path:
    path = shipped_file("declared/example/agent.yaml", "_example/agent.yaml")
    if path is None:
        raise FileNotFoundError("the example agent file (declared/example/agent.yaml) is not installed")
    return path


class DemoConsent:
    """The example file says `yolo: false`, so release asks; the demo answers yes for you."""

    can_ask = True

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        self.asked.append(request.summary())
        return ConsentAnswer(True, "demo", "the demo approves on your behalf")


def _section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 66 - len(title)))


async def run_demo() -> int:
    from openai import AsyncOpenAI

    model = ScriptedModel(SCRIPT)
    model_runner, model_port = await serve_scripted(model)
    agent = load_agent_file(example_agent_file(), upstream=f"http://127.0.0.1:{model_port}/v1")
    records: list[ExecutionRecord] = []
    consent = DemoConsent()
    app = build_app(agent, Settings(store=":memory:", audit=":memory:"), consent=consent, observers=[records.append])
    proxy_runner = web.AppRunner(app,
                                 handler_cancellation=True, access_log=None)
    await proxy_runner.setup()
    site = web.TCPSite(proxy_runner, "127.0.0.1", 0)
    await site.start()
    proxy_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        print(f"toolkeeper demo: agent file {agent.path}")
        print(f"toolkeeper on http://127.0.0.1:{proxy_port}/v1, offline model on http://127.0.0.1:{model_port}/v1")
        _section("the agent asks (through the openai client)")
        print(QUESTION)
        async with AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key="demo-key") as client:
            answer = await client.chat.completions.create(
                model="demo-model", messages=[{"role": "user", "content": QUESTION}])

        first = model.requests[0]["body"]
        _section("tool schemas the model received")
        for tool in first.get("tools", []):
            print(json.dumps(tool, indent=2))
        for record in records:
            _section(f"declared call {record.tool} (hidden from the agent)")
            print(f"arguments sent:  {json.dumps(record.arguments_sent)}")
            print(f"coerced:         {json.dumps(record.arguments)}")
            print(f"decision:        {record.decision} ({record.decision_source}: {record.decision_reason})")
            if consent.asked:
                print(f"consent asked:   {consent.asked[0]}? -> yes (the demo answers for you)")
            print(f"argv that ran:   {json.dumps(record.argv)}")
            print(f"status:          {record.status}, exit {record.exit_code}, {record.duration_ms:.1f} ms")
            print("output:")
            print("  " + record.answer.replace("\n", "\n  "))
        _section("the final answer the agent got")
        message = answer.choices[0].message
        print(message.content)
        print(f"\n(tool calls the agent saw: {len(message.tool_calls or [])}; model rounds: {len(model.requests)}; "
              f"usage summed: {answer.usage.total_tokens if answer.usage else 'n/a'} tokens)")
        ok = bool(records) and records[0].status == "ok" and not message.tool_calls
        return 0 if ok else 1
    finally:
        await proxy_runner.cleanup()
        await model_runner.cleanup()
