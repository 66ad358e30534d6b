"""One turn's discoverable tools: what can be searched, what was found, and the search budget.

The index and the answers' wording belong to the declaration
(`toolkeeper.tools`); this is the bookkeeping of one agent turn. A tool found
by `search_tools` joins the offer inside the search itself, so the very next
round already carries it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from toolkeeper.engine.types import ToolCall
from toolkeeper.tools import (
    SEARCH_BUDGET,
    SEARCH_SCHEMA,
    SEARCH_TOOL,
    DeclaredTool,
    ToolIndex,
    budget_answer,
    not_found_yet_answer,
    parse_arguments,
    search_answer,
)


class Discovery:
    def __init__(self, index: ToolIndex, active: dict[str, DeclaredTool], agent_tool_names: set[str | None],
                 messages: list[dict[str, Any]]):
        self.index = index
        self.active = active
        self.searchable = {name for name, tool in active.items() if tool.spec.visibility == "discoverable"}
        self.can_search = bool(self.searchable) and SEARCH_TOOL not in agent_tool_names
        # found in an earlier turn (the model called it), or no way to search: offered like an inline tool
        self.found = self.searchable & names_called(messages) if self.can_search else set(self.searchable)
        self.searches = 0

    @property
    def hidden_names(self) -> set[str]:
        """The names whose calls the agent never sees: every active declared tool, and the search tool."""
        return self.active.keys() | ({SEARCH_TOOL} if self.can_search else set())

    def offered(self) -> list[str]:
        return [name for name in self.active if name not in self.searchable or name in self.found]

    def schemas(self) -> list[dict[str, Any]]:
        return [SEARCH_SCHEMA] if self.can_search else []

    def answer(self, call: ToolCall, offered: list[str]) -> str | None:
        """The answer to a search, or to a call of a tool not found yet; None for a call to run."""
        if call.name == SEARCH_TOOL:
            return self._search(call, offered)
        if call.name in self.searchable and call.name not in self.found:
            return not_found_yet_answer(call.name, offered)
        return None

    def _search(self, call: ToolCall, offered: list[str]) -> str:
        arguments, problem = parse_arguments(call.arguments)
        query = (arguments or {}).get("query")
        if problem or not isinstance(query, str) or not query.strip():
            return (f"Error: {SEARCH_TOOL} needs one field, query: a few words saying what you want to do. "
                    f"You sent: {SEARCH_TOOL}({call.arguments_text})")
        self.searches += 1
        if self.searches > SEARCH_BUDGET:
            return budget_answer()
        found = self.index.search(query, among=self.searchable)
        self.found |= set(found)
        return search_answer(query, [self.active[name] for name in found], offered)


def names_called(messages: Iterable[Any]) -> set[str]:
    names = set()
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            for entry in message.get("tool_calls") or []:
                if isinstance(entry, dict) and isinstance(entry.get("function"), dict):
                    names.add(entry["function"].get("name"))
    return names
