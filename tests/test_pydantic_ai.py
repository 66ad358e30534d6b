"""pydantic-ai's `Agent("openai:...")` (the Responses API) through toolkeeper: a declared tool runs hidden,
the agent's own tool works, and the next run's history holds the hidden exchange."""

from __future__ import annotations

import asyncio

from conftest import call


def test_pydantic_ai_runs_a_declared_tool_and_its_own(scripted, tk, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", tk.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-pydantic-ai")
    from pydantic_ai import Agent

    agent = Agent("openai:scripted-model", instructions="Answer briefly.")
    weather_calls: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        weather_calls.append(city)
        return f"sunny in {city}"

    scripted.script({"tool_calls": [call("lookup", {"word": "fjord"}, "call_dec"),
                                    call("get_weather", {"city": "Bergen"}, "call_own")]},
                    {"content": "A fjord is a sea inlet; Bergen is sunny."})

    async def run():
        try:
            first = await agent.run("What is a fjord, and the weather in Bergen?")
            scripted.script({"content": "You are welcome."})
            second = await agent.run("Thanks!", message_history=first.all_messages())
            return first, second
        finally:
            await agent.model.client.close()  # its connections closed in their own event loop

    first, second = asyncio.run(run())
    assert first.output == "A fjord is a sea inlet; Bergen is sunny."
    assert second.output == "You are welcome."
    assert weather_calls == ["Bergen"] and tk.calls() == [["lookup", "fjord"]]
    assert "lookup" not in repr(first.all_messages())  # nothing of the declared call reached the agent
    sent = scripted.bodies()[0]["input"]  # the second run: its history, restored
    calls = [item.get("call_id") for item in sent if item.get("type") == "function_call"]
    assert calls == ["call_dec", "call_own"]
