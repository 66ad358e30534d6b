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


def _default_model_agent(tk, get_weather):
    """The Agents SDK as its users run it: the default model, which speaks the Responses API."""
    from agents import Agent, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=tk.base_url, api_key="sk-agents-default", max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)
    return client, Agent(name="guide", instructions="Answer briefly.", tools=[get_weather])


def _weather_tool(calls: list[str]):
    from agents import function_tool

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    return get_weather


MIXED = ({"content": "", "tool_calls": [call("lookup", {"word": "fjord"}, "call_dec"),
                                        call("get_weather", {"city": "Bergen"}, "call_own")]},
         {"content": "A fjord is a sea inlet; Bergen is sunny."})


def test_the_default_model_runs_a_declared_tool_and_its_own_in_one_turn(scripted, tk, monkeypatch):
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Runner

    weather_calls: list[str] = []
    scripted.script(*MIXED)

    async def run() -> str:
        client, agent = _default_model_agent(tk, _weather_tool(weather_calls))
        async with client:
            return (await Runner.run(agent, "What is a fjord, and the weather in Bergen?")).final_output

    assert asyncio.run(run()) == "A fjord is a sea inlet; Bergen is sunny."
    assert weather_calls == ["Bergen"] and tk.calls() == [["lookup", "fjord"]]
    first, second = scripted.bodies()
    assert "input" in first  # the Responses API, as the SDK's default
    sent = [(i.get("type", "message"), i.get("call_id")) for i in second["input"]]
    assert ("function_call_output", "call_dec") in sent and ("function_call_output", "call_own") in sent


def test_run_streamed_shows_no_event_of_the_declared_call(scripted, tk, monkeypatch):
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Runner

    weather_calls: list[str] = []
    scripted.script(*MIXED)

    async def run() -> list:
        client, agent = _default_model_agent(tk, _weather_tool(weather_calls))
        async with client:
            streamed = Runner.run_streamed(agent, "What is a fjord, and the weather in Bergen?")
            return [event async for event in streamed.stream_events()], streamed.final_output

    events, final = asyncio.run(run())
    assert final == "A fjord is a sea inlet; Bergen is sunny."
    text = repr(events)
    assert "lookup" not in text and "call_dec" not in text
    assert "get_weather" in text and weather_calls == ["Bergen"]
