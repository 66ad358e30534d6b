"""A Chat Completions response, streamed or whole, assembled into the engine's `Round`.

Real servers differ in how they stream tool calls, and this is where those
differences are absorbed: arguments split anywhere (inside an escape or a
multi-byte character), arguments sent as a JSON object (llama.cpp), missing,
empty or integer ids (vLLM, LM Studio), the name resent in every delta,
`finish_reason: stop` with tool calls (Ollama, gpt-4o), parallel calls all at
index 0 (Ollama), an empty-choices chunk first (Azure).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from typing import Any

import orjson

from toolkeeper.engine import Round, ToolCall
from toolkeeper.wire.ambiguity import plain_keys, refuse_odd_keys
from toolkeeper.wire.apis.base import of_json_type
from toolkeeper.wire.errors import MalformedResponse

# Delta fields the agent reads as they come (the answer's text and reasoning).
VISIBLE_FIELDS = ("content", "reasoning_content", "reasoning", "refusal")
HEAD_FIELDS = ("id", "created", "model", "system_fingerprint")
ID_ALPHABET = string.ascii_letters + string.digits
VALID_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _expect(value: Any, kinds: tuple[type, ...], where: str) -> Any:
    if value is not None and not of_json_type(value, kinds):
        names = " or ".join("an object" if k is dict else "a list" if k is list else f"a {k.__name__}" for k in kinds)
        raise MalformedResponse(f"{where} must be {names}, got {orjson.dumps(value).decode()[:80]}")
    return value


def check_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """Tool calls (or their deltas) as the engine can read them, or MalformedResponse."""
    for position, call in enumerate(_expect(calls, (list,), where) or []):
        at = f"{where}[{position}]"
        _expect(call, (dict,), at)
        if call is None:
            raise MalformedResponse(f"{at} must be an object, got null")
        refuse_odd_keys(call)
        refuse_odd_keys(call.get("function"))
        kind = call.get("type")
        if (kind is not None and kind != "function") or "custom" in call:
            # a custom tool's call ({type: custom, custom: {name, input}}) or a type to come: not read as a function
            # call with no name, which no rule could match
            raise MalformedResponse(f"{at} is a call of type {str(kind)[:40]!r}, which toolkeeper does not govern on "
                                    "Chat Completions (it governs function calls): send the tool as a function")
        _expect(call.get("id"), (str, int), f"{at}.id")
        _expect(call.get("index"), (int,), f"{at}.index")
        function = _expect(call.get("function"), (dict,), f"{at}.function") or {}
        _expect(function.get("name"), (str,), f"{at}.function.name")
        _expect(function.get("arguments"), (str, dict), f"{at}.function.arguments")
    return calls or []


def check_choice(body: dict[str, Any], inner: str) -> dict[str, Any]:
    """The first choice of a response or chunk, its `inner` part (message, delta) checked; usage checked."""
    plain = _plain_choice(body, inner)
    return plain if plain is not None else _checked_choice(body, inner)


def _plain_choice(body: dict[str, Any], inner: str) -> dict[str, Any] | None:
    """Most answers: one choice, with no call of any kind, every field of the type it should be: read without
    the field-by-field walk (None: walk it, and say what is wrong)."""
    choices, usage = body.get("choices"), body.get("usage")
    if type(choices) is not list or len(choices) != 1 or (usage is not None and type(usage) is not dict):
        return None
    choice = choices[0]
    if type(choice) is not dict:
        return None
    part, finish = choice.get(inner), choice.get("finish_reason")
    if type(part) is not dict or (finish is not None and type(finish) is not str):
        return None
    if part.get("tool_calls") is not None or part.get("function_call") is not None:
        return None
    # where a call could hide from toolkeeper under a key in another case (wire/ambiguity.py)
    return choice if plain_keys(body) and plain_keys(choice) and plain_keys(part) else None


def _checked_choice(body: dict[str, Any], inner: str) -> dict[str, Any]:
    refuse_odd_keys(body)
    _expect(body.get("usage"), (dict,), "usage")
    choices = _expect(body.get("choices"), (list,), "choices") or []
    if not choices:
        return {}
    choice = _expect(choices[0], (dict,), "choices[0]")
    if choice is None:
        raise MalformedResponse("choices[0] must be an object, got null")
    _expect(choice.get("finish_reason"), (str,), "choices[0].finish_reason")
    part = _expect(choice.get(inner), (dict,), f"choices[0].{inner}") or {}
    check_calls(part.get("tool_calls"), f"choices[0].{inner}.tool_calls")
    for position, other in enumerate(choices):
        other_part = other.get(inner) if isinstance(other, dict) else None
        refuse_odd_keys(other)
        refuse_odd_keys(other_part)
        if isinstance(other_part, dict) and other_part.get("function_call") is not None:
            # the legacy form: toolkeeper governs calls as tool_calls only, so this one cannot go on
            raise MalformedResponse(f"a legacy function_call in choices[{position}], which toolkeeper does not "
                                    "govern")
        if position and isinstance(other_part, dict) and other_part.get("tool_calls"):
            raise MalformedResponse(f"tool calls in choices[{position}]: toolkeeper governs the first choice only")
    return choice


def _text_only(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """Most chunks of a stream: one choice carrying one piece of text, nothing to check further."""
    choices = chunk.get("choices")
    if type(choices) is list and len(choices) == 1 and chunk.get("usage") is None:
        choice = choices[0]
        if type(choice) is dict and choice.get("finish_reason") is None:
            delta = choice.get("delta")
            if type(delta) is dict and len(delta) == 1 and type(delta.get("content")) is str:
                return choice
    return None


def made_call_id(seed: str, position: int, call: ToolCall) -> str:
    """9 alphanumerics, accepted by strict servers (Mistral) and OpenAI alike.

    Derived from the response's id and the call, so the same response always
    gets the same ids (a replay, a golden transcript), and different responses
    different ones.
    """
    digest = hashlib.sha256(f"{seed}\x00{position}\x00{call.name}\x00{call.arguments_text}".encode()).digest()
    number = int.from_bytes(digest[:12], "big")
    letters = []
    for _ in range(9):
        number, rest = divmod(number, len(ID_ALPHABET))
        letters.append(ID_ALPHABET[rest])
    return "".join(letters)


class _PartialCall:
    def __init__(self) -> None:
        self.id: Any = None
        self.name = ""
        self.text = ""
        self.obj: Any = None
        self.extra: dict[str, Any] = {}

    def complete(self) -> bool:
        if self.obj is not None:
            return True
        try:
            return isinstance(orjson.loads(self.text), dict)
        except orjson.JSONDecodeError:
            return False


class StreamAssembler:
    """Feed it chunks; it returns what the agent may see now and builds the round."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.message: dict[str, Any] = {}
        self._text: dict[str, list[str]] = {}  # string fields in pieces, joined once at the end
        self.calls: list[_PartialCall] = []
        self._by_index: dict[Any, _PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        choice = _text_only(chunk) or check_choice(chunk, "delta")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if not choice:
            return None
        if not self.head:
            self.head = {key: chunk[key] for key in HEAD_FIELDS if key in chunk}
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        text = delta.get("content")
        if len(delta) == 1 and isinstance(text, str):  # most events of a stream: one piece of text
            if not text:
                return None
            self._text.setdefault("content", []).append(text)
            return {"content": text}
        visible = {}
        for key, value in delta.items():
            if key == "tool_calls":
                for call_delta in value or []:
                    self._feed_call(call_delta)
            elif key == "role" or value is None:
                continue
            elif isinstance(value, str):
                self._text.setdefault(key, []).append(value)
                if key in VISIBLE_FIELDS and value:  # an empty opening delta tells the agent nothing
                    visible[key] = value
            else:
                self.message[key] = value
        return visible or None

    def texts(self, key: str) -> list[str]:
        """The pieces of a text field so far, to append to (a stream's usual chunk carries one piece of text)."""
        return self._text.setdefault(key, [])

    def _feed_call(self, delta: dict[str, Any]) -> None:
        index = delta.get("index", 0)
        call_id = delta.get("id")
        function = delta.get("function") or {}
        name = function.get("name")
        arguments = function.get("arguments")
        current = self._by_index.get(index)
        starts_new = current is None
        if current is not None and call_id and current.id and call_id != current.id:
            starts_new = True  # parallel calls sharing an index, told apart by id
        elif current is not None and name and not call_id and current.complete():
            # Ollama: a whole call per chunk, every one at index 0, no id
            opens_object = isinstance(arguments, str) and arguments.lstrip().startswith("{")
            starts_new = isinstance(arguments, dict) or opens_object
        if starts_new:
            current = _PartialCall()
            self.calls.append(current)
            self._by_index[index] = current
        if call_id and not current.id:
            current.id = call_id
        if name and not current.name:
            current.name = name  # a resent name is the same name, not more of it
        if isinstance(arguments, dict):
            current.obj = arguments
        elif isinstance(arguments, str):
            current.text += arguments
        for key, value in delta.items():
            if key not in ("index", "id", "type", "function"):
                current.extra[key] = value

    def finish(self) -> Round:
        for key, pieces in self._text.items():
            self.message[key] = "".join(pieces)
        calls = [ToolCall(c.id, c.name, c.obj if c.obj is not None else c.text, c.extra) for c in self.calls]
        _named(calls)
        normalized = any(c.obj is not None for c in self.calls)
        normalized |= _fix_ids(calls, self.head.get("id"))
        return Round(self.head, self.message, calls, self.finish_reason, self.usage, normalized=normalized)


def round_from_response(raw: bytes, body: dict[str, Any]) -> Round:
    """A whole (not streamed) response."""
    choice = check_choice(body, "message")
    message = dict(choice.get("message") or {})
    message.pop("role", None)
    calls: list[ToolCall] = []
    normalized = False
    for entry in message.pop("tool_calls", None) or ():
        function = entry.get("function") or {}
        arguments = function.get("arguments")
        normalized |= isinstance(arguments, dict)
        extra = {k: v for k, v in entry.items() if k not in ("index", "id", "type", "function")}
        calls.append(ToolCall(entry.get("id"), function.get("name") or "", arguments, extra))
    _named(calls)
    if calls:
        normalized |= _fix_ids(calls, body.get("id"))
        normalized |= choice.get("finish_reason") not in ("tool_calls", "length")
    head = {key: body[key] for key in HEAD_FIELDS if key in body}
    return Round(head, message, calls, choice.get("finish_reason"), body.get("usage"), raw=raw, normalized=normalized)


def _named(calls: list[ToolCall]) -> None:
    """A call without a name is none the rules could decide on: the answer is malformed, not passed on."""
    for position, call in enumerate(calls):
        if not call.name:
            raise MalformedResponse(f"tool call {position} has no function name")


def _fix_ids(calls: list[ToolCall], response_id: Any) -> bool:
    """Give every call a unique, valid id; True when one had to be made."""
    seed = response_id if isinstance(response_id, str) and response_id else secrets.token_hex(8)
    changed = False
    seen: set[str] = set()
    for position, call in enumerate(calls):
        if not isinstance(call.id, str) or not VALID_ID.match(call.id) or call.id in seen:
            call.id = made_call_id(seed, position, call)
            changed = True
        seen.add(call.id)
    return changed


