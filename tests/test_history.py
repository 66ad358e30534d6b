"""Mixed turns and faithful history: the agent never sees a declared call, and the
model always sees the complete conversation, as a direct one would have been."""

from __future__ import annotations

import json
import urllib.request

import pytest
from conftest import call, check_every_call_answered, user

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}
LOOKUP_A = 'ran ["lookup", "a"]\n'


def essence(messages: list[dict]) -> list[tuple]:
    """What a message says, whatever fields a client adds or drops."""
    out = []
    for m in messages:
        calls = tuple((c["id"], c["function"]["name"], json.dumps(json.loads(c["function"]["arguments"] or "{}"),
                                                                    sort_keys=True))
                      for c in m.get("tool_calls") or [])
        out.append((m["role"], m.get("content") or None, calls, m.get("tool_call_id")))
    return out


def agent_message(message) -> dict:
    """What an agent keeps of a response message in its history (as the openai-python docs show)."""
    return message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio", "function_call"})


def reassembled(client, **kwargs):
    with client.chat.completions.stream(**kwargs) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("declared_first", [True, False], ids=["declared-at-0", "declared-at-1"])
def test_mixed_response_returns_only_the_agents_call(scripted, tk, stream, declared_first):
    calls = [call("lookup", {"word": "a"}, "call_decl1"), call("get_weather", {"city": "Oslo"}, "call_own1")]
    if not declared_first:
        calls.reverse()
    scripted.script({"content": "Checking. ", "tool_calls": calls}, {"content": "Oslo is sunny; a is alpha."})
    client = tk.client()
    messages = user()
    kwargs = {"model": "m", "messages": messages, "tools": [WEATHER]}
    if stream:
        with client.chat.completions.stream(**kwargs) as events:
            chunks = [event.chunk for event in events if event.type == "chunk"]
            answer = events.get_final_completion()
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert [(d.index, d.id, d.function.name) for d in deltas] == [(0, "call_own1", "get_weather")]
    else:
        answer = client.chat.completions.create(**kwargs)
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls"
    assert message.content == "Checking. "
    assert [(c.id, c.function.name) for c in message.tool_calls] == [("call_own1", "get_weather")]

    # the agent runs its own tool and asks again: the model gets the whole exchange back
    followup = [*messages, agent_message(message),
                {"role": "tool", "tool_call_id": "call_own1", "content": "sunny, 21 C"}]
    final = client.chat.completions.create(model="m", messages=followup, tools=[WEATHER])
    assert final.choices[0].message.content == "Oslo is sunny; a is alpha."
    upstream = scripted.bodies()[-1]["messages"]
    check_every_call_answered(upstream)
    assert essence(upstream[1:]) == [
        ("assistant", "Checking. ", tuple((c["id"], c["name"], json.dumps(c["arguments"], sort_keys=True))
                                          for c in calls), None),
        *[("tool", LOOKUP_A if c["name"] == "lookup" else "sunny, 21 C", (), c["id"]) for c in calls],
    ]


def test_five_turns_give_the_model_the_history_of_a_direct_conversation(scripted, tk):
    client = tk.client()
    direct: list[dict] = []  # what the model would have seen had the agent run every tool itself
    agent: list[dict] = []  # what the agent keeps

    def ask(new_messages, steps, expected_direct_turn, stream=False):
        scripted.script(*steps)
        agent.extend(new_messages)
        direct.extend(new_messages)
        kwargs = {"model": "m", "messages": list(agent), "tools": [WEATHER]}
        answer = reassembled(client, **kwargs) if stream else client.chat.completions.create(**kwargs)
        first_upstream = scripted.bodies()[0]["messages"]
        assert essence(first_upstream) == essence(direct), "the model did not get the direct history"
        check_every_call_answered(first_upstream)
        agent.append(agent_message(answer.choices[0].message))
        direct.extend(expected_direct_turn)
        return answer

    def assistant(content, *calls_):
        message = {"role": "assistant", "content": content}
        if calls_:
            message["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": json.dumps(c["arguments"], separators=(",", ":"))}} for c in calls_]
        return message

    def result(c, text):
        return {"role": "tool", "tool_call_id": c["id"], "content": text}

    # 1: declared only, then an answer
    a = call("lookup", {"word": "a"}, "call_t1a")
    ask([{"role": "user", "content": "What is a?"}],
        [{"tool_calls": [a]}, {"content": "a is alpha."}],
        [assistant(None, a), result(a, LOOKUP_A), assistant("a is alpha.")])
    # 2: mixed: a declared call and the agent's own, streamed
    b, w = call("lookup", {"word": "b"}, "call_t2b"), call("get_weather", {"city": "Oslo"}, "call_t2w")
    ask([{"role": "user", "content": "b, and the weather in Oslo?"}],
        [{"content": "Looking. ", "tool_calls": [b, w]}],
        [assistant("Looking. ", b, w), result(b, 'ran ["lookup", "b"]\n')], stream=True)
    # 3: the agent answers its own call; the model answers
    ask([{"role": "tool", "tool_call_id": "call_t2w", "content": "sunny"}],
        [{"content": "b is beta; Oslo is sunny."}],
        [assistant("b is beta; Oslo is sunny.")])
    # 4: plain
    ask([{"role": "user", "content": "Thanks!"}], [{"content": "You're welcome."}],
        [assistant("You're welcome.")])
    # 5: two declared rounds, text before each call, streamed
    c, d = call("lookup", {"word": "c"}, "call_t5c"), call("lookup", {"word": "d"}, "call_t5d")
    ask([{"role": "user", "content": "c and d?"}],
        [{"content": "First c. ", "tool_calls": [c]}, {"content": "Then d. ", "tool_calls": [d]},
         {"content": "c and d done."}],
        [assistant("First c. ", c), result(c, 'ran ["lookup", "c"]\n'), assistant("Then d. ", d),
         result(d, 'ran ["lookup", "d"]\n'), assistant("c and d done.")], stream=True)
    assert agent[-1]["content"] == "First c. Then d. c and d done."
    # and a sixth request sees all five turns as they really were
    ask([{"role": "user", "content": "Bye."}], [{"content": "Bye!"}], [assistant("Bye!")])


def test_restoration_after_a_streamed_answer_with_text_before_the_hidden_call(scripted, tk):
    client = tk.client()
    messages = user()
    scripted.script({"content": "Let me look that up. ", "tool_calls": [call("lookup", {"word": "x"}, "call_x1")]},
                    {"content": "It means x."})
    answer = reassembled(client, model="m", messages=messages)
    assert answer.choices[0].message.content == "Let me look that up. It means x."
    scripted.script({"content": "ok"})
    client.chat.completions.create(model="m", messages=[*messages, agent_message(answer.choices[0].message),
                                                        {"role": "user", "content": "thanks"}])
    upstream = scripted.bodies()[0]["messages"]
    assert essence(upstream) == [
        ("user", messages[0]["content"], (), None),
        ("assistant", "Let me look that up. ", (("call_x1", "lookup", '{"word": "x"}'),), None),
        ("tool", 'ran ["lookup", "x"]\n', (), "call_x1"),
        ("assistant", "It means x.", (), None),
        ("user", "thanks", (), None),
    ]


def metrics(tk) -> dict[str, int]:
    root = tk.base_url[: -len("/v1")]
    with urllib.request.urlopen(root + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("toolkeeper_history_restorations_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            counts[outcome] = int(float(line.rsplit(" ", 1)[1]))
    return counts


def _one_hidden_turn(scripted, client):
    messages = user()
    scripted.script({"tool_calls": [call("lookup", {"word": "t"}, "call_t1")]}, {"content": "Tenant one's answer."})
    answer = client.chat.completions.create(model="m", messages=messages)
    return [*messages, agent_message(answer.choices[0].message), {"role": "user", "content": "and then?"}]


def test_another_tenant_gets_no_restoration(scripted, tk):
    history = _one_hidden_turn(scripted, tk.client())
    other = tk.client(api_key="sk-another-tenant")
    scripted.script({"content": "ok"})
    other.chat.completions.create(model="m", messages=history)
    upstream = scripted.bodies()[0]["messages"]
    assert essence(upstream) == essence(history)  # forwarded as it is
    assert "call_t1" not in json.dumps(upstream)


def test_a_store_miss_forwards_as_is_and_is_counted(scripted, tk):
    client = tk.client()
    history = _one_hidden_turn(scripted, client)
    before = metrics(tk)
    edited = [{**history[0], "content": history[0]["content"] + " (edited)"}, *history[1:]]
    scripted.script({"content": "ok"})
    client.chat.completions.create(model="m", messages=edited)
    assert essence(scripted.bodies()[0]["messages"]) == essence(edited)
    after = metrics(tk)
    assert after["miss"] == before.get("miss", 0) + 1
    # and the unedited history is still restored (a hit)
    scripted.script({"content": "ok"})
    client.chat.completions.create(model="m", messages=history)
    assert len(scripted.bodies()[0]["messages"]) == len(history) + 2
    assert metrics(tk)["hit"] == after["hit"] + 1


def test_a_retried_request_does_not_run_the_tool_twice(scripted, tk):
    scripted.script(
        {"tool_calls": [call("release", {"version": "5.0.0", "channel": "stable"}, "call_r1")]},
        {"status": 500, "body": {"error": {"message": "the model fell over", "type": "server_error"}}},
        {"tool_calls": [call("release", {"version": "5.0.0", "channel": "stable"}, "call_r1")]},
        {"content": "Released 5.0.0: {tool_result}"},
    )
    client = tk.client(max_retries=2)
    answer = client.chat.completions.create(model="m", messages=user())
    assert tk.calls() == [["release", "5.0.0", "--channel=stable"]]  # once, not twice
    assert answer.choices[0].message.content == 'Released 5.0.0: ran ["release", "5.0.0", "--channel=stable"]'
    assert len(scripted.bodies()) == 4


def test_tool_choice_required_becomes_auto_after_a_declared_round(scripted, tk):
    scripted.script({"tool_calls": [call("lookup", {"word": "x"})]}, {"content": "done"})
    tk.client().chat.completions.create(model="m", messages=user(), tool_choice="required")
    first, second = scripted.bodies()
    assert (first["tool_choice"], second["tool_choice"]) == ("required", "auto")


def test_tool_choice_naming_an_agent_tool_passes_through(scripted, tk):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    scripted.script({"tool_calls": [call("get_weather", {"city": "Rome"}, "call_w9")]})
    answer = tk.client().chat.completions.create(model="m", messages=user(), tools=[WEATHER], tool_choice=choice)
    assert scripted.bodies()[0]["tool_choice"] == choice
    assert answer.choices[0].message.tool_calls[0].id == "call_w9"


def test_parallel_tool_calls_dropped_when_no_tool_is_left(scripted, tk):
    scripted.script({"content": "plain"})
    tk.client().chat.completions.create(model="m", messages=user(), tool_choice="none", parallel_tool_calls=True)
    body = scripted.bodies()[0]
    assert "tools" not in body and "parallel_tool_calls" not in body


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_fields_the_server_needs_back_are_kept_verbatim(scripted, tk, stream):
    signature = {"google": {"thought_signature": "c2lnbmF0dXJl"}}
    scripted.script(
        {"tool_calls": [{**call("lookup", {"word": "x"}, "call_sig"), "extra": {"extra_content": signature}}],
         "reasoning_content": "thinking...", "message_extra": {"provider_field": {"kept": True}}},
        {"content": "done"},
    )
    client = tk.client()
    if stream:
        reassembled(client, model="m", messages=user())
    else:
        client.chat.completions.create(model="m", messages=user())
    hidden = scripted.bodies()[1]["messages"][1]
    assert hidden["tool_calls"][0]["extra_content"] == signature
    assert hidden["reasoning_content"] == "thinking..."
    assert hidden["provider_field"] == {"kept": True}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_declared_round_then_one_of_the_agents_own_calls_keeps_the_whole_history(scripted, tk, stream):
    """The model calls a declared tool, reads it, then calls only the agent's tool: nothing may be lost."""
    scripted.script({"tool_calls": [call("lookup", {"word": "a"}, "call_decl1")]},
                    {"content": "Now the weather. ", "tool_calls": [call("get_weather", {"city": "Oslo"}, "call_own1")]},
                    {"content": "Sunny, and a is alpha."})
    client = tk.client()
    messages = user()
    kwargs = {"model": "m", "messages": messages, "tools": [WEATHER]}
    answer = reassembled(client, **kwargs) if stream else client.chat.completions.create(**kwargs)
    message = answer.choices[0].message
    assert [(c.id, c.function.name) for c in message.tool_calls] == [("call_own1", "get_weather")]
    followup = [*messages, agent_message(message),
                {"role": "tool", "tool_call_id": "call_own1", "content": "sunny, 21 C"}]
    client.chat.completions.create(model="m", messages=followup, tools=[WEATHER])
    upstream = scripted.bodies()[-1]["messages"]
    check_every_call_answered(upstream)
    assert essence(upstream[1:]) == [
        ("assistant", None, (("call_decl1", "lookup", '{"word": "a"}'),), None),
        ("tool", LOOKUP_A, (), "call_decl1"),
        ("assistant", "Now the weather. ", (("call_own1", "get_weather", '{"city": "Oslo"}'),), None),
        ("tool", "sunny, 21 C", (), "call_own1"),
    ]
