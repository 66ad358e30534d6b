"""A real agent framework through toolkeeper: the OpenAI Agents SDK's runner raises on
any tool name it does not know, so a single leaked declared call would fail the run."""

from __future__ import annotations

import asyncio

from conftest import call, check_every_call_answered


def test_openai_agents_runner_completes_a_mixed_conversation(scripted, tk, monkeypatch):
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    weather_calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        weather_calls.append(city)
        return f"sunny in {city}"

    scripted.script(
        # one response calling a declared tool and the agent's own
        {"content": "", "tool_calls": [call("lookup", {"word": "fjord"}, "call_dec"),
                                       call("get_weather", {"city": "Bergen"}, "call_own")]},
        # then, with both results in hand
        {"content": "A fjord is a sea inlet; Bergen is sunny."},
    )

    async def run() -> str:
        async with AsyncOpenAI(base_url=tk.base_url, api_key="sk-agents-sdk", max_retries=0) as client:
            agent = Agent(name="guide", instructions="Answer briefly.", tools=[get_weather],
                          model=OpenAIChatCompletionsModel(model="m", openai_client=client))
            result = await Runner.run(agent, "What is a fjord, and the weather in Bergen?")
            return result.final_output

    assert asyncio.run(run()) == "A fjord is a sea inlet; Bergen is sunny."
    assert weather_calls == ["Bergen"]
    assert tk.calls() == [["lookup", "fjord"]]
    first, second = scripted.bodies()
    assert first["tools"][0]["function"]["name"] == "get_weather"
    history = second["messages"]
    check_every_call_answered(history)
    assistant = next(m for m in history if m["role"] == "assistant")
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["lookup", "get_weather"]
    results = {m["tool_call_id"]: m["content"] for m in history if m["role"] == "tool"}
    assert results["call_dec"] == 'ran ["lookup", "fjord"]\n'
    assert "sunny in Bergen" in results["call_own"]
