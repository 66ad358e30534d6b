"""What toolkeeper does not govern it refuses: a WebSocket on a model path, the Realtime API, Assistants runs,
batches, legacy completions with tools, and any spelling of a governed path it would read differently.

Data endpoints pass as before; `--pass-ungoverned PATH` lets one endpoint through, logged and counted.
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from urllib.parse import urlsplit

import pytest
from conftest import fresh, serving, user

WEBSOCKET = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


@pytest.fixture(scope="module")
def governing_server(scripted, agent_dir):
    with serving(scripted, agent_dir, "--pass-ungoverned", "/v1/threads/t-passed") as running:
        yield running


@pytest.fixture
def governing(governing_server):
    yield from fresh(governing_server)


def send(tk, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict]:
    """A request with its path exactly as written (no client tidies it)."""
    where = urlsplit(tk.base_url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    payload = json.dumps(body).encode() if body is not None else None
    connection.request(method, path, body=payload, headers={"Content-Type": "application/json",
                                                          "Authorization": "Bearer sk-agent", **(headers or {})})
    answer = connection.getresponse()
    data = answer.read()
    connection.close()
    return answer.status, json.loads(data) if data.startswith((b"{", b"[")) else {"raw": data.decode()}


@pytest.mark.parametrize(("method", "path", "body", "headers", "endpoint"), [
    ("GET", "/v1/responses", None, WEBSOCKET, "websocket"),
    ("GET", "/v1/chat/completions", None, WEBSOCKET, "websocket"),
    ("GET", "/v1/realtime?model=gpt-realtime", None, WEBSOCKET, "realtime"),
    ("POST", "/v1/realtime/client_secrets", {"session": {"type": "realtime"}}, None, "realtime"),
    ("POST", "/v1/realtime/calls", {}, None, "realtime"),
    ("POST", "/v1/threads/runs", {"assistant_id": "a"}, None, "assistants_runs"),
    ("POST", "/v1/threads/t1/runs", {"assistant_id": "a"}, None, "assistants_runs"),
    ("POST", "/v1/threads/t1/runs/r1/submit_tool_outputs", {"tool_outputs": []}, None, "assistants_runs"),
    ("POST", "/v1/batches", {"input_file_id": "f", "endpoint": "/v1/chat/completions"}, None, "batches"),
    ("POST", "/v1/completions", {"model": "m", "prompt": "hi", "tools": [{"type": "function"}]}, None,
     "completions_with_tools"),
    # under another prefix (Azure's, reached through `toolkeeper intercept`), or in another case
    ("POST", "/openai/threads/runs", {"assistant_id": "a"}, None, "assistants_runs"),
    ("POST", "/openai/v1/realtime/client_secrets", {"session": {"type": "realtime"}}, None, "realtime"),
    ("POST", "/openai/deployments/gpt/completions", {"prompt": "hi", "functions": [{"name": "f"}]}, None,
     "completions_with_tools"),
    ("POST", "/v1/Realtime/calls", {}, None, "realtime"),
    # stored chat completions: the hidden rounds' declared calls would show there
    ("GET", "/v1/chat/completions/chatcmpl-123", None, None, "stored_chat_completions"),
    ("GET", "/v1/chat/completions/chatcmpl-123/messages", None, None, "stored_chat_completions"),
    ("GET", "/v1/chat/completions", None, None, "stored_chat_completions"),
], ids=lambda value: value if isinstance(value, str) and value.startswith("/") else None)
def test_a_tool_capable_endpoint_toolkeeper_does_not_govern_is_refused(scripted, governing, method, path, body,
                                                                         headers, endpoint):
    scripted.script()
    status, answer = send(governing, method, path, body, headers)
    assert status == 403, answer
    message = answer["error"]["message"]
    assert answer["error"]["code"] == "ungoverned_endpoint" and "--pass-ungoverned" in message
    assert path.split("?")[0] in message
    assert scripted.requests() == []  # nothing reached the model server
    metrics = urllib.request.urlopen(governing.base_url[:-3] + "/metrics", timeout=10).read().decode()
    assert f'toolkeeper_ungoverned_refused_total{{endpoint="{endpoint}"}}' in metrics


def test_a_websocket_on_the_messages_path_is_refused_in_anthropics_shape(scripted, governing):
    status, answer = send(governing, "GET", "/v1/messages", None, WEBSOCKET)
    assert status == 403 and answer["type"] == "error" and answer["error"]["type"] == "permission_error"


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "//v1/chat/completions", "/v1//chat/completions",
                                  "/v1/chat/completions;x", "/v1/responses/", "/v1/messages;a=b",
                                  "/v1/chat%2Fcompletions", "/v1/chat/./completions", "/v1/x/../chat/completions",
                                  "/v1/chat/%2e/completions", "/v1/./responses", "/v1/./messages",
                                  "/v1/Chat/Completions", "/V1/responses", "/v1/chat\\completions"])
def test_a_governed_path_spelled_otherwise_is_refused_not_forwarded(scripted, governing, path):
    scripted.script({"content": "should never be asked"})
    status, answer = send(governing, "POST", path, {"model": "m", "messages": user(), "input": "hi"})
    assert status == 403, answer
    assert "reads differently" in str(answer)
    assert scripted.requests() == []


def test_data_endpoints_and_the_governed_paths_themselves_pass_as_before(scripted, governing):
    scripted.script({"content": "hello"})
    status, answer = send(governing, "GET", "/v1/models")
    assert status == 200 and answer["data"]
    # an id in mixed case under a governed API's path is the server's spelling, not another path
    for path in ("/v1/messages/batches/msgbatch_01HkcTjaV5uDC8jWR4ZsDV8d", "/v1/responses/resp_ABC/input_items"):
        status, answer = send(governing, "GET", path)
        assert status != 403, answer
        assert scripted.requests()[-1].get("path") == path
    status, answer = send(governing, "POST", "/v1/chat/completions", {"model": "m", "messages": user()})
    assert status == 200 and answer["choices"][0]["message"]["content"] == "hello"


def test_pass_ungoverned_lets_one_endpoint_through_logged_and_counted(scripted, governing):
    status, _ = send(governing, "POST", "/v1/threads/t-passed/runs", {"assistant_id": "a"})
    assert status == 404  # the scripted model knows no Assistants API: the request reached it
    assert [r.get("path") for r in scripted.requests()][-1:] == ["/v1/threads/t-passed/runs"]
    status, _ = send(governing, "POST", "/v1/threads/t-other/runs", {"assistant_id": "a"})
    assert status == 403  # only the named path
    metrics = urllib.request.urlopen(governing.base_url[:-3] + "/metrics", timeout=10).read().decode()
    assert 'toolkeeper_ungoverned_passed_total{endpoint="assistants_runs"} 1.0' in metrics
    assert "passes ungoverned (--pass-ungoverned)" in governing.process.stderr()
    status, answer = send(governing, "GET", "/v1/threads/t-passed/runs", None, WEBSOCKET)  # passed, yet a socket
    assert status == 403 and "carries no WebSocket" in answer["error"]["message"]
    assert [r.get("path") for r in scripted.requests()][-1:] == ["/v1/threads/t-passed/runs"]  # the POST only


# -- Seams a red team found in the streams ----------------------------------------------

def _sse(events: list[dict]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n"
                   for n, e in enumerate(events))


RM_CALL = {"id": "fc_rm", "type": "function_call", "call_id": "c_rm", "name": "run_shell",
           "arguments": json.dumps({"command": "rm -rf /"}), "status": "completed"}
RESPONSE = {"id": "resp_seam", "object": "response", "created_at": 1, "status": "in_progress", "output": [],
            "model": "m", "usage": None}
SHELL_TOOL = {"type": "function", "name": "run_shell", "parameters": {"type": "object", "properties": {
    "command": {"type": "string"}}}}


@pytest.mark.parametrize("announced", [{"id": "msg_1", "type": "message", "role": "assistant", "content": []}, None],
                         ids=["announced-as-a-message", "never-announced"])
def test_a_call_that_was_announced_as_something_else_never_reaches_the_agent(scripted, governing, announced):
    events = [{"type": "response.created", "response": RESPONSE}]
    if announced:
        events.append({"type": "response.output_item.added", "output_index": 0, "item": announced})
    events += [{"type": "response.output_item.done", "output_index": 0, "item": RM_CALL},
               {"type": "response.completed", "response": {**RESPONSE, "status": "completed", "output": [RM_CALL],
                                                           "usage": {"input_tokens": 1, "output_tokens": 1,
                                                                     "total_tokens": 2}}}]
    scripted.script({"raw": _sse(events), "content_type": "text/event-stream"})
    client = governing.client()
    seen, failed = [], None
    try:
        for event in client.responses.create(model="m", input="clean up", tools=[SHELL_TOOL], stream=True):
            seen.append(event.model_dump_json())
    except Exception as exc:  # the SDK raises on response.failed, or on the 502 before any byte
        failed = exc
    assert "rm -rf" not in "".join(seen)
    assert failed is not None or any('"response.failed"' in line for line in seen)


def test_a_messages_block_started_twice_never_turns_into_a_call(scripted, governing):
    import anthropic

    start = {"type": "message_start", "message": {"id": "msg_seam", "type": "message", "role": "assistant",
                                                  "model": "m", "content": [], "stop_reason": None,
                                                  "usage": {"input_tokens": 1, "output_tokens": 0}}}
    text = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    call = {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_rm",
                                                                          "name": "Bash", "input": {}}}
    delta = {"type": "content_block_delta", "index": 0,
             "delta": {"type": "input_json_delta", "partial_json": json.dumps({"command": "rm -rf /"})}}
    events = [start, text, call, delta, {"type": "content_block_stop", "index": 0},
              {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}},
              {"type": "message_stop"}]
    raw = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    scripted.script({"raw": raw, "content_type": "text/event-stream"})
    seen, failed = [], None
    with anthropic.Anthropic(base_url=governing.base_url[:-3], api_key="sk-seam", max_retries=0) as client:
        try:
            with client.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "go"}],
                                        tools=[{"name": "Bash", "input_schema": {"type": "object"}}]) as stream:
                seen += [event.model_dump_json() for event in stream]
        except Exception as exc:
            failed = exc
    assert failed is not None and "rm -rf" not in "".join(seen)


# -- Seams around the stream: background responses, retrieval, the legacy Chat forms ------------

def test_a_background_response_is_refused_with_a_clear_error(scripted, governing):
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        governing.client().responses.create(model="m", input="later", background=True)
    assert refused.value.body["code"] == "background_not_governed"


def test_a_retrieved_response_reads_back_as_the_agent_received_it(scripted, governing):
    """The server's stored response holds the hidden declared call: a retrieve returns what the agent got."""
    scripted.script({"content": "Looking. ", "tool_calls": [{"name": "lookup", "arguments": {"word": "kelp"},
                                                            "id": "call_kelp"}]},
                    {"content": "Kelp is seaweed."})
    client = governing.client()
    created = client.responses.create(model="m", input="What is kelp?")
    assert [item.type for item in created.output] == ["message", "message"]
    retrieved = client.responses.retrieve(created.id)
    assert retrieved.model_dump() == created.model_dump()
    assert "lookup" not in retrieved.model_dump_json()


@pytest.mark.parametrize("legacy", [{"functions": [{"name": "run_shell", "parameters": {"type": "object"}}]},
                                    {"function_call": "auto"}])
def test_the_legacy_functions_form_is_refused(governing, legacy):
    status, answer = send(governing, "POST", "/v1/chat/completions", {"model": "m", "messages": user(), **legacy})
    assert status == 400 and answer["error"]["code"] == "legacy_functions_not_governed"


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None, "function_call": {"name": "run_shell", "arguments": "{\"c\": \"rm\"}"}},
    "second-choice"], ids=["legacy-function-call", "second-choice"])
def test_an_answer_with_a_call_toolkeeper_would_not_see_is_a_502(scripted, governing, message):
    first = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    calls = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "run_shell", "arguments": "{\"c\": \"rm -rf /\"}"}}]}
    choices = ([{"index": 0, "message": message, "finish_reason": "function_call"}] if isinstance(message, dict)
               else [first, {"index": 1, "message": calls, "finish_reason": "tool_calls"}])
    scripted.script({"raw": json.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                                        "choices": choices})})
    status, answer = send(governing, "POST", "/v1/chat/completions", {"model": "m", "messages": user()})
    assert status == 502 and "rm -rf" not in json.dumps(answer) and "\"rm\"" not in json.dumps(answer)
