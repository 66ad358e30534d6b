"""An answer every parser reads as toolkeeper does: a key given twice goes to the agent once (as toolkeeper read
it), a key of an API's structure in another case is refused. Either would let an agent whose parser keeps a
key's first copy, or matches keys in any case (Go), read a call toolkeeper never saw."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from conftest import user

BASH = {"id": "call_x", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "rm -rf /"}'}}


def post(tk, path: str, body: dict) -> tuple[int, bytes]:
    where = urlsplit(tk.base_url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    connection.request("POST", path, body=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": "Bearer sk-agent", "x-api-key": "sk-agent"})
    answer = connection.getresponse()
    data = answer.read()
    connection.close()
    return answer.status, data


def first_wins(text: str | bytes) -> dict:
    """JSON read as a parser that keeps a key's first copy reads it."""
    return json.loads(text, object_pairs_hook=lambda pairs: dict(reversed(pairs)))


def chat_whole(message: str) -> str:
    return ('{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":'
            + message + ',"finish_reason":"stop"}]}')


def test_read_alike_counts_each_key_once_and_check_keys_refuses_a_key_in_another_case():
    from toolkeeper.wire.ambiguity import check_keys, read_alike
    from toolkeeper.wire.errors import MalformedResponse

    def alike(raw: bytes) -> bool:
        parsed = json.loads(raw)
        check_keys(raw, parsed)
        return read_alike(raw, parsed)

    assert alike(b'{"a": "x", "b": [1, "y", {"c": null}]}')
    assert alike(b'{"a":"x","b":[1,"y",{"c":null}]}')
    assert alike(b'{"a": "say \\"hi\\" \\\\", "b": "\\\\\\"", "c": "\\u0022"}')  # escapes delimit nothing
    assert not alike(b'{"a": 1, "a": 2}')
    assert not alike(b'{"m": {"tool_calls": [1], "content": "x", "tool_calls": null}}')
    assert not alike(b'{"tool\\u005fcalls": [1], "tool_calls": null}')  # the same key, spelled with an escape
    for raw in (b'{"Tool_calls": [1]}', b'{"type": "text", "Type": "tool_use"}',
                '{"tool_call\u017f": [1]}'.encode(), b'{"a": [{"b": {"TYPE": 1}}]}'):
        with pytest.raises(MalformedResponse, match="lower case"):
            alike(raw)
    # what a model or a user wrote keeps its keys: a tool's input, an environment, metadata; and values are values
    assert alike(b'{"type": "tool_use", "input": {"Path": "a", "path": "b"}, "metadata": {"UserId": "u"}}')
    assert alike(b'{"text": "The Tool_calls KEY", "n": {"1": "\xc5\xbf"}}')


def test_a_whole_chat_answer_with_a_key_twice_goes_to_the_agent_as_toolkeeper_read_it(scripted, tk):
    twice = chat_whole('{"role":"assistant","tool_calls":' + json.dumps([BASH]) + ',"content":"Done.",'
                       '"tool_calls":null}')
    scripted.script({"raw": twice})
    status, data = post(tk, "/v1/chat/completions", {"model": "m", "messages": user()})
    assert status == 200, data
    message = first_wins(data)["choices"][0]["message"]
    assert message["content"] == "Done." and not message.get("tool_calls")  # what toolkeeper read, to any parser
    assert b"Bash" not in data

    scripted.script({"raw": chat_whole('{"role":"assistant","content":"Done."}')})
    status, data = post(tk, "/v1/chat/completions", {"model": "m", "messages": user()})
    assert data == chat_whole('{"role":"assistant","content":"Done."}').encode()  # the usual answer: as it came


@pytest.mark.parametrize("key", ["Tool_calls", "TOOL_CALLS", "tool_call\u017f"])
def test_a_whole_chat_answer_with_a_call_under_a_key_in_another_case_is_refused(scripted, tk, key):
    scripted.script({"raw": chat_whole('{"role":"assistant","content":null,"' + key + '":'
                                       + json.dumps([BASH]) + '}')})
    status, data = post(tk, "/v1/chat/completions", {"model": "m", "messages": user()})
    assert status == 502, data
    assert "lower case" in json.loads(data)["error"]["message"] and b"rm -rf" not in data
    assert tk.calls() == []


def _sse(*events: tuple[str, str]) -> str:
    return "".join(f"event: {name}\ndata: {data}\n\n" for name, data in events)


MESSAGE_START = ('{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m",'
                 '"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}')
MESSAGE_END = [("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
                                 '"usage":{"output_tokens":2}}'),
               ("message_stop", '{"type":"message_stop"}')]


def test_a_streamed_messages_block_with_a_key_twice_reaches_the_agent_as_toolkeeper_read_it(scripted, tk):
    """A block that starts as a tool_use to a parser keeping the first copy, and as text to toolkeeper: the agent
    gets toolkeeper's reading, re-encoded, and the usual events still go as they came."""
    start = ('{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1",'
             '"name":"Bash","input":{},"type":"text","text":""}}')
    delta = '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Done."}}'
    scripted.script({"raw": _sse(("message_start", MESSAGE_START), ("content_block_start", start),
                                 ("content_block_delta", delta),
                                 ("content_block_stop", '{"type":"content_block_stop","index":0}'), *MESSAGE_END),
                     "content_type": "text/event-stream"})
    status, data = post(tk, "/v1/messages", {"model": "m", "max_tokens": 64, "stream": True, "messages": user()})
    assert status == 200, data
    events = [first_wins(line[6:]) for line in data.decode().split("\n") if line.startswith("data: ")]
    blocks = [event["content_block"] for event in events if event["type"] == "content_block_start"]
    assert [block["type"] for block in blocks] == ["text"] and b"tool_use" not in data  # one type: toolkeeper's
    assert f"data: {delta}\n\n".encode() in data  # the server's own bytes, where nothing is in doubt


def test_a_streamed_responses_event_with_a_key_in_another_case_is_refused(scripted, tk):
    """`Type` beside `type`: a Go agent reads the event as an item added (a call toolkeeper never saw)."""
    created = ('{"type":"response.created","response":{"id":"resp_1","object":"response","created_at":1,'
               '"status":"in_progress","model":"m","output":[]},"sequence_number":0}')
    odd = ('{"type":"response.output_text.delta","Type":"response.output_item.added","output_index":0,'
           '"item":{"type":"function_call","call_id":"c","name":"Bash","arguments":"{}"},"delta":"x",'
           '"sequence_number":1}')
    scripted.script({"raw": _sse(("response.created", created), ("response.output_text.delta", odd)),
                     "content_type": "text/event-stream"})
    status, data = post(tk, "/v1/responses", {"model": "m", "stream": True, "input": "hi"})
    assert b"Bash" not in data and b"output_item.added" not in data
    assert status == 502 or b"response.failed" in data, data
    assert b"lower case" in data


def test_a_streamed_chat_event_with_a_key_folded_by_unicode_is_not_relayed_as_it_came():
    """`choices` with a long s (U+017F) is `choices` to Go, and so for `tool_calls`: an event with it (after the
    real one) goes as toolkeeper read it."""
    from toolkeeper.wire.apis.chat.model import TextShape, _Read
    from toolkeeper.wire.apis.chat.stream import StreamAssembler

    head = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
    folded = ('data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}],'
              '"choice\u017f":[{"index":0,"delta":{"tool_call\u017f":[{"index":0,"id":"x","function":{"name":"Bash",'
              '"arguments":"{}"}}]}}]}').encode()
    read = _Read(StreamAssembler(), TextShape())
    read.events([head, folded])
    assert read.visible[-1] == {"content": "hi"} and read.relay[-1] is None  # re-encoded, without the other choices


def test_the_answers_own_events_are_checked_down_to_their_response_fields():
    """A lifecycle event's response is the agent's (its fields merged into toolkeeper's own): an `Output` there is
    refused; deeper, where toolkeeper replaces the items (or keeps configuration), the walk stops."""
    from toolkeeper.wire.apis.relay import parse_event
    from toolkeeper.wire.apis.responses.reader import ResponsesReader
    from toolkeeper.wire.errors import MalformedResponse

    def event(response: str) -> bytes:
        return (b'event: response.completed\ndata: {"type":"response.completed","response":' + response.encode()
                + b',"sequence_number":9}')

    own, round_key = ResponsesReader.own_events, object()
    with pytest.raises(MalformedResponse, match="'Output'"):
        parse_event(event('{"id":"r","Output":[{"type":"function_call","name":"Bash"}],"output":[]}'), round_key, own)
    parse_event(event('{"id":"r","output":[],"text":{"format":{"Type":"text"}},"instructions":"Be Brief"}'),
                round_key, own)  # configuration toolkeeper passes on as it came: no call in it
    with pytest.raises(MalformedResponse, match="'Type'"):  # an item's event: walked to the bottom
        parse_event(b'event: response.output_item.done\ndata: {"type":"response.output_item.done","output_index":0,'
                    b'"item":{"type":"message","content":[{"Type":"x"}]}}', round_key, own)


def test_a_key_spelled_with_an_escape_is_read_for_what_it_spells():
    """`\\u0054ype` is `Type`: no upper case in the bytes, one in the key (a red team's find)."""
    from toolkeeper.wire.apis.relay import parse_event
    from toolkeeper.wire.errors import MalformedResponse

    start = (b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":'
             b'"text","text":"","\\u0054ype":"tool_use","id":"toolu_1","name":"bash","input":{}}}')
    with pytest.raises(MalformedResponse, match="'Type'"):
        parse_event(start, object())


def test_a_responses_item_event_without_its_index_is_refused():
    """An item's event with no integer output_index was kept as the response's own, and relayed: a call in it
    would have reached the agent unannounced (a red team's find)."""
    from toolkeeper.wire.apis.relay import parse_event
    from toolkeeper.wire.apis.responses.reader import ResponsesReader
    from toolkeeper.wire.errors import MalformedResponse

    item = b'"item":{"type":"function_call","call_id":"c1","name":"shell","arguments":"{}"}'
    for index in (b"", b'"output_index":0.0,', b'"output_index":"0",'):
        data = (b'event: response.output_item.done\ndata: {"type":"response.output_item.done",' + index + item
                + b',"sequence_number":3}')
        with pytest.raises(MalformedResponse, match="output_index"):
            ResponsesReader(frozenset(), None).take(data, object())
    assert parse_event(b'event: response.x\ndata: {"type":"response.x","sequence_number":1}', object())


def test_a_calls_arguments_must_say_the_same_in_its_deltas_and_its_item():
    """The rules read the finished item's arguments; an agent may build them from the deltas."""
    import orjson

    from toolkeeper.wire.apis.responses.reader import ResponsesReader
    from toolkeeper.wire.errors import MalformedResponse

    def sse(event: dict) -> bytes:
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event)

    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "shell", "arguments": ""}
    reader, key = ResponsesReader(frozenset(), None), object()
    for event in ({"type": "response.output_item.added", "output_index": 0, "item": call},
                  {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '{"command":"rm'},
                  {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": ' -rf ~"}'}):
        reader.take(sse(event), key)
    with pytest.raises(MalformedResponse, match="differ from the deltas"):
        reader.take(sse({"type": "response.output_item.done", "output_index": 0,
                         "item": {**call, "arguments": '{"command":"ls"}'}}), key)
    reader.take(sse({"type": "response.function_call_arguments.done", "output_index": 0,
                     "arguments": '{"command":"rm -rf ~"}'}), key)  # the same: fine


def test_a_messages_tool_input_that_parsers_read_differently_is_refused():
    from toolkeeper.wire.apis.messages.reader import MessagesReader
    from toolkeeper.wire.errors import MalformedResponse

    reader, key = MessagesReader(frozenset(), None), object()
    events = [b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":'
              b'{"type":"tool_use","id":"toolu_1","name":"bash","input":{}}}',
              b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":'
              b'{"type":"input_json_delta","partial_json":"{\\"command\\":\\"rm -rf ~\\",\\"command\\":\\"ls\\"}"}}']
    for data in events:
        reader.take(data, key)
    with pytest.raises(MalformedResponse, match="read as one"):
        reader.take(b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}', key)
