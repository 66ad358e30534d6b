"""Discoverable tools and `search_tools`, the meta-tool that finds them.

A tool with `visibility: discoverable` is not sent with every request: the
model finds it by calling `search_tools(query)`, which scores the declared
tools on names, descriptions and keywords and makes the matches callable from
the next round on. Searches are capped at 3 a turn (a model that does not find
what it imagined searches again with a synonym, and again...), and a call to a
tool not yet found is answered with the search that would find it.

The index is derived from the declarations, like every other list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from toolkeeper.tools.agentfile import DeclaredTool

SEARCH_TOOL = "search_tools"
SEARCH_BUDGET = 3
MAX_MATCHES = 5
WORD = re.compile(r"[a-z0-9]+")
STOP_WORDS = frozenset({
    "a", "an", "and", "the", "of", "to", "for", "in", "on", "with", "it", "is", "be", "this", "that", "or",
    "use", "when", "what", "returns",
})

SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": SEARCH_TOOL,
        "description": (
            "Find more tools by what they do. Use it when none of your tools fits the request. Returns the "
            "matching tools' names and descriptions; you can call them right after. Give each parameter as its "
            "own field."
        ),
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What you want to do, in a few words. Required."}}},
    },
}


def _words(text: str) -> set[str]:
    return {word for word in WORD.findall(text.lower()) if word not in STOP_WORDS}


def _stem(word: str) -> str:
    for suffix in ("ing", "es", "ed", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


class ToolIndex:
    def __init__(self, tools: Iterable[DeclaredTool]):
        self.entries = []
        for tool in tools:
            spec = tool.spec
            strong = _words(spec.name.replace("_", " ").replace("-", " ")) | _words(" ".join(spec.keywords))
            weak = _words(spec.description) | {w for p in spec.parameters.values() for w in _words(p.description)}
            self.entries.append((tool.name, {_stem(w) for w in strong}, {_stem(w) for w in weak}))

    def search(self, query: str, among: set[str]) -> list[str]:
        wanted = {_stem(w) for w in _words(query)}
        scored = []
        for name, strong, weak in self.entries:
            if name not in among:
                continue
            score = 3 * len(wanted & strong) + len(wanted & weak)
            if query.strip().lower() == name.lower():
                score += 10
            if score:
                scored.append((-score, name))
        return [name for _, name in sorted(scored)[:MAX_MATCHES]]


def search_answer(query: str, found: list[DeclaredTool], callable_now: Iterable[str]) -> str:
    if not found:
        names = ", ".join(sorted(callable_now)) or "none"
        return f"No tool matches {query!r}. Try other words, or use one of the tools you have: {names}."
    lines = [f"Found {len(found)} tool{'s' if len(found) > 1 else ''}; you can call them now:"]
    for tool in found:
        params = ", ".join(tool.spec.parameters) or "no parameters"
        lines.append(f"- {tool.name}({params}): {tool.spec.description}")
    return "\n".join(lines)


def budget_answer() -> str:
    return ('{"error": "search-budget-exhausted", "budgetCap": 3} You have searched 3 times in this turn. '
            "Call one of the tools you found, or ask the user.")


def not_found_yet_answer(name: str, callable_now: Iterable[str]) -> str:
    names = ", ".join(sorted(callable_now)) or "none"
    return (f"Tool {name!r} is not in your active set. Call {SEARCH_TOOL}(query={name!r}) to discover it, "
            f"or use one of: {names}.")
