"""Anthropic's Messages API (`/v1/messages`) through toolkeeper, driven by the real anthropic client.

The scripted model server is strict as Anthropic's: a tool_use left without its tool_result in the next
message, a result for no call, a result after other content, a changed thinking block: a 400, and the
test fails.
"""

from __future__ import annotations

import json
import urllib.request

import anthropic
import pytest
from conftest import call, user

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def client(tk, **kwargs) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=tk.base_url[: -len("/v1")], api_key="sk-ant-test", max_retries=0, **kwargs)


def ask(tk, stream: bool, **kwargs):
    kwargs = {"model": "claude-test", "max_tokens": 256, **kwargs}
    with client(tk) as api:
        if not stream:
            return api.messages.create(**kwargs)
        with api.messages.stream(**kwargs) as events:
            seen = list(events)
            final = events.get_final_message()
        final._events = seen  # type: ignore[attr-defined]
        return final


def blocks(message) -> list[dict]:
    return [block.model_dump(exclude_none=True) for block in message.content]


def question() -> list[dict]:
    return [{"role": "user", "content": user()[0]["content"]}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_declared_call_runs_and_stays_hidden(scripted, tk, stream):
    scripted.script({"content": "Looking. ", "tool_calls": [call("lookup", {"word": "fjord"})]},
                    {"content": "It means: {tool_result}"})
    message = ask(tk, stream, messages=question())
    assert tk.calls() == [["lookup", "fjord"]]
    assert [b.type for b in message.content] == ["text", "text"]
    assert "".join(b.text for b in message.content) == 'Looking. It means: ran ["lookup", "fjord"]\n'
    assert message.stop_reason == "end_turn" and message.id.startswith("msg_scripted")
    # usage summed over both rounds: (10 + 19) and (30 + 12), as the scripted model counts
    assert (message.usage.input_tokens, message.usage.output_tokens) == (40, 31)
    sent = scripted.bodies()[0]
    lookup = next(t for t in sent["tools"] if t["name"] == "lookup")
    assert set(lookup) == {"name", "description", "input_schema"}
    if stream:
        events = message._events
        starts = [e.index for e in events if e.type == "content_block_start"]
        assert starts == [0, 1] and sum(e.type == "message_start" for e in events) == 1
        assert not any(getattr(getattr(e, "content_block", None), "type", "") == "tool_use" for e in events)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_mixed_turn_returns_only_the_agents_call_and_merges_the_results(scripted, tk, stream):
    scripted.script({"content": "Checking. ", "tool_calls": [call("lookup", {"word": "a"}, "toolu_dec"),
                                                            call("get_weather", {"city": "Oslo"}, "toolu_own")]},
                    {"content": "Oslo is sunny; a is alpha."})
    first = question()
    message = ask(tk, stream, messages=first, tools=[WEATHER])
    assert message.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "id", None)) for b in message.content] == [("text", None), ("tool_use", "toolu_own")]
    follow = [*first, {"role": "assistant", "content": blocks(message)},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_own", "content": "sunny"},
                                           {"type": "text", "text": "And then?"}]}]
    final = ask(tk, stream, messages=follow, tools=[WEATHER])
    assert final.content[0].text == "Oslo is sunny; a is alpha."
    last = scripted.bodies()[-1]["messages"][-1]["content"]
    assert [(b["type"], b.get("tool_use_id")) for b in last] == [
        ("tool_result", "toolu_dec"), ("tool_result", "toolu_own"), ("text", None)]


def test_thinking_travels_with_the_call_it_precedes(scripted, tk):
    scripted.script({"thinking": "Look it up first.", "tool_calls": [call("lookup", {"word": "t"})]},
                    {"thinking": "Now answer.", "content": "Found it."})
    first = question()
    message = ask(tk, True, messages=first)
    assert [b.type for b in message.content] == ["thinking", "text"]  # the hidden call's thinking is gone
    assert message.content[0].signature.startswith("sig-")
    scripted.script({"content": "ok"})
    ask(tk, False, messages=[*first, {"role": "assistant", "content": blocks(message)},
                             {"role": "user", "content": "thanks"}])
    sent = scripted.bodies()[0]["messages"]  # every thinking block back, unchanged (the model checks signatures)
    assert [[b["type"] for b in m["content"]] if isinstance(m["content"], list) else "text" for m in sent] == [
        "text", ["thinking", "tool_use"], ["tool_result"], ["thinking", "text"], "text"]


def test_five_turns_of_history_are_accepted_by_the_strict_model(scripted, tk):
    history: list[dict] = []
    for turn in range(5):
        scripted.script({"tool_calls": [call("lookup", {"word": f"w{turn}"})]}, {"content": f"answer {turn}"})
        history.append({"role": "user", "content": f"turn {turn} {user()[0]['content']}"})
        message = ask(tk, turn % 2 == 1, messages=history)
        assert message.content[0].text == f"answer {turn}"
        history.append({"role": "assistant", "content": blocks(message)})
        sent = scripted.bodies()[0]["messages"]
        assert sum(1 for m in sent if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_use") == turn


def test_a_denied_call_is_answered_to_the_model(scripted, tk):
    scripted.script({"tool_calls": [call("lookup", {"word": "/home/me/.ssh/id_rsa"})]}, {"content": "{tool_result}"})
    message = ask(tk, False, messages=question())
    assert message.content[0].text.startswith("Not run: lookup was not allowed")
    assert tk.calls() == []


def test_pings_while_a_declared_call_runs(scripted, tk):
    from test_hardening import post

    scripted.script({"tool_calls": [call("nap", {"seconds": 0.7})]}, {"content": "rested"})
    body = {"model": "c", "max_tokens": 50, "messages": question(), "stream": True}
    response, data = post(tk, "/v1/messages", json.dumps(body).encode(), {"Content-Type": "application/json"})
    text = data.decode()
    assert response.status == 200 and 'event: ping\ndata: {"type": "ping"}' in text
    assert text.rstrip().endswith('data: {"type":"message_stop"}')


@pytest.mark.parametrize("body", [
    {"model": "c", "max_tokens": 5},
    {"model": "c", "max_tokens": 5, "messages": [{"role": "wizard", "content": "hi"}]},
    {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": 5}]},
    {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
    {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [{"x": 1}]},
    {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tool_choice": "any"},
])
def test_a_malformed_request_is_a_400_in_anthropics_shape(tk, body):
    from test_hardening import post

    response, data = post(tk, "/v1/messages", json.dumps(body).encode(), {"Content-Type": "application/json"})
    error = json.loads(data)
    assert response.status == 400 and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"


def test_an_overloaded_model_keeps_its_meaning(scripted, tk):
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    scripted.script({"status": 529, "body": overloaded})
    with pytest.raises(anthropic.APIStatusError) as raised:
        ask(tk, False, messages=question())
    assert raised.value.status_code == 529 and raised.value.body == overloaded


def test_a_stream_cut_before_message_stop_is_an_error_event(scripted, tk):
    start = {"type": "message_start", "message": {"id": "msg_cut", "type": "message", "role": "assistant",
                                                  "model": "c", "content": [], "stop_reason": None,
                                                  "usage": {"input_tokens": 1, "output_tokens": 1}}}
    opened = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}
    raw = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in (start, opened, text))
    scripted.script({"raw": raw, "content_type": "text/event-stream"})
    with pytest.raises(anthropic.APIError):
        ask(tk, True, messages=question())


def test_headers_and_query_go_upstream_and_count_tokens_counts_the_declared_tools(scripted, tk):
    scripted.script({"content": "hi"})
    with client(tk, default_headers={"anthropic-beta": "some-beta-2026"}) as api:
        api.messages.create(model="c", max_tokens=5, messages=question(), extra_query={"beta": "true"})
        counted = api.messages.count_tokens(model="c", messages=question(), tools=[WEATHER])
    sent = scripted.requests()[0]
    headers = {name.lower(): value for name, value in sent["headers"].items()}
    assert sent["query"] == "beta=true"
    # the key as the agent sent it (this SDK sends Authorization: Bearer; Claude Code sends x-api-key)
    assert headers.get("x-api-key") == "sk-ant-test" or headers.get("authorization") == "Bearer sk-ant-test"
    assert headers["anthropic-beta"] == "some-beta-2026" and headers["anthropic-version"]
    assert counted.input_tokens > 100  # the scripted count charges 100 a tool: the declared ones were there too


def test_the_record_says_messages(scripted, tk):
    scripted.script({"tool_calls": [call("lookup", {"word": "api"})]}, {"content": "ok"})
    ask(tk, False, messages=question())
    metrics = urllib.request.urlopen(tk.base_url[:-3] + "/metrics", timeout=10).read().decode()
    assert 'toolkeeper_requests_total{api="messages"' in metrics


def test_a_user_message_resent_as_a_string_still_finds_its_history(scripted, tk):
    """Claude Code's --continue may resend a one-block user message as a plain string."""
    text = user()[0]["content"]
    scripted.script({"tool_calls": [call("lookup", {"word": "s"})]}, {"content": "first answer"})
    first = ask(tk, False, messages=[{"role": "user", "content": [{"type": "text", "text": text}]}])
    scripted.script({"content": "second answer"})
    ask(tk, False, messages=[{"role": "user", "content": text}, {"role": "assistant", "content": blocks(first)},
                             {"role": "user", "content": "and?"}])
    sent = scripted.bodies()[0]["messages"]
    assert any(b.get("type") == "tool_use" for m in sent if isinstance(m["content"], list) for b in m["content"])


def test_a_web_page_is_refused_in_anthropics_shape(tk):
    from test_hardening import post

    body = {"model": "c", "max_tokens": 5, "messages": question()}
    response, data = post(tk, "/v1/messages", json.dumps(body).encode(),
                          {"Content-Type": "application/json", "Origin": "http://evil.example"})
    error = json.loads(data)
    assert response.status == 403 and error["type"] == "error" and error["error"]["type"] == "permission_error"
