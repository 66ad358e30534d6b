"""The engine's `Model` for the Messages API: one upstream `/messages` request per round.

The neutral messages go back to Anthropic's (items.py); headers go upstream as
the agent sent them (`anthropic-version`, `anthropic-beta`, `x-api-key` or
`Authorization`; `api_key_env` replaces the key in `x-api-key`), and so does
the query (`?beta=true`).
"""

from __future__ import annotations

from typing import Any

from toolkeeper.engine import Round
from toolkeeper.wire.apis.messages.items import (
    BLOCKS,
    anthropic_from_messages,
    anthropic_tool,
    round_from_message,
    visible_blocks,
)
from toolkeeper.wire.apis.messages.reader import MessagesReader
from toolkeeper.wire.apis.relay import Relayed, RelayingModel
from toolkeeper.wire.errors import ANTHROPIC

ENGINE_KEYS = ("tools", "tool_choice")


class MessagesModel(RelayingModel):
    api = Relayed("/messages", "a message", "content", BLOCKS, MessagesReader, visible_blocks, ANTHROPIC,
                  key_header="x-api-key")

    def request(self, neutral: dict[str, Any], previous: Round | None) -> dict[str, Any]:
        out = {k: v for k, v in self.body.items() if k not in ENGINE_KEYS}
        if neutral.get("tools"):
            out["tools"] = [anthropic_tool(t) for t in neutral["tools"]]
        if "tool_choice" in self.body:
            choice = self.body["tool_choice"]
            if neutral.get("tool_choice") == "auto" and choice.get("type") != "auto":  # the forced call was made
                choice = {**{k: v for k, v in choice.items() if k != "name"}, "type": "auto"}
            out["tool_choice"] = choice
        out["messages"] = anthropic_from_messages(neutral["messages"])
        return out

    def round_of(self, answer: dict[str, Any], raw: bytes | None) -> Round:
        return round_from_message(answer, raw)
