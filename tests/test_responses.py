"""The Responses API (`/v1/responses`) through toolkeeper, driven by the real openai client.

The scripted model server is strict as OpenAI's: every request toolkeeper sends it must hold together
(no orphan output, no call left unanswered, reasoning followed by its item, chains that exist), or it
answers 400 and the test fails.
"""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest
from conftest import YOLO, audit_cli, call, user

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
           "strict": True}


def question() -> str:
    return user()[0]["content"]


def items(response) -> list[dict]:
    """What an agent keeps of a response's output to send back (as the SDKs do)."""
    return [item.model_dump(exclude_none=True) for item in response.output]


def run(client, stream: bool, **kwargs):
    if not stream:
        return client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as events:
        kinds = [event for event in events]
        final = events.get_final_response()
    final._events = kinds  # type: ignore[attr-defined]
    return final


def upstream_inputs(scripted) -> list[list[dict]]:
    return [body["input"] for body in scripted.bodies()]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_declared_call_runs_and_stays_hidden(scripted, tk, stream):
    scripted.script({"content": "Looking. ", "tool_calls": [call("lookup", {"word": "fjord"})]},
                    {"content": "It means: {tool_result}"})
    response = run(tk.client(), stream, model="m", input=question())
    assert tk.calls() == [["lookup", "fjord"]]
    assert [item.type for item in response.output] == ["message", "message"]
    assert response.output_text == 'Looking. It means: ran ["lookup", "fjord"]\n'
    assert response.status == "completed" and response.id.startswith("resp_scripted")
    # usage summed over both rounds: (10 + 19) and (40 + 12), as the scripted model counts
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (50, 31, 81)
    lookup = next(t for t in scripted.bodies()[0]["tools"] if t.get("name") == "lookup")
    assert lookup["type"] == "function" and "function" not in lookup and lookup["parameters"]["type"] == "object"
    assert response.tools == []  # the server echoes the tools it got; the agent sees only its own
    if stream:
        events = response._events
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert events[0].response.tools == [] and events[-1].response.tools == []
        assert not any(getattr(getattr(e, "item", None), "type", "") == "function_call" for e in events)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert not any("function_call" in e.type for e in events)
        added = [e.output_index for e in events if e.type == "response.output_item.added"]
        assert added == [0, 1]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_mixed_response_returns_only_the_agents_call_and_the_history_holds(scripted, tk, stream):
    scripted.script({"content": "Checking. ", "tool_calls": [call("lookup", {"word": "a"}, "call_decl"),
                                                            call("get_weather", {"city": "Oslo"}, "call_own")]},
                    {"content": "Oslo is sunny; a is alpha."})
    client = tk.client()
    first_input = [{"role": "user", "content": question()}]
    response = run(client, stream, model="m", input=first_input, tools=[WEATHER], store=False)
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.call_id, c.name) for c in calls] == [("call_own", "get_weather")]
    follow = [*first_input, *items(response),
              {"type": "function_call_output", "call_id": "call_own", "output": "sunny, 21 C"}]
    final = run(client, stream, model="m", input=follow, tools=[WEATHER], store=False)
    assert final.output_text == "Oslo is sunny; a is alpha."
    sent = scripted.bodies()[-1]["input"]
    kinds = [(i.get("type", "message"), i.get("call_id")) for i in sent]
    assert kinds == [("message", None), ("message", None), ("function_call", "call_decl"),
                     ("function_call", "call_own"), ("function_call_output", "call_decl"),
                     ("function_call_output", "call_own")]


def test_five_store_false_turns_give_the_model_the_whole_history(scripted, tk):
    client = tk.client()
    history: list[dict] = []
    for turn in range(5):
        scripted.script({"tool_calls": [call("lookup", {"word": f"w{turn}"})]}, {"content": f"answer {turn}"})
        history.append({"role": "user", "content": f"turn {turn} {question()}"})
        response = client.responses.create(model="m", input=history, store=False)
        assert response.output_text == f"answer {turn}"
        history += items(response)
        sent = scripted.bodies()[0]["input"]
        # every earlier turn's hidden call and its result are back in place (the strict model checked the pairs)
        assert sum(1 for i in sent if i.get("type") == "function_call") == turn
        assert sum(1 for i in sent if i.get("type") == "function_call_output") == turn


def test_a_previous_response_id_chain_over_five_turns(scripted, tk):
    client = tk.client()
    previous = None
    for turn in range(5):
        scripted.script({"tool_calls": [call("lookup", {"word": f"c{turn}"})]}, {"content": f"chained {turn}"})
        kwargs = {"previous_response_id": previous} if previous else {}
        response = client.responses.create(model="m", input=f"turn {turn} {question()}", **kwargs)
        assert response.output_text == f"chained {turn}"
        previous = response.id
        bodies = scripted.bodies()
        if turn:
            # the id the agent got stands for the last round of its turn: the chain holds every hidden round
            assert bodies[0]["previous_response_id"] not in (None, kwargs["previous_response_id"])
            assert bodies[1]["previous_response_id"].startswith("resp_scripted")  # the hidden round, chained
            assert [i.get("type") for i in bodies[1]["input"]] == ["function_call_output"]
    assert len(tk.calls()) == 5


def test_a_mixed_turn_over_previous_response_id_sends_the_owed_results(scripted, tk):
    scripted.script({"tool_calls": [call("lookup", {"word": "b"}, "call_d"),
                                    call("get_weather", {"city": "Rome"}, "call_o")]},
                    {"content": "Rome is warm."})
    client = tk.client()
    first = client.responses.create(model="m", input=question(), tools=[WEATHER])
    assert [c.call_id for c in first.output if c.type == "function_call"] == ["call_o"]
    final = client.responses.create(model="m", previous_response_id=first.id, tools=[WEATHER],
                                    input=[{"type": "function_call_output", "call_id": "call_o", "output": "warm"}])
    assert final.output_text == "Rome is warm."
    sent = scripted.bodies()[-1]["input"]
    assert [i["call_id"] for i in sent] == ["call_d", "call_o"]


def test_a_denied_call_is_answered_to_the_model(scripted, tk):
    scripted.script({"tool_calls": [call("lookup", {"word": "/home/me/.ssh/id_rsa"})]}, {"content": "{tool_result}"})
    response = tk.client().responses.create(model="m", input=question())
    assert response.output_text.startswith("Not run: lookup was not allowed")
    assert tk.calls() == []


def test_reasoning_travels_with_the_call_it_precedes(scripted, tk):
    scripted.script({"reasoning": "I should look it up.", "tool_calls": [call("lookup", {"word": "r"})]},
                    {"reasoning": "Now answer.", "content": "done"})
    client = tk.client()
    history = [{"role": "user", "content": question()}]
    response = run(client, True, model="m", input=history, store=False, include=["reasoning.encrypted_content"])
    assert [i.type for i in response.output] == ["reasoning", "message"]  # the hidden call's reasoning is gone
    assert response.output[0].encrypted_content.startswith("gAAAA-scripted-")
    scripted.script({"content": "next"})
    client.responses.create(model="m", input=[*history, *items(response), {"role": "user", "content": "more"}],
                            store=False)
    sent = scripted.bodies()[0]["input"]
    assert [i.get("type", "message") for i in sent] == ["message", "reasoning", "function_call",
                                                        "function_call_output", "reasoning", "message", "message"]


@pytest.mark.parametrize("body", [
    {"model": "m"},
    {"model": "m", "input": 5},
    {"model": "m", "input": [{"type": "function_call_output"}]},
    {"model": "m", "input": "hi", "tools": "lookup"},
    {"model": "m", "input": "hi", "tool_choice": 3},
    {"model": "m", "input": [{"role": "wizard", "content": "hi"}]},
    {"model": "m", "input": "hi", "tools": [{"type": "mcp", "server_label": ["a"], "server_url": "https://x"}]},
])
def test_a_malformed_request_is_a_400(tk, body):
    from test_hardening import post

    response, data = post(tk, "/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert response.status == 400, data
    assert json.loads(data)["error"]["type"] == "invalid_request_error"


def test_an_upstream_failure_mid_stream_is_a_response_failed(scripted, tk):
    failed = {"type": "response.failed", "sequence_number": 2, "response": {
        "id": "resp_x", "object": "response", "status": "failed", "output": [], "model": "m", "created_at": 1,
        "error": {"code": "server_error", "message": "The model failed."}}}
    created = {"type": "response.created", "sequence_number": 0, "response": {
        "id": "resp_x", "object": "response", "status": "in_progress", "output": [], "model": "m", "created_at": 1}}
    text = {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
            "item": {"id": "msg_x", "type": "message", "role": "assistant", "status": "in_progress", "content": []}}
    raw = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in (created, text, failed))
    scripted.script({"raw": raw, "content_type": "text/event-stream"})
    with pytest.raises(openai.APIError), tk.client().responses.stream(model="m", input=question()) as events:
        for _ in events:
            pass


def test_the_record_says_which_api(scripted, tmp_path):
    import subprocess
    import sys

    from conftest import LOOKUP, ROOT, start_toolkeeper, write_agent
    from conftest import Toolkeeper as Tk

    write_agent(tmp_path, YOLO + LOOKUP)
    process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--audit", str(tmp_path / "a.sqlite3"))
    try:
        scripted.script({"tool_calls": [call("lookup", {"word": "api"})]}, {"content": "ok"})
        Tk(process, tmp_path).client().responses.create(model="m", input=question())
    finally:
        process.stop()
    exported = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "--db", str(tmp_path / "a.sqlite3"),
                               "export"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert json.loads(exported.splitlines()[-1])["api"] == "responses"


def test_keep_alives_while_a_declared_call_runs(scripted, tk):
    from test_hardening import post

    scripted.script({"tool_calls": [call("nap", {"seconds": 0.7})]}, {"content": "rested"})
    body = {"model": "m", "input": question(), "stream": True}
    response, data = post(tk, "/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert response.status == 200
    text = data.decode()
    assert ": keep-alive" in text and "rested" in text and "nap" not in text
    assert text.rstrip().splitlines()[-1].startswith('data: {"type":"response.completed"')


def test_a_model_endpoint_toolkeeper_does_not_speak_is_logged_and_counted(scripted, tk):
    from test_hardening import post

    for _ in range(2):
        post(tk, "/v1/completions", b'{"model": "m", "prompt": "hi"}', {"Content-Type": "application/json"})
    metrics = urllib.request.urlopen(tk.base_url[:-3] + "/metrics", timeout=10).read().decode()
    assert 'toolkeeper_unspoken_requests_total{endpoint="completions"} 2.0' in metrics
    log = tk.process.stderr()
    assert log.count("/v1/completions is passed through untouched") == 1


@pytest.mark.parametrize("form", ["reference", "stripped"])
def test_history_resent_as_references_or_without_ids_is_recognised(scripted, tk, form):
    """The Vercel AI SDK sends what it received as item_reference; pydantic-ai strips the ids."""
    scripted.script({"tool_calls": [call("lookup", {"word": form})]}, {"content": f"about {form}"})
    client = tk.client()
    first = [{"role": "user", "content": question()}]
    response = client.responses.create(model="m", input=first)
    (message,) = response.output
    resent = ({"type": "item_reference", "id": message.id} if form == "reference"
              else {"role": "assistant", "content": response.output_text})
    scripted.script({"content": "more"})
    client.responses.create(model="m", input=[*first, resent, {"role": "user", "content": "more please"}])
    sent = scripted.bodies()[0]["input"]
    kinds = [(i.get("type", "message"), i.get("role")) for i in sent]
    assert kinds == [("message", "user"), ("function_call", None), ("function_call_output", None),
                     ("message", "assistant"), ("message", "user")]


@pytest.mark.parametrize("broken", ["cut", "malformed"])
def test_a_broken_upstream_stream_is_a_response_failed_or_a_502(scripted, tk, broken):
    from test_hardening import post

    created = {"type": "response.created", "sequence_number": 0, "response": {
        "id": "resp_b", "object": "response", "status": "in_progress", "output": [], "model": "m", "created_at": 1}}
    added = {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
             "item": {"id": "msg_b", "type": "message", "role": "assistant", "status": "in_progress", "content": []}}
    tail = "" if broken == "cut" else "event: x\ndata: {not json\n\n"
    raw = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in (created, added)) + tail
    for stream in (True, False):
        scripted.script({"raw": raw, "content_type": "text/event-stream"})
        body = {"model": "m", "input": question(), "stream": stream}
        response, data = post(tk, "/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"})
        if stream and response.status == 200:  # the agent read the start: the response ends failed, its shape
            last = json.loads(data.decode().rstrip().rsplit("data: ", 1)[1])
            assert last["type"] == "response.failed" and last["response"]["error"]["code"] == "upstream_malformed"
        else:  # nothing sent yet (the broken part came in the same read): the error keeps its status
            assert response.status == 502 and json.loads(data)["error"]["code"] == "upstream_malformed"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_call_of_a_namespaced_agent_tool_is_the_agents_even_when_a_declared_tool_has_its_name(scripted, tk,
                                                                                              stream):
    call_id = f"call_ns_{int(stream)}"
    item = {"type": "function_call", "call_id": call_id, "namespace": "crm", "name": "lookup",
            "arguments": '{"word": "a"}'}
    scripted.script({"items": [item]})
    namespace = {"type": "namespace", "name": "crm", "description": "The CRM's tools.",
                 "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]}
    response = run(tk.client(), stream, model="m", input=[{"role": "user", "content": question()}],
                   tools=[namespace], store=False)
    calls = [entry for entry in items(response) if entry["type"] == "function_call"]
    assert [(c["call_id"], c.get("namespace"), c["name"]) for c in calls] == [(call_id, "crm", "lookup")]
    assert len(scripted.bodies()) == 1  # not run by toolkeeper: no second round
    assert tk.calls() == []  # the declared lookup never ran
    exported = audit_cli(tk.directory / "toolkeeper-audit.sqlite3", "export", "--source", "agent")
    forwarded = [json.loads(line) for line in exported.stdout.splitlines() if f'"{call_id}"' in line]
    assert [(r["tool"], r["status"]) for r in forwarded] == [("crm.lookup", "forwarded")], exported.stderr
