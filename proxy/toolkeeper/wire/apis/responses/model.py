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
    APPROVAL,
    APPROVED,
    CALL_ITEM,
    ITEMS,
    answer_texts,
    flat_tool,
    input_from_messages,
    round_from_response,
    visible_items,
    wants_approval,
)
from toolkeeper.wire.apis.responses.reader import ResponsesReader
from toolkeeper.wire.errors import UpstreamFailed

# What the engine reads of a request; the rest of the agent's body goes upstream as it came.
ENGINE_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
CHAIN_KEYS = ("previous_response_id", "conversation")
NOT_AS_SENT = frozenset((*ENGINE_KEYS, *CHAIN_KEYS, "input"))  # the agent's keys the request() sets itself


class ResponsesModel(RelayingModel):
    api = Relayed("/responses", "a response", "output", ITEMS, ResponsesReader, visible_items)

    def __init__(self, *args: Any, mcp_servers: dict[str, dict[str, Any]] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.mcp_servers = mcp_servers or {}  # the agent's hosted MCP tools as it sent them, by server label

    def prepared(self, found: Round) -> Round:
        """A hosted MCP call the agent did not ask to approve is toolkeeper's to approve, when the rules allow it
        (every such call asks first: `forced_approvals`)."""
        for call in found.tool_calls:
            item = call.extra.get(CALL_ITEM) or {}
            if call.kind == APPROVAL and not wants_approval(self.mcp_servers.get(item.get("server_label"), {}),
                                                             str(item.get("name"))):
                call.answer_if_allowed = APPROVED
        return found

    @staticmethod
    def texts_of(answer: dict[str, Any]) -> tuple[Any, ...]:
        return (*answer_texts(answer.get("output")), answer.get("instructions"))

    def request(self, neutral: dict[str, Any], previous: Round | None) -> dict[str, Any]:
        body = self.body
        out = {k: v for k, v in body.items() if k not in NOT_AS_SENT}
        for key in ENGINE_KEYS:
            if key in neutral:
                out[key] = list(map(flat_tool, neutral[key])) if key == "tools" else neutral[key]
        messages = neutral["messages"]
        chain = "previous_response_id" if body.get("previous_response_id") else \
            "conversation" if body.get("conversation") else None
        if chain and previous is not None:  # the chain holds the rounds so far: only the new items go
            if chain == "previous_response_id":
                out["previous_response_id"] = previous.head.get("id")
            else:
                out["conversation"] = self.body["conversation"]
            out["input"] = input_from_messages(messages[_after_last_answer(messages):])
        else:
            for key in CHAIN_KEYS:
                if key in body:
                    out[key] = body[key]
            out["input"] = input_from_messages(messages)
        return out

    def round_of(self, answer: dict[str, Any], raw: bytes | None) -> Round:
        if answer.get("status") == "failed":
            raise UpstreamFailed(answer.get("error") or {}, answer)
        return round_from_response(answer, raw)


def _after_last_answer(messages: list[dict[str, Any]]) -> int:
    """Where the messages after the model's last answer begin: the results of the round before."""
    return next((i + 1 for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), 0)


def forced_approvals(tools: list[Any]) -> tuple[list[Any], dict[str, dict[str, Any]]]:
    """The tools as the model server gets them, every hosted MCP server asking before each call (so that the
    rules decide on it), and the agent's own MCP tools by server label (what it asked to approve itself)."""
    servers = {tool.get("server_label"): tool for tool in tools if isinstance(tool, dict) and tool.get("type") == "mcp"}
    forced = [{**tool, "require_approval": "always"} if isinstance(tool, dict) and tool.get("type") == "mcp" else tool
              for tool in tools]
    return forced, servers
