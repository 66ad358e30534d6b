"""The engine's own types: what a model round gives, what a turn yields, who is asking.

Adapters translate their API to and from these; nothing here knows HTTP or a
wire format. A `Round` holds the assistant message in Chat Completions form,
the neutral form the engine and the history work in.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    from toolkeeper.tracing import RequestTrace


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: Any  # the raw text as streamed, or an object (llama.cpp, a built-in call's action)
    extra: dict[str, Any] = field(default_factory=dict)  # other fields, kept verbatim
    kind: str = "function"  # the call's type as the model sent it: a built-in's item type (`shell_call`, ...)
    known: bool = True  # False: a type of call toolkeeper does not know, never passed on
    source: str = "agent"  # agent: the agent runs it; hosted: the model server does, once it is answered
    # toolkeeper's own answer when the rules allow the call and it is not the agent's to answer (an approval the
    # agent did not ask to give): the call then goes to the model in a hidden round, never to the agent
    answer_if_allowed: str | None = None

    @property
    def arguments_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(self.arguments).decode()

    def as_message_entry(self, index: int | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {}
        if index is not None:
            entry["index"] = index
        entry["id"] = self.id
        entry["type"] = "function"
        entry["function"] = {"name": self.name, "arguments": self.arguments_text}
        entry.update(self.extra)
        return entry


@dataclass
class Round:
    head: dict[str, Any]
    message: dict[str, Any]  # the assistant message as the model gave it, minus tool_calls
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: dict[str, Any] | None
    raw: bytes | None = None  # the whole upstream body, when it was not streamed
    normalized: bool = False  # toolkeeper changed something (made an id, re-encoded arguments)
    # The agent's own calls as the server streamed them (call id, native events), held back until the rules have
    # decided: the writer relays, at the turn's end, those of the last round that went through.
    held: list[tuple[str, list[Any]]] = field(default_factory=list)
    # Calls the model server ran itself within this answer (web search, code interpreter, server tools), for the
    # record: `tool.source: hosted`, `kind` the item or block type, `extra["output"]` what they gave.
    observed: list[ToolCall] = field(default_factory=list)

    def assistant_message(self, calls: list[ToolCall] | None = None) -> dict[str, Any]:
        """The message to put back into the history, with the given calls."""
        message = dict(self.message)
        message["role"] = "assistant"
        calls = self.tool_calls if calls is None else calls
        if calls:
            message["tool_calls"] = [call.as_message_entry() for call in calls]
            message.setdefault("content", None)
        return message


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__
class Visible:
    """Text the agent may read now (`content`, `reasoning_content`, ...).

    One delta per upstream event, so what the agent receives does not depend
    on how the network cut the stream; the deltas that arrived together are
    handed over together, so an adapter can send them in one write. `head`
    carries the id, created and model of the round (toolkeeper's own words:
    of the turn's first). `relay` is what an adapter that passes its server's
    own events on relays of this piece, as the server wrote it: stream events,
    or a whole round's output items (Chat Completions needs none). `last`: the
    model's stream ended with this piece, so a writer may send it with what
    the turn's next event brings (the answer's end: one send, not two).
    """

    deltas: tuple[dict[str, str], ...]
    head: dict[str, Any] | None = None
    relay: tuple[Any, ...] = ()
    last: bool = False


@dataclass(slots=True)
class Working:
    """A declared call is being decided or run; nothing else will come for a while. `head`: the turn's first
    round's, so that a writer can begin its answer before it waits."""

    tool: str
    head: dict[str, Any] | None = None


@dataclass
class TurnResult:
    head: dict[str, Any]  # id, created, model of the first round: one for the whole answer
    text: dict[str, str]  # every round's visible text, joined, per field
    tool_calls: list[ToolCall]  # the agent's own calls, for the agent to run
    finish_reason: str
    usage: dict[str, Any] | None  # summed over every round
    rounds: int
    last: Round
    exchange: list[dict[str, Any]]  # what the model saw, where the agent saw one message; [] if nothing hidden
    said: str = ""  # toolkeeper's own closing words, when it ended the turn (already among the visible text)

    @property
    def passthrough(self) -> bool:
        """Nothing happened in between: the upstream's own response can go back as it is."""
        return self.rounds == 1 and not self.exchange and not self.last.normalized and self.last.raw is not None

    def received(self) -> dict[str, Any]:
        """The assistant message the agent receives (and will send back in its history)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text.get("content") or None}
        if self.tool_calls:
            message["tool_calls"] = [call.as_message_entry() for call in self.tool_calls]
        return message


Event = Visible | Working | TurnResult


class Model(Protocol):
    def round(self, body: dict[str, Any], *, hidden: frozenset[str],
              previous: Round | None) -> AsyncIterator[Visible | Round]:
        """Stream one model response: Visible pieces as they come, then the Round.

        `body`: the request in neutral form; `hidden`: the tool names whose calls the agent never sees;
        `previous`: the round before this one in the same turn, whose calls were answered (None at first),
        for a server that keeps the conversation (the Responses API's `previous_response_id`).
        """
        ...


@dataclass
class TurnContext:
    """Who is asking: one agent request, as the protocol adapter saw it."""

    request_id: str = ""
    agent: str = ""  # a short hash of the credentials: for records and logs
    tenant: str = ""  # the full hash of the credentials: whose stored history this is
    request_body: bytes = b""  # the exact body: with the credentials, the request's key (request_key)
    agent_header: str | None = None  # the identity header the deployment sets, if it names one
    principal: dict[str, Any] | None = None  # who the call is for (identity.Principal.document()); None: the agent
    # The caller's own token (a JWT agent's, an /mcp access token), for an MCP server that exchanges it for one of
    # its own (RFC 8693); never in a repr, a log, a record or another server's request
    subject_token: str | None = field(default=None, repr=False, compare=False)
    api: str = "chat"  # which door the request came in by: chat | responses | messages | mcp | hook
    agent_revision: str = ""  # the agent file in force when the turn began (set by the engine)
    consent: Any = None  # a channel of the door's own (an MCP client's elicitation), asked instead of the configured
    workdir: str | None = None  # the agent's working directory, when its door says (a hook's cwd): paths resolve in it
    trace: RequestTrace | None = None  # the request's span, when tracing is on: its rounds' and calls' parent
    session: str = ""  # the session its calls are decided in, as its door names it (engine/flows.py); "": none
    # the secrets found in the agent's own tool results this request carries, by the id of the call each answers
    # (the wire's adapters find them; the call's record takes them when the result completes it: engine/secrets.py)
    result_secrets: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    session_calls: int = 0  # calls of this turn counted in the session: a door keeps a session that holds some
    _request_key: str | None = field(default=None, repr=False, compare=False)

    @property
    def request_key(self) -> str:
        """The credentials and the exact body, hashed: a retried request has the same. Worked out when a declared
        call first asks (most turns have none, and a long conversation's body is megabytes)."""
        if self._request_key is None:
            self._request_key = hashlib.sha256(self.tenant.encode() + b"\x00" + self.request_body).hexdigest() \
                if self.request_body else ""
        return self._request_key


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Sum two usage objects field by field, nested details included."""
    if not usage:
        return total
    if not total:
        return dict(usage)
    summed = dict(total)
    for key, value in usage.items():
        mine = summed.get(key)
        if isinstance(value, bool) or value is None:
            summed.setdefault(key, value)
        elif isinstance(value, (int, float)) and isinstance(mine, (int, float)) and not isinstance(mine, bool):
            summed[key] = mine + value
        elif isinstance(value, dict) and isinstance(mine, dict):
            summed[key] = add_usage(mine, value)
        elif mine is None:
            summed[key] = value
    return summed
