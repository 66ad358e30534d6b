"""Real model servers' quirks, streamed and not: declared calls still run exactly once
with exactly their arguments, and the agent's own calls still reach it well formed."""

from __future__ import annotations

import re

import pytest
from conftest import call, user

TRICKY = {"word": 'é"q\\ ☃ 😀 \u00e9 \\u2603'}  # escapes, a snowman, an emoji: split anywhere
QUIRKS = ["args_one_chunk", "split_escape", "byte_drip", "args_object", "no_ids", "empty_ids", "int_ids",
          "name_every_delta", "stop_with_tools", "azure_empty_first", "json_when_streaming", "no_done"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("quirk", QUIRKS)
def test_declared_call_survives_quirk(scripted, tk, quirk, stream):
    scripted.script(
        {"content": "Looking it up. ", "tool_calls": [call("lookup", TRICKY)], "quirks": [quirk]},
        {"content": "Found it.", "quirks": [quirk]},
    )
    client = tk.client()
    if stream:
        with client.chat.completions.stream(model="m", messages=user()) as events:
            for _ in events:
                pass
            answer = events.get_final_completion()
    else:
        answer = client.chat.completions.create(model="m", messages=user())
    assert tk.calls() == [["lookup", TRICKY["word"]]]
    assert answer.choices[0].message.content == "Looking it up. Found it."
    assert not answer.choices[0].message.tool_calls
    # the history sent back upstream is valid: the call has an id, and the result answers it
    second = scripted.bodies()[1]["messages"]
    tool_call = second[1]["tool_calls"][0]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_call["id"])
    assert isinstance(tool_call["function"]["arguments"], str)
    assert second[2]["tool_call_id"] == tool_call["id"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_parallel_calls_all_at_index_0(scripted, tk, stream):
    """Ollama sends each parallel call whole, every one at index 0."""
    scripted.script(
        {"tool_calls": [call("lookup", {"word": "one"}), call("lookup", {"word": "two"})],
         "quirks": ["all_index_0", "no_ids", "stop_with_tools"]},
        {"content": "Both."},
    )
    answer = tk.client().chat.completions.create(model="m", messages=user(), stream=stream)
    if stream:
        text = "".join(chunk.choices[0].delta.content or "" for chunk in answer if chunk.choices)
    else:
        text = answer.choices[0].message.content
    assert text == "Both."
    assert sorted(tk.calls()) == [["lookup", "one"], ["lookup", "two"]]  # they run at once: any order
    assistant = scripted.bodies()[1]["messages"][1]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert len(set(ids)) == 2


AGENT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("quirk", ["no_ids", "empty_ids", "int_ids", "args_object", "stop_with_tools",
                                   "name_every_delta", "split_escape"])
def test_agent_calls_reach_the_agent_well_formed(scripted, tk, quirk, stream):
    scripted.script({"tool_calls": [call("get_weather", {"city": "Zürich"})], "quirks": [quirk]})
    client = tk.client()
    if stream:
        with client.chat.completions.stream(model="m", messages=user(), tools=[AGENT_TOOL]) as events:
            for _ in events:
                pass
            answer = events.get_final_completion()
    else:
        answer = client.chat.completions.create(model="m", messages=user(), tools=[AGENT_TOOL])
    calls = answer.choices[0].message.tool_calls
    assert len(calls) == 1
    assert calls[0].function.name == "get_weather"
    assert calls[0].function.arguments.replace(" ", "") == '{"city":"Zürich"}'
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", calls[0].id)
    assert answer.choices[0].finish_reason == "tool_calls"


def test_reasoning_content_streams_through(scripted, tk):
    scripted.script(
        {"reasoning_content": "The user wants a lookup.", "tool_calls": [call("lookup", {"word": "x"})]},
        {"reasoning_content": "Now answer.", "content": "Done."},
    )
    chunks = list(tk.client().chat.completions.create(model="m", messages=user(), stream=True))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert reasoning == "The user wants a lookup.Now answer."
    # and the model gets its reasoning back in the hidden history
    assert scripted.bodies()[1]["messages"][1]["reasoning_content"] == "The user wants a lookup."
