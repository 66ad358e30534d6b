"""A `Model` answered in-process by a function: the seam for testing the engine and its calls without HTTP, as
httpx's `MockTransport` is for a client.

    model = MockModel(lambda body, previous: answer("done") if previous else answer(calls=[("release", {...})]))
    async for event in engine.run({"messages": [...]}, model): ...

Each round's request is kept in `requests`, with the names the engine hid and the round it passed as `previous`.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from toolkeeper.engine.types import Round, ToolCall, Visible

Answer = Callable[[dict[str, Any], Round | None], Round | Iterable[Visible | Round]]


@dataclass
class MockRequest:
    body: dict[str, Any]
    hidden: frozenset[str]
    previous: Round | None


class MockModel:
    def __init__(self, answer: Answer):
        self.answer = answer
        self.requests: list[MockRequest] = []

    async def round(self, body: dict[str, Any], *, hidden: frozenset[str],
                    previous: Round | None) -> AsyncIterator[Visible | Round]:
        self.requests.append(MockRequest(copy.deepcopy(body), hidden, previous))
        answered = self.answer(body, previous)
        for event in [answered] if isinstance(answered, Round) else answered:
            yield event


def answer(text: str = "", *, calls: Iterable[tuple[str, Any]] = (), usage: dict[str, Any] | None = None,
           finish_reason: str | None = None, head: dict[str, Any] | None = None) -> list[Visible | Round]:
    """One model answer: its text (as one Visible), then the Round with its calls (name, arguments object)."""
    tool_calls = [ToolCall(f"call_{index}_{name}", name, orjson.dumps(arguments).decode())
                  for index, (name, arguments) in enumerate(calls)]
    head = head or {"id": "mock-1", "created": 1, "model": "mock"}
    found = Round(head, {"content": text or None}, tool_calls,
                  finish_reason or ("tool_calls" if tool_calls else "stop"), usage)
    return [*([Visible(({"content": text},), head)] if text else []), found]
