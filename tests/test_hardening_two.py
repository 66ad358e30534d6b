"""Hardening, round two: what a second red team and the acceptance checks found, each with its test."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from conftest import STANDARD_AGENT, audit_cli, call, run_cli, serving, user, write_agent
from test_governed import send


@pytest.fixture(scope="module")
def hardened(scripted, agent_dir):
    with serving(scripted, agent_dir, "--store", ":memory:", env={"TOOLKEEPER_INTERCEPT_SECRET": "s3cret"}) as tk:
        yield tk


# 1. A lone surrogate in a model's arguments is an invalid call, answered; never a 500.
@pytest.mark.parametrize("value", ["\\ud800", "\\ud800-5", "\\udfff tail"])
def test_a_lone_surrogate_in_the_arguments_is_answered_as_an_invalid_call(scripted, hardened, value):
    arguments = '{"word": "' + value + '"}'
    scripted.script({"tool_calls": [{"name": "lookup", "arguments": arguments, "id": "call_sur"}]},
                    {"content": "{tool_result}"})
    status, answer = send(hardened, "POST", "/v1/chat/completions", {"model": "m", "messages": user()})
    assert status == 200, answer
    said = answer["choices"][0]["message"]["content"]
    assert "not valid text" in said and "lookup" in said
    assert hardened.calls() == []  # nothing ran


# 2. A signed-header time that is no number toolkeeper can sign is refused, as a forged header is.
@pytest.mark.parametrize("stamp", ["inf", "1e400", "-inf", "nan"])
def test_an_intercept_header_with_an_impossible_time_is_refused_not_a_500(scripted, hardened, stamp):
    status, answer = send(hardened, "POST", "/v1/chat/completions", {"model": "m", "messages": user()},
                          {"X-Toolkeeper-Upstream": f"http://127.0.0.1:9/v1 {stamp} abc"})
    assert status == 400 and answer["error"]["code"] == "upstream_not_allowed"
    assert "malformed" in answer["error"]["message"]


# 3. A filter that does not parse is refused by the export and shown on the page, never left out.
ADMIN = "hardening-admin-token-0123456789abcdef"


@pytest.fixture(scope="module")
def audited(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("audited")
    write_agent(directory, STANDARD_AGENT)
    with serving(scripted, directory, "--store", ":memory:", "--audit", str(directory / "audit.sqlite3"),
                 env={"TOOLKEEPER_ADMIN_TOKEN": ADMIN}) as tk:
        yield tk


def admin_get(tk, path: str) -> tuple[int, str]:
    request = urllib.request.Request(tk.base_url[:-3] + path, headers={"Authorization": f"Bearer {ADMIN}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode()


@pytest.mark.parametrize("query", ["status=okk", "source=agnt", "since=yesterday-ish", "until=1e400", "last=2w"])
def test_a_filter_that_does_not_parse_is_refused_never_ignored(audited, query):
    status, text = admin_get(audited, f"/toolkeeper/audit/export?format=jsonl&{query}")
    assert status == 400 and query.split("=")[0] in text and "do not parse" in text
    status, text = admin_get(audited, f"/toolkeeper/audit?{query}")
    assert status == 400 and "id=problems" in text and query.split("=")[0] in text


def test_the_filters_that_parse_still_filter(scripted, audited):
    scripted.script({"tool_calls": [call("lookup", {"word": "ok"})]}, {"content": "done"})
    send(audited, "POST", "/v1/chat/completions", {"model": "m", "messages": user()})
    status, text = admin_get(audited, "/toolkeeper/audit/export?format=jsonl&status=ok&source=declared&last=1h")
    assert status == 200 and [json.loads(line)["tool"] for line in text.splitlines()] == ["lookup"]


# 4. A trail with an event forged into the middle of its chain is reported, never a traceback.
def test_a_forged_event_in_the_middle_of_the_chain_is_named_by_verify_not_a_crash(tmp_path):
    import sqlite3

    from toolkeeper.audit import ExecutionRecord, open_audit

    path = tmp_path / "trail.sqlite3"
    audit = open_audit(path)
    for word in ("a", "b", "c"):
        record = ExecutionRecord(tool="lookup", runner="argv", call_id=f"c_{word}", status="ok", argv=["lookup", word])
        audit.decided(record)
        audit.completed(record)
    audit.close()
    db = sqlite3.connect(path)
    rows = db.execute("SELECT seq FROM audit_events WHERE seq >= 3 ORDER BY seq DESC").fetchall()
    for (seq,) in rows:  # make room at 3, then forge an event there: a copy of the next one, renumbered
        db.execute("UPDATE audit_events SET seq = seq + 1 WHERE seq = ?", (seq,))
    columns = [c[1] for c in db.execute("PRAGMA table_info(audit_events)")]
    copied = [c for c in columns if c not in ("seq", "prev_hash", "hash")]
    db.execute(f"INSERT INTO audit_events (seq, prev_hash, hash, {', '.join(copied)}) "
               f"SELECT 3, 'f0' || prev_hash, 'f1' || hash, {', '.join(copied)} FROM audit_events WHERE seq = 4")
    forged = "0" * 32  # a call of its own: the index has a row for the call that began at seq 3 already
    db.execute("UPDATE audit_events SET record_id = ?, body = replace(body, record_id, ?) WHERE seq = 3",
               (forged, forged))
    db.commit()
    db.close()
    for command in (["verify"], ["list"], ["export"]):
        run = audit_cli(path, *command)
        assert "Traceback" not in run.stderr and "IntegrityError" not in run.stderr, run.stderr
    run = audit_cli(path, "verify")
    assert run.returncode == 1 and "event 3" in run.stdout + run.stderr, run.stdout + run.stderr


# 6. The store and the trail are the owner's alone: 0600, their WAL and SHM files too; a wider one is said.
def test_the_store_and_the_trail_are_made_for_their_owner_alone(scripted, tmp_path):
    import os
    import stat

    write_agent(tmp_path, STANDARD_AGENT)
    with serving(scripted, tmp_path, "--store", str(tmp_path / "store.sqlite3"), "--audit",
                 str(tmp_path / "audit.sqlite3")) as tk:
        scripted.script({"tool_calls": [call("lookup", {"word": "w"})]}, {"content": "done"})
        send(tk, "POST", "/v1/chat/completions", {"model": "m", "messages": user()})
        made = [path for path in tmp_path.iterdir() if path.name.startswith(("store.sqlite3", "audit.sqlite3"))]
        assert {p.name for p in made} >= {"store.sqlite3", "audit.sqlite3", "store.sqlite3-wal", "audit.sqlite3-wal"}
        assert all(stat.S_IMODE(os.stat(path).st_mode) == 0o600 for path in made), [
            (p.name, oct(os.stat(p).st_mode)) for p in made]
    os.chmod(tmp_path / "audit.sqlite3", 0o644)
    with serving(scripted, tmp_path, "--store", str(tmp_path / "store.sqlite3"), "--audit",
                 str(tmp_path / "audit.sqlite3"), "--log-level", "INFO") as tk:
        assert "audit.sqlite3 may be read by other users" in tk.process.stderr()


# 7. check: an enum of numbers that the description does not explain; a rule that can never match.
CHECKED = """
    upstream: http://127.0.0.1:9/v1
    tools:
      - name: release_version
        description: Publish a release of the product to a channel. Use it when asked to ship. Returns the log.
        parameters:
          version: {type: string, pattern: "^[0-9.]+$", description: "The version, like 1.4.2."}
          channel: {type: string, enum: [stable, beta], description: "stable for everyone, beta for testers."}
          level: {type: integer, enum: [1, 2, 3], description: "The level."}
        command: ["{python}", "-c", "print(1)", "{{version}}", "{{channel}}", "{{level}}"]
"""


def test_check_names_an_unexplained_number_enum_and_a_rule_that_can_never_match(tmp_path):
    write_agent(tmp_path, CHECKED)
    (tmp_path / "rules.yaml").write_text("rules:\n  - id: no-nightly\n    effect: deny\n    reason: No nightly.\n"
                                         "    when: {tool: release_version, arguments: {channel: {equals: nightly}}}\n")
    run = run_cli("check", str(tmp_path / "agent.yaml"), "--policy", str(tmp_path / "rules.yaml"), "--strict")
    assert run.returncode == 1, run.stdout
    assert "P003" in run.stdout and "parameters.level" in run.stdout
    assert "R003" in run.stdout and "no-nightly" in run.stdout
    (tmp_path / "agent.yaml").write_text((tmp_path / "agent.yaml").read_text().replace(
        '"The level."', '"1: a patch, 2: a minor release, 3: a major one."'))
    assert "parameters.level" not in run_cli("check", str(tmp_path / "agent.yaml")).stdout


# #28.4: /healthz says healthy or not; the declared tools are the admin API's.
def test_healthz_names_no_tool_and_the_admin_api_does(audited):
    with urllib.request.urlopen(audited.base_url[:-3] + "/healthz", timeout=10) as answer:
        assert json.loads(answer.read()) == {"status": "ok"}
    status, text = admin_get(audited, "/toolkeeper/tools")
    assert status == 200 and "lookup" in json.loads(text)["tools"]
    request = urllib.request.Request(audited.base_url[:-3] + "/toolkeeper/tools")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    refused.value.close()


def test_a_streamed_event_that_could_hide_a_call_is_never_relayed_as_it_came():
    """A first round's text events go to the agent as the server's bytes, unless another parser could read a
    call in them that toolkeeper did not: a key spelled with an escape, in another case, or given twice."""
    from toolkeeper.wire.apis.chat.model import TextShape, _Read
    from toolkeeper.wire.apis.chat.stream import StreamAssembler

    head = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,' \
           b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
    plain = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
    call = b'[{"index":0,"id":"x","function":{"name":"Bash","arguments":"{}"}}]'
    hidden = [
        b'data: {"id":"c","choices":[{"index":0,"delta":{"tool\\u005fcalls":' + call + b'},"delta":{"content":"hi"}}]}',
        b'data: {"id":"c","choices":[{"index":0,"Delta":{"Tool_Calls":' + call + b'},"delta":{"content":"hi"}}]}',
        b'data: {"Choices":[{"delta":{"tool_calls":' + call + b'}}],"choices":[{"index":0,"delta":{"content":"hi"}}]}',
    ]
    read = _Read(StreamAssembler(), TextShape())
    read.events([head, plain, *hidden])
    assert read.visible[-4:] == [{"content": "hi"}] * 4  # what toolkeeper read of each: text, and no call
    assert read.relay[-4] == plain + b"\n\n"  # the usual event goes as it came
    assert read.relay[-3:] == [None, None, None]  # the others as toolkeeper read them


def test_a_text_event_read_by_its_shape_is_exactly_one_of_the_shape_parsed():
    """Text events are read without parsing when they differ from one parsed (text only, relayable) in their
    text alone; anything else about them (a quote, a backslash, a control character, broken UTF-8, other bytes
    around) sends them to the parser, so no call and no malformed event passes that way."""
    from toolkeeper.wire.apis.chat.model import TextShape, _Read
    from toolkeeper.wire.apis.chat.stream import StreamAssembler

    def event(text: bytes) -> bytes:
        return b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + text + b'"},"finish_reason":null}]}'

    head = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
    shape, assembler = TextShape(), StreamAssembler()
    read = _Read(assembler, shape)
    read.events([head, event(b"Kiwis ")])
    assert shape.prefix is not None and shape.text_of(event(b"r\\u00f6st ")) is None
    assert shape.text_of(event("röst ".encode())) == "röst "
    smuggled = b'x"},"finish_reason":null},{"index":0,"delta":{"tool_calls":[{"index":0,"id":"z","function":' \
               b'{"name":"Bash","arguments":"{}"}}]}}]}'
    for odd in (b'a\\"b', b"tab\there", b"\xff\xfe", smuggled, b"new\nline"):
        assert shape.text_of(event(odd)) is None, odd  # parsed (or refused) as JSON
    assert shape.text_of(event(b"plain words").replace(b'"c"', b'"d"')) is None  # other bytes around

    later = _Read(assembler, shape)
    later.events([event(b"are birds."), event(b'say \\"hi\\"')])
    assert later.visible == [{"content": "are birds."}, {"content": 'say "hi"'}]
    assert later.relay == [event(b"are birds.") + b"\n\n", event(b'say \\"hi\\"') + b"\n\n"]
    with pytest.raises(Exception, match=r"tool calls in choices|not valid JSON|stream event"):
        _Read(assembler, shape).events([event(smuggled)])
    assert "".join(assembler.texts("content")) == "Kiwis are birds.say \"hi\""


def test_a_messages_text_delta_read_by_its_shape_is_one_of_the_shown_block_it_was_learnt_from():
    """A Messages text delta is read without parsing or routing when its bytes around the text are those of one
    parsed before, of a shown text block: the same block, the same structure. Deltas of a held (thinking) block
    teach nothing, another block's index does not fit, and a delta whose keys come twice is parsed every time
    (one with a key in another case is refused)."""
    import orjson

    from toolkeeper.wire.apis.messages.reader import MessagesReader
    from toolkeeper.wire.errors import MalformedResponse

    def sse(event: dict) -> bytes:
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event)

    def delta(index: int, kind: str, field: str, text: str) -> bytes:
        return sse({"type": "content_block_delta", "index": index, "delta": {"type": kind, field: text}})

    start = sse({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                       "model": "m", "content": [], "usage": {"input_tokens": 1}}})
    thinking = sse({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}})
    text = sse({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}})
    reader, round_key = MessagesReader(frozenset(), None), object()
    for data in (start, thinking, delta(0, "thinking_delta", "thinking", "Hmm")):
        reader.take(data, round_key)
    assert reader._shape.prefix is None  # a held block's delta teaches nothing
    shown = [event for data in (text, delta(1, "text_delta", "text", "Kiwis "), delta(1, "text_delta", "text", "are"))
             for event in reader.take(data, round_key)]
    assert reader._shape.prefix is not None and reader._shape.text_of(delta(1, "text_delta", "text", "x")) == "x"
    assert shown[-1]["_raw"] == delta(1, "text_delta", "text", "are")  # relayed as it came
    assert reader._shape.text_of(delta(0, "text_delta", "text", "x")) is None  # another block: parsed
    with pytest.raises(MalformedResponse, match="text_delta for block 0"):
        reader.take(delta(0, "text_delta", "text", "x"), round_key)
    escaped = delta(1, "text_delta", "text", ' "birds"')
    assert reader._shape.text_of(escaped) is None and reader.take(escaped, round_key)[0]["delta"]["text"] == ' "birds"'
    for data in (sse({"type": "content_block_stop", "index": 1}), sse({"type": "content_block_stop", "index": 0}),
                 sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
                 sse({"type": "message_stop"})):
        reader.take(data, round_key)
    found = reader.finish()
    assert found.message["content"] == 'Kiwis are "birds"'

    twice = b"event: content_block_delta\ndata: " + \
        b'{"type":"content_block_delta","index":0,"index":1,"delta":{"type":"text_delta","text":"hi"}}'
    again = MessagesReader(frozenset(), None)
    for data in (start, thinking, text, twice):
        again.take(data, round_key)
    assert again._shape.text_of(twice) is None  # parsed every time, never read by its shape (nor learnt from)
    other_case = b'{"type":"content_block_delta","index":1,"Delta":{},"delta":{"type":"text_delta","text":"hi"}}'
    with pytest.raises(MalformedResponse, match="lower case"):  # refused (tests/test_ambiguity.py)
        MessagesReader(frozenset(), None).take(b"event: content_block_delta\ndata: " + other_case, round_key)


def test_a_shape_that_could_not_be_learnt_from_a_new_block_stays_the_old_blocks():
    """A delta whose bytes cannot say where its text is (its text found elsewhere in them, or an escape) teaches
    nothing: the shape known before stays bound to its own block, so what toolkeeper records of a delta read by
    it is the block the bytes name to the agent."""
    import orjson

    from toolkeeper.wire.apis.messages.reader import MessagesReader

    def sse(event: dict) -> bytes:
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event)

    def text(index: int, piece: str) -> bytes:
        return sse({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}})

    reader, round_key = MessagesReader(frozenset(), None), object()
    for data in (sse({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
                                                            "model": "m", "content": []}}),
                 sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                 text(0, "Hello"), sse({"type": "content_block_start", "index": 1,
                                        "content_block": {"type": "text", "text": ""}}),
                 text(1, "a"), text(1, "line\nbreak")):  # neither can be learnt from
        reader.take(data, round_key)
    (event,) = reader.take(text(0, " PAYLOAD"), round_key)
    assert event["index"] == 0 and b'"index":0' in event["_raw"]
    for data in (sse({"type": "content_block_stop", "index": 0}), sse({"type": "content_block_stop", "index": 1}),
                 sse({"type": "message_stop"})):
        reader.take(data, round_key)
    blocks = reader.finish().message["_blocks"]
    assert [block["text"] for block in blocks] == ["Hello PAYLOAD", "aline\nbreak"]


def test_a_lone_carriage_return_ends_a_line_for_toolkeeper_as_for_the_agent():
    """SSE lines end in CR LF, LF or a lone CR. Read otherwise, a lone CR inside a data line would be JSON
    whitespace to toolkeeper and a line break to the agent's parser, which would read a tool_use block toolkeeper
    took for text. Such an event is malformed to both; a CR LF cut between two reads is still one line end."""
    from toolkeeper.wire.apis.messages.reader import MessagesReader
    from toolkeeper.wire.apis.relay import parse_event
    from toolkeeper.wire.errors import MalformedResponse
    from toolkeeper.wire.sse import EventSplitter

    smuggled = (b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":\r'
                b'{"type":"text","text":""},"x":\ndata: {"type":"tool_use","id":"toolu_1","name":"bash","input":{}}}'
                b"\n\n")
    (event,) = EventSplitter(1 << 20).feed(smuggled)
    reader = MessagesReader(frozenset(), None)
    reader.take(b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","content":[]}}', object())
    assert reader.take(event, object()) == []  # what the agent would read: its own call, held for the rules
    assert reader.blocks[0]["type"] == "tool_use" and reader.awaiting[0][0] == "toolu_1"

    splitter = EventSplitter(1 << 20)
    assert splitter.feed(b"data: 1\r") == [] and splitter.feed(b"\n\r\ndata: 2\r\r") == [b"data: 1", b"data: 2"]
    assert splitter.feed(b"data: 3\r") == [] and splitter.feed(b"\n") == [] and splitter.feed(b"\r") == [b"data: 3"]
    # the usual shape's quick read takes one data line only when it is the event's only other line
    with pytest.raises(MalformedResponse):
        parse_event(b'event: x\ndata:{"type":"text"}\ndata: {"type":"tool_use"}', object())
    raw = b'{"type":"content_block_delta","index":1,"_raw":1,"delta":{"type":"text_delta","text":"hi"}}'
    reader = MessagesReader(frozenset(), None)
    for data in (b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","content":[]}}',
                 b'event: content_block_start\ndata: {"type":"content_block_start","index":1,'
                 b'"content_block":{"type":"text","text":""}}', b"event: content_block_delta\ndata: " + raw):
        reader.take(data, object())
    # a key of toolkeeper's own in the bytes: never learnt from, never read by a shape
    assert reader._shape.text_of(b"event: content_block_delta\ndata: " + raw) is None



def test_check_says_a_rule_on_a_hosted_tools_arguments_withholds_it_whole(tmp_path):
    write_agent(tmp_path, CHECKED)
    (tmp_path / "rules.yaml").write_text("rules:\n  - id: no-vault-code\n    effect: deny\n    reason: No.\n"
                                         "    when: {source: hosted, tool: code_interpreter, arguments: "
                                         "{code: {matches: vault}}}\n")
    run = run_cli("check", str(tmp_path / "agent.yaml"), "--policy", str(tmp_path / "rules.yaml"))
    assert "R004" in run.stdout and "no-vault-code" in run.stdout and "withholds the tool whole" in run.stdout
    assert "make it `mode: shadow`" in run.stdout
    shadow = (tmp_path / "rules.yaml").read_text().replace("effect: deny", "mode: shadow\n    effect: deny")
    (tmp_path / "rules.yaml").write_text(shadow)  # a shadow rule withholds nothing: tried on the calls that ran
    run = run_cli("check", str(tmp_path / "agent.yaml"), "--policy", str(tmp_path / "rules.yaml"))
    assert "R004" not in run.stdout, run.stdout
