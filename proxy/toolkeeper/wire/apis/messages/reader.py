"""One upstream Messages stream, read event by event: what the agent may see, and the Round at the end.

The events of a declared call's `tool_use` block are dropped; a thinking
block's events wait until the next block shows whether it is hidden (thinking
travels with the block it precedes). The other block events are kept as the
server wrote them, for the writer to relay with its own `index`. The
message's own events (`message_start`, `message_delta`, `message_stop`,
`ping`) are read here, never relayed: the agent's message has its own, once.
Blocks are assembled from their deltas, as the API has no event that carries
a finished block.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from toolkeeper.engine import Round
from toolkeeper.tools import ambiguous_keys
from toolkeeper.wire.apis.messages.items import THINKING, check_block, round_from_message
from toolkeeper.wire.apis.relay import HoldingReader, event_object, parse_event, round_head
from toolkeeper.wire.apis.runs import RAW, ROUND, Build, Run
from toolkeeper.wire.errors import MalformedResponse, UpstreamFailed
from toolkeeper.wire.sse import TextShape

# The blocks each delta may extend (a delta of another type is kept as it came).
DELTA_BLOCKS = {"text_delta": ("text",), "citations_delta": ("text",), "thinking_delta": ("thinking",),
                "signature_delta": ("thinking",), "input_json_delta": ("tool_use", "server_tool_use", "mcp_tool_use")}
DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature",
                "citations_delta": "citation"}


# The message's own events that are always the same bytes, and what reading them does (message_stop: the stream
# is complete); others are parsed. Never relayed (own_events).
CONSTANT = {b'event: ping\ndata: {"type":"ping"}': False, b'event: ping\ndata: {"type": "ping"}': False,
            b'event: message_stop\ndata: {"type":"message_stop"}': True,
            b'event: message_stop\ndata: {"type": "message_stop"}': True}
CONSTANT_SIZE = max(map(len, CONSTANT))
# a text block's delta as Anthropic writes it, up to its text
TEXT_DELTA = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
              b'"delta":{"type":"text_delta","text":"')


class MessagesReader(HoldingReader):
    own_events = frozenset({"message_start", "message_delta", "message_stop", "ping"})
    text_kind = "content_block_delta"

    def __init__(self, hidden: frozenset[str], previous: Round | None):
        super().__init__(hidden, previous)
        self.stop: dict[str, Any] = {}  # message_delta's delta (stop_reason, stop_sequence)
        self.usage: dict[str, Any] = {}
        self.stopped = False
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}  # tool_use input, in pieces
        # a block's text (or thinking, or signature) in pieces, joined once: adding each delta to the string so
        # far would copy a long answer once per delta
        self._pieces: dict[tuple[int, str], list[str]] = {}
        self._shape = TextShape()  # the text deltas of one shown block, once one of them was parsed
        self._shape_index = -1
        self._build: Build = partial(_text_delta, -1)
        # the bytes of the block events that come next in most streams (a text block's start, a block's stop),
        # and what parsing them gives: such an event is read without a parse
        self._expected: dict[bytes, Callable[[bytes, object], dict[str, Any]]] = {}

    def take_all(self, events: list[bytes], round_key: object) -> list[Any]:
        """Most events of a stream are a piece of a shown text block's text: one with the bytes around its text
        of such a delta parsed before (the block's index among them) is that delta, with no parse and no routing
        (its block is shown, and stays so: a block is what its start said, once). Events that may go on as they
        came, in a row, go on as one `Run`."""
        relay: list[Any] = []
        self._shown, shape, own = relay, self._shape, self.own_events  # what `read` shows goes in
        run: Run | None = None
        bound: Run | None = None  # the run the appends below are bound to
        for data in events:
            text = shape.text_of(data)
            if text is not None:
                if run is None:
                    run = Run(0, round_key)
                    relay.append(run)
                if run is not bound:
                    bound, run.build, index = run, self._build, self._shape_index
                    add_data, add_event, add_text = run.data.append, run.events.append, run.texts.append
                    # the block's text in pieces, begun as `_apply` begins it
                    add_piece = self._pieces.setdefault((index, "text"), [self.blocks[index].get("text", "")]).append
                    if index not in run.indexes:
                        run.indexes.append(index)
                add_data(data)
                add_event(text)
                add_text(text)
                add_piece(text)
                continue
            bound = None
            if len(data) <= CONSTANT_SIZE and data in CONSTANT:
                run = None
                self.stopped = self.stopped or CONSTANT[data]  # a ping, or the end: what parsing them reads
                continue
            expected = self._expected.pop(data, None)
            event = parse_event(data, round_key, own) if expected is None else expected(data, round_key)
            before = len(relay)
            self.read(event)
            kind = event["type"]
            learns = kind == "content_block_delta" and len(relay) == before + 1 and relay[before] is event \
                and _plain_text_delta(data, event)
            run = self.ran(run, relay, before, event)
            if (kind == "content_block_start" or kind == "message_start") and self._expect(event):
                run = None  # one shape a run
            elif learns and run is not None and shape.learn(data, event["delta"]["text"]):
                # only with the bytes it was learnt from: they name this block
                self._shape_index = index = event["index"]
                self._build = partial(_text_delta, index)
                run = None  # one shape a run
        return relay

    def _expect(self, event: dict[str, Any]) -> bool:
        """After a message's or a block's start: the next text block's start, and this block's stop; a text block's
        deltas in Anthropic's bytes (`TEXT_DELTA`), whose structure with any plain text is a text delta of this
        block: read by their shape from the first (a text block is shown, and stays so). True: that shape is
        the reader's now."""
        index = event.get("index")
        block = self.blocks.get(index) if type(index) is int else None
        text = block is not None and block.get("type") == "text"
        if text:
            self._shape.known(TEXT_DELTA % index, b'"}}')
            self._shape_index = index
            self._build = partial(_text_delta, index)
        if type(index) is int:
            self._expected[b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}' % index] = \
                partial(_stop, index)
        after = index + 1 if type(index) is int else 0
        self._expected[b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,'
                       b'"content_block":{"type":"text","text":""}}' % after] = partial(_text_start, after)
        return text

    def text_of(self, event: dict[str, Any]) -> str | None:
        delta = event.get("delta") if event["type"] == "content_block_delta" else None
        text = delta.get("text") if isinstance(delta, dict) and delta.get("type") == "text_delta" else None
        return text if isinstance(text, str) else None

    def read(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.started = event_object(event, "message")
            self.usage = dict(self.started.get("usage") or {})
            return
        if kind == "message_delta":
            self.stop.update(event.get("delta") or {})
            self.usage.update(event.get("usage") or {})
            return
        if kind == "message_stop":
            self.stopped = True
            return
        if kind == "ping":
            return
        if kind == "error":
            raise UpstreamFailed(event.get("error") if isinstance(event.get("error"), dict) else {})
        index = event.get("index")
        if not isinstance(index, int) or kind not in ("content_block_start", "content_block_delta",
                                                      "content_block_stop"):
            raise MalformedResponse(f"an unexpected stream event: {str(kind)[:40]}")
        self._block_event(kind, index, event)

    def _block_event(self, kind: str, index: int, event: dict[str, Any]) -> None:
        """A block is what its start says, once: a block started twice, or an event for one never started, is a
        malformed answer, so no call reaches the agent under another block's name."""
        if (kind == "content_block_start") == (index in self.blocks):
            raise MalformedResponse(f"block {index} was started twice" if index in self.blocks
                                    else f"a {kind} for block {index}, which never started")
        if kind == "content_block_start":
            block = dict(event_object(event, "content_block"))
            check_block(block)
            self.blocks[index] = block
            call = block.get("type") == "tool_use"
            self.starts(index, holds=block.get("type") in THINKING, hidden=call and block.get("name") in self.hidden,
                        own_call=str(block.get("id") or "") if call else None)
        elif kind == "content_block_delta":
            self._apply(index, event_object(event, "delta"))
        else:
            self._finished(index)
        self.route(index, event)

    def _apply(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks[index]
        kind = delta.get("type")
        if block.get("type") not in DELTA_BLOCKS.get(kind or "", (block.get("type"),)):
            raise MalformedResponse(f"a {str(kind)[:40]} for block {index}, a {str(block.get('type'))[:40]}")
        if kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
            return
        field = DELTA_FIELDS.get(kind or "")
        if field == "citation":
            block.setdefault("citations", []).append(delta.get("citation"))
        elif field:
            pieces = self._pieces.get((index, field))
            if pieces is None:
                pieces = self._pieces[index, field] = [block.get(field, "")]
            pieces.append(str(delta.get(field, "")))

    def _joined(self) -> None:
        for (index, field), pieces in self._pieces.items():
            self.blocks[index][field] = "".join(pieces)
        self._pieces.clear()

    def _finished(self, index: int) -> None:
        pieces = self._json.pop(index, None)
        if pieces is not None and index in self.blocks:
            text = "".join(pieces) or "{}"
            try:
                self.blocks[index]["input"] = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise MalformedResponse(f"a tool_use input that is not JSON ({exc})") from exc
            ambiguous = ambiguous_keys(text)  # relayed as these pieces: the agent reads the text, not toolkeeper's
            if ambiguous is not None:
                raise MalformedResponse(f"a tool_use input that parsers read differently ({ambiguous})")

    def finish(self) -> Round:
        if self.started is None or not self.stopped:
            raise MalformedResponse("the stream ended before message_stop")
        self._joined()
        message = {**self.started, **self.stop, "usage": self.usage,
                   "content": [self.blocks[i] for i in sorted(self.blocks)]}
        found = round_from_message(message)
        found.head = round_head(found.head, self.started, self.previous)
        return self.settled(found)


def _text_start(index: int, data: bytes, round_key: object) -> dict[str, Any]:
    """A text block's start, of the bytes `_expect` says: what `parse_event` reads of them."""
    return {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""},
            RAW: (data, len(b"event: content_block_start\ndata: ")), ROUND: round_key}


def _stop(index: int, data: bytes, round_key: object) -> dict[str, Any]:
    """A block's stop, of the bytes `_expect` says: what `parse_event` reads of them."""
    return {"type": "content_block_stop", "index": index, RAW: (data, len(b"event: content_block_stop\ndata: ")),
            ROUND: round_key}


def _text_delta(index: int, text: str, number: int, pad: str | None) -> dict[str, Any]:
    """A text delta read by its shape, as the block's delta it is."""
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


def _plain_text_delta(data: bytes, event: dict[str, Any]) -> bool:
    """A text delta and nothing else, each key once in its bytes (in any case: a parser that keeps a key's first
    copy, or matches keys in any case, reads it as toolkeeper does), and with text to learn the shape from."""
    delta = event.get("delta")
    if len(event) != 5 or type(delta) is not dict or len(delta) != 2 or delta.get("type") != "text_delta":
        return False
    text = delta.get("text")
    if type(text) is not str or not text:
        return False
    folded = data.lower()
    return (folded.count(b'"type"') == 2 and folded.count(b'"index"') == 1 and folded.count(b'"delta"') == 1
            and folded.count(b'"text"') == 1 and b'"_' not in folded)  # no key of toolkeeper's own (RAW, ROUND)
