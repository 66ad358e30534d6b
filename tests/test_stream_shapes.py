"""The Responses and Messages readers' quick paths (issue 43): what they read without parsing is exactly what a parse
would read, and every other shape goes to the parser, where it is re-encoded or refused as before.

Deterministic, in process: the readers and writers are fed bytes, no server runs.
"""

from __future__ import annotations

import orjson
import pytest

from toolkeeper.engine import TurnResult
from toolkeeper.wire.ambiguity import check_keys
from toolkeeper.wire.apis.messages.reader import MessagesReader, _stop, _text_start
from toolkeeper.wire.apis.relay import parse_event
from toolkeeper.wire.apis.responses import shapes
from toolkeeper.wire.apis.responses.reader import ResponsesReader, _in_progress
from toolkeeper.wire.apis.responses.writer import ResponsesWriter
from toolkeeper.wire.apis.runs import RAW, Run
from toolkeeper.wire.errors import MalformedResponse
from toolkeeper.wire.sse import NumberedShape

ITEM = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
WHERE = {"item_id": "msg_1", "output_index": 0, "content_index": 0}


@pytest.fixture(autouse=True)
def no_templates(monkeypatch):
    """The reader as it is before the process learnt any event template (tests/test_event_templates.py has them)."""
    monkeypatch.setattr(shapes, "TEMPLATES", {})
    monkeypatch.setattr(shapes, "_FAILED", {})


def sse(event: dict, raw: bytes | None = None) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + (raw if raw is not None else orjson.dumps(event))


def opening(number: int = 0) -> list[bytes]:
    """A Responses stream up to its message's first text delta (numbered from `number`)."""
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "m", "output": []}
    events = [{"type": "response.created", "response": response}, {"type": "response.in_progress", "response": response},
              {"type": "response.output_item.added", "output_index": 0, "item": ITEM},
              {"type": "response.content_part.added", **WHERE, "part": {"type": "output_text", "text": ""}}]
    return [sse({**event, "sequence_number": number + n}) for n, event in enumerate(events)]


def delta(text: str, number: int, openai: bool = False, pad: str = "Xy9") -> bytes:
    """A text delta, as the scripted server orders its keys, or as OpenAI does (its number first, a padding)."""
    if openai:
        return sse({"type": "response.output_text.delta", "sequence_number": number, **WHERE, "delta": text,
                    "logprobs": [], "obfuscation": pad})
    return sse({"type": "response.output_text.delta", **WHERE, "delta": text, "logprobs": [], "sequence_number": number})


def taught(openai: bool = False) -> tuple[ResponsesReader, object]:
    """A reader that parsed the opening and one delta, and learnt the deltas' shape from it."""
    reader, round_key = ResponsesReader(frozenset(), None), object()
    reader.take_all([*opening(), delta("Kiwis ", 4, openai)], round_key)
    assert reader._shape.head is not None
    return reader, round_key


@pytest.mark.parametrize("openai", [False, True], ids=["scripted", "openai"])
def test_a_numbered_delta_is_read_by_its_shape_with_its_text_number_and_padding(openai):
    reader, round_key = taught(openai)
    relay = reader.take_all([delta("are ", 5, openai), delta("birds.", 6, openai, pad="a")], round_key)
    (run,) = relay
    assert type(run) is Run and run.texts == ["are ", "birds."] and run.number == 5 and run.indexes == [0]
    assert run.events == ["are ", "birds."]  # read by the shape: no parse
    for data, event in zip(run.data, run.expanded(), strict=True):  # what a parse reads of each, and nothing else
        parsed = parse_event(data, round_key)
        assert event.pop(RAW) == data and parsed.pop(RAW)[0] == data and event == parsed


def smuggled(openai: bool) -> list[bytes]:
    """Each bytes but one thing like the next delta of the learnt shape, number 5."""
    good = delta("are ", 5, openai)
    call = '","item":{"type":"function_call","call_id":"c","name":"shell","arguments":"{}"},"x":"'
    return [
        good.replace(b'"type"', b'"t\\u0079pe"', 1),  # an escape in a key (that spells what it replaces)
        good.replace(b'"type"', b'"\\u0054ype"', 1),  # an escape in a key, spelling another case
        good.replace(b'"delta"', b'"Delta"'),  # a key in another case
        good.replace(b'"delta":"are "', b'"delta":"are ","delta":"shell"'),  # a key twice
        good.replace(b"are ", b"a\\n\\ndata: {}"),  # two events in one (an escape)
        good.replace(b"are ", b"a\n\ndata: {}"),  # a control character
        good.replace(b"are ", call.encode()),  # a call hidden in the text's bytes
        good.replace(b"are ", b"a\\\"b"),  # a quote
        good.replace(b"are ", b"\xff\xfe"),  # not UTF-8
        good.replace(b'"output_index":0', b'"output_index":1'),  # another item
        good.replace(b'"msg_1"', b'"msg_2"'),  # another item's id
        delta("are ", 6, openai),  # not the next number
        delta("are ", 4, openai),
    ] + ([delta("are ", 5, True, pad='a"b'), delta("are ", 5, True, pad="é"),  # a padding not plain ASCII
          delta("are ", 5, True).replace(b'"obfuscation"', b'"Obfuscation"')] if openai else [])


@pytest.mark.parametrize("openai", [False, True], ids=["scripted", "openai"])
def test_every_other_shape_of_a_numbered_delta_goes_to_the_parser(openai):
    reader, _ = taught(openai)
    for data in smuggled(openai):
        assert reader._shape.read(data, 5) is None, data


@pytest.mark.parametrize("openai", [False, True], ids=["scripted", "openai"])
def test_a_smuggled_delta_is_parsed_and_refused_or_relayed_as_toolkeeper_read_it(openai):
    """Each goes through the parse and its checks, as every event did before: refused (a key in another case,
    spelled with an escape or not; an item never announced), re-encoded (a key twice), or relayed as what the
    parse read (an escaped text is text)."""
    outcomes = []
    for data in smuggled(openai):
        reader, round_key = taught(openai)
        try:
            (entry,) = reader.take_all([data], round_key)
        except MalformedResponse as refused:
            outcomes.append(str(refused)[:20])
            continue
        if type(entry) is Run:  # relayable as it came: a parsed event, never one read by the shape
            assert all(type(event) is dict for event in entry.events), data
            outcomes.append("as it came")
        else:
            assert entry[RAW] is None, data
            outcomes.append("re-encoded")
    came, refused, malformed = "as it came", "a key '", "malformed JSON in a "
    assert [outcome[:len(refused)] if outcome.startswith(refused) else outcome for outcome in outcomes] == [
        came, refused, refused, "re-encoded", came, malformed, came, came, malformed, "a response.output_te", came,
        came, came, *([came, came, refused] if openai else [])]


def test_a_delta_whose_bytes_cannot_say_where_its_text_is_teaches_nothing():
    reader, round_key = ResponsesReader(frozenset(), None), object()
    reader.take_all([*opening(), delta("0", 4)], round_key)  # "0" is in its bytes more than once
    assert reader._shape.head is None
    reader.take_all([delta('say "hi"', 5)], round_key)  # an escape
    assert reader._shape.head is None
    reader.take_all([delta("Kiwis", 6)], round_key)
    assert reader._shape.head is not None and reader._shape.read(delta("x", 7), 7) == "x"


def test_a_shape_is_learnt_only_from_a_shown_message_delta_relayable_as_it_came():
    shape = NumberedShape()
    data = delta("Kiwis ", 4)
    event = orjson.loads(data[data.index(b"{"):])
    assert not shape.learn(data.replace(b"Kiwis ", b"Ki\\u0077is "), "Kiwis ", 4, None, event)  # an escape
    assert not shape.learn(data, "Kiwis ", 5, None, event)  # its number is not where it says
    assert shape.learn(data, "Kiwis ", 4, None, event) and shape.read(delta("x", 5), 5) == "x"

    twice = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_1",' \
            b'"output_index":0,"content_index":0,"delta":"Kiwis ","delta":"Kiwis ","sequence_number":4}'
    reader = ResponsesReader(frozenset(), None)
    relay = reader.take_all([*opening(), twice], object())
    assert reader._shape.head is None and relay[-1][RAW] is None  # a key twice: re-encoded, never learnt from


def test_a_reasoning_items_deltas_teach_nothing():
    reader, round_key = ResponsesReader(frozenset(), None), object()
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    events = [*opening()[:2], sse({"type": "response.output_item.added", "output_index": 0, "item": reasoning,
                                   "sequence_number": 2}),
              sse({"type": "response.output_text.delta", "item_id": "rs_1", "output_index": 0, "content_index": 0,
                   "delta": "Thinking", "sequence_number": 3})]
    assert reader.take_all(events, round_key) == []  # held until the item after it
    assert reader._shape.head is None


def test_the_in_progress_that_repeats_created_is_read_as_parsing_it_would():
    created, in_progress = opening()[:2]
    assert _in_progress(created, 0) == in_progress
    assert _in_progress(created, 1) == b""  # created's number is 0
    assert _in_progress(created.replace(b"resp_1", b"response.created"), 0) == b""  # named a third time
    reader, round_key = ResponsesReader(frozenset(), None), object()
    other = in_progress.replace(b'"model":"m"', b'"model":"n"')
    reader.take_all([created, other], round_key)  # not the bytes expected: parsed
    assert reader._number == 1 and reader.started["model"] == "m"
    item = sse({"type": "response.output_item.added", "output_index": 0, "item": ITEM, "sequence_number": 1},
               ).replace(b"event: response.output_item.added", b"event: response.in_progress")
    reader = ResponsesReader(frozenset(), None)
    reader.take_all([created, item], object())  # what its data says, whatever its event line says: parsed
    assert 0 in reader._announced


def test_a_run_is_renumbered_event_by_event_when_the_agents_numbers_differ():
    """A second round's events (or any after something withheld) are numbered anew: each is written as the
    per-event path writes it, the same bytes whichever way the reader grouped them."""

    async def keep(result: TurnResult, final: dict | None) -> None:
        pass

    reader, round_key = taught()
    run = reader.take_all([delta("are ", 5), delta("birds.", 6)], round_key)[0]
    writer = ResponsesWriter(None, {}, 5.0, keep)
    writer.indexes[(object(), 0)] = 0  # an item of a round before: this round's item 0 is the agent's 1
    writer.sequence = 9
    written = writer.relayed(run)
    assert [orjson.loads(line[6:]) for line in written.split(b"\n") if line.startswith(b"data: ")] == [
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "delta": text, "logprobs": [], "sequence_number": number} for text, number in (("are ", 9), ("birds.", 10))]
    writer = ResponsesWriter(None, {}, 5.0, keep)
    writer.sequence = 7  # in step with the server: its bytes as they came
    assert writer.relayed(reader.take_all([delta("so", 7)], round_key)[0]) == delta("so", 7) + b"\n\n"


def test_the_messages_block_events_read_without_a_parse_are_what_a_parse_reads():
    for index in (0, 1, 9, 10, 123):
        start = b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,' \
                b'"content_block":{"type":"text","text":""}}' % index
        stop = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}' % index
        assert _text_start(index, start, "r") == parse_event(start, "r")
        assert _stop(index, stop, "r") == parse_event(stop, "r")


def messages_opening() -> list[bytes]:
    return [sse({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                       "model": "c", "content": [], "usage": {"input_tokens": 1}}}),
            sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})]


def text_delta(index: int, text: str) -> bytes:
    return sse({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})


def test_a_text_blocks_deltas_in_anthropics_bytes_are_read_by_their_shape_from_the_first():
    reader, round_key = MessagesReader(frozenset(), None), object()
    relay = reader.take_all([*messages_opening(), text_delta(0, "Kiwis "), text_delta(0, "are")], round_key)
    assert reader._shape.text_of(text_delta(0, "x")) == "x"
    run = relay[-1]
    assert type(run) is Run and run.texts == ["Kiwis ", "are"] and run.events == ["Kiwis ", "are"]  # no parse
    good = text_delta(0, "birds")
    call = '"}},"content_block":{"type":"tool_use","id":"t","name":"bash","input":{}},"x":{"y":"'
    for data in (good.replace(b'"type"', b'"t\\u0079pe"', 1), good.replace(b'"delta"', b'"Delta"'),
                 good.replace(b'"index":0', b'"index":0,"index":1'), good.replace(b"birds", call.encode()),
                 good.replace(b"birds", b"a\nb"), good.replace(b"birds", b"a\\\"b"), text_delta(1, "birds"),
                 good.replace(b"birds", b"\xff")):
        assert reader._shape.text_of(data) is None, data
    with pytest.raises(MalformedResponse, match="lower case"):
        reader.take_all([good.replace(b'"delta"', b'"Delta"')], round_key)


def test_a_thinking_blocks_deltas_are_never_read_by_the_text_shape():
    reader, round_key = MessagesReader(frozenset(), None), object()
    thinking = sse({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}})
    reader.take_all([messages_opening()[0], thinking], round_key)
    assert reader._shape.prefix is None and reader._shape.text_of(text_delta(0, "Hmm")) is None
    with pytest.raises(MalformedResponse, match="text_delta for block 0"):  # parsed: not a thinking block's delta
        reader.take_all([text_delta(0, "Hmm")], round_key)


def test_a_key_in_another_case_beside_a_text_is_still_refused():
    """Upper case that is the answer's text does not make its bytes walked; upper case anywhere else does, and a
    text given that is no plain string (a quote in it) takes nothing out of the bytes."""
    answer = {"id": "r", "output": [{"type": "message", "content": [{"type": "output_text", "text": "The End"}]}]}
    raw = orjson.dumps(answer)
    check_keys(raw, answer, texts=("The End",))  # its only upper case: its text
    odd = raw.replace(b'"id"', b'"Id"', 1)
    with pytest.raises(MalformedResponse, match="'Id'"):
        check_keys(odd, orjson.loads(odd), texts=("The End",))
    sneaky = b'{"output":[{"type":"message","content":[{"type":"output_text","text":"a\\",\\"Type\\":\\"x"}]}],' \
             b'"extra":{"text":"a","Type":"x"}}'
    with pytest.raises(MalformedResponse, match="'Type'"):
        check_keys(sneaky, orjson.loads(sneaky), texts=('a","Type":"x',))
    plain = b'{"extra":{"text":"a","Type":"x"}}'
    with pytest.raises(MalformedResponse, match="'Type'"):
        check_keys(plain, orjson.loads(plain), texts=("a", "x"))  # values taken out, the key stays
