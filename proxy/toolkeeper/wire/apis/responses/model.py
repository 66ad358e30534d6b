"""The engine's `Model` for the Responses API: one upstream `/responses` request per round.

The neutral messages go back to `input` items (items.py). When the agent
chains its requests (`previous_response_id`, `conversation`), each hidden
round goes upstream chained to the one before, so the server's stored chain
holds them all: a round after the first sends only what the chain lacks (the
results of the round before) and names that round's response.
"""

from __future__ import annotations

from typing import Any

from toolkeeper.engine import Round
from toolkeeper.wire.apis.relay import Relayed, RelayingModel
from toolkeeper.wire.apis.responses.items import (
    ITEMS,
    flat_tool,
    input_from_messages,
    round_from_response,
    visible_items,
)
from toolkeeper.wire.apis.responses.reader import ResponsesReader
from toolkeeper.wire.errors import UpstreamFailed

# What the engine reads of a request; the rest of the agent's body goes upstream as it came.
ENGINE_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
CHAIN_KEYS = ("previous_response_id", "conversation")


class ResponsesModel(RelayingModel):
    api = Relayed("/responses", "a response", "output", ITEMS, ResponsesReader, visible_items)

    def request(self, neutral: dict[str, Any], previous: Round | None) -> dict[str, Any]:
        out = {k: v for k, v in self.body.items() if k not in (*ENGINE_KEYS, *CHAIN_KEYS, "input")}
        for key in ENGINE_KEYS:
            if key in neutral:
                out[key] = [flat_tool(t) for t in neutral[key]] if key == "tools" else neutral[key]
        messages = neutral["messages"]
        chain = next((key for key in CHAIN_KEYS if self.body.get(key)), None)
        if chain and previous is not None:  # the chain holds the rounds so far: only the new items go
            if chain == "previous_response_id":
                out["previous_response_id"] = previous.head.get("id")
            else:
                out["conversation"] = self.body["conversation"]
            out["input"] = input_from_messages(messages[_after_last_answer(messages):])
        else:
            out.update({key: self.body[key] for key in CHAIN_KEYS if key in self.body})
            out["input"] = input_from_messages(messages)
        return out

    def round_of(self, answer: dict[str, Any], raw: bytes | None) -> Round:
        if answer.get("status") == "failed":
            raise UpstreamFailed(answer.get("error") or {}, answer)
        return round_from_response(answer, raw)


def _after_last_answer(messages: list[dict[str, Any]]) -> int:
    """Where the messages after the model's last answer begin: the results of the round before."""
    return next((i + 1 for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), 0)
