"""The agent's own tools' results in its request: one that holds a secret is rewritten before the body goes upstream.

Each API's adapter calls `guard_results` on the neutral messages its request
became, naming where a result's original lives (the message itself for Chat
Completions; a `function_call_output` item's `output` for the Responses API; a
`tool_result` block's `content` for Messages), since that original is what
goes upstream. Only a result that holds a secret is replaced, in the neutral
message and in its original: every other message, item and block goes on as
the agent sent it (the same objects).

Every request of a conversation resends its history, so this runs over every
result of it on every request: for a result without a secret (the usual case)
it costs a digest of its text, under which the detector's findings are kept.
"""

from __future__ import annotations

from typing import Any

from toolkeeper.engine import AgentResults, Engine, TurnContext


def guard_results(engine: Engine, messages: list[dict[str, Any]], turn: TurnContext, *, original: str | None = None,
                  field: str = "content") -> list[dict[str, Any]]:
    """`messages` with each tool result holding a secret redacted or withheld (or let through: recorded), under the
    rules on the call that made it; `original`: the key of a neutral message's list of originals (None: the
    message is the original), `field`: the original's key that holds the result."""
    guard = AgentResults(engine.handler, turn)
    calls: dict[Any, dict[str, Any]] = {}
    last_answer = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    out: list[dict[str, Any]] | None = None
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            calls.update((entry.get("id"), entry) for entry in message.get("tool_calls") or ()
                         if isinstance(entry, dict))
            continue
        if role != "tool":
            continue
        source = message if original is None else (message.get(original) or [None])[0]
        if not isinstance(source, dict) or field not in source:
            continue  # not a result (an approval's answer), or none the agent sent
        call_id = message.get("tool_call_id")
        guarded = guard.guarded(str(call_id), source[field], calls.get(call_id), fresh=position > last_answer)
        if guarded is None or not guarded.changed:
            continue
        rewritten = {**message, "content": guarded.value}
        if original is not None:
            rewritten[original] = [{**source, field: guarded.value}, *message[original][1:]]
        out = out if out is not None else list(messages)
        out[position] = rewritten
    return out if out is not None else messages
