"""Faithful history: the hidden exchanges put back into the agent's next request.

The agent's history holds only what it received: an assistant message with the
text of every round joined (and its own tool calls). The model must see what
really happened: the declared calls, their results, and its messages as it
wrote them. After a turn with hidden rounds, the exchange is stored under a key
made of

- the tenant (a hash of the agent's credentials), so no one can pull another
  agent's exchange;
- a running hash of the conversation before that message (user, assistant and
  tool messages as the agent sends them; system prompts are left out, as agents
  often rebuild them), so the same words in another conversation do not match;
- the message the agent received, in a canonical form that survives an agent
  re-serialising it (content stripped, arguments re-encoded, extra fields
  ignored).

A second, loose key (tenant and message only) tells an edited history or an
expired exchange ("a miss": forwarded as it is, and counted) from a message
that never had one.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import orjson

from toolkeeper.metrics import Metrics
from toolkeeper.store import Store

log = logging.getLogger("toolkeeper")

DEFAULT_TTL = 24 * 3600
UNCHAINED_ROLES = ("system", "developer")


def _canonical_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def _text(content: Any) -> str:
    """What a message says. Text parts joined are the same text as a string: an agent may resend a message
    of one text block as a plain string (Claude Code's --continue does)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        texts = [part.get("text") if isinstance(part, dict) else None for part in content]
        if all(isinstance(text, str) for text in texts):
            return "".join(texts).strip()  # type: ignore[arg-type]
        return orjson.dumps([part.get("text", part) if isinstance(part, dict) else part for part in content],
                            option=orjson.OPT_SORT_KEYS).decode()
    return str(content)


def canonical(message: dict[str, Any]) -> bytes:
    """The parts of a message that say what it is, in one stable encoding."""
    calls = []
    for entry in message.get("tool_calls") or []:
        if not isinstance(entry, dict):
            continue
        function = entry.get("function") or {}
        calls.append([entry.get("id"), function.get("name"), _canonical_arguments(function.get("arguments"))])
    return orjson.dumps([message.get("role"), _text(message.get("content")), calls, message.get("tool_call_id")],
                        option=orjson.OPT_SORT_KEYS)


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()


def chain_keys(tenant: str, messages: list[dict[str, Any]]) -> list[str | None]:
    """For each message, the key of the conversation up to and including it (None where unchained)."""
    running = _digest(tenant.encode())
    keys: list[str | None] = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") in UNCHAINED_ROLES:
            keys.append(None)
            continue
        running = _digest(running.encode(), canonical(message))
        keys.append(running)
    return keys


def loose_key(tenant: str, message: dict[str, Any]) -> str:
    return _digest(b"loose", tenant.encode(), canonical(message))


class History:
    def __init__(self, store: Store, ttl: float = DEFAULT_TTL, metrics: Metrics | None = None):
        self.store = store
        self.ttl = ttl
        self.metrics = metrics or Metrics()
        for outcome in ("hit", "miss"):
            self.metrics.expect("toolkeeper_history_restorations_total", outcome=outcome)

    async def restore(self, tenant: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The history the model should see: every stored exchange put back in place."""
        positions = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
        if not positions:
            return messages
        # The loose keys first (one hash per assistant message): most requests find
        # nothing, and then the conversation's chained hash is never computed.
        loose = {i: loose_key(tenant, messages[i]) for i in positions}
        found = await self.store.find_exchanges(list(set(loose.values())))
        if not found:
            return messages
        keys = chain_keys(tenant, messages)
        restored: list[dict[str, Any]] = []
        i = 0
        while i < len(messages):
            message = messages[i]
            candidates = found.get(loose.get(i, ""), []) if i in loose else []
            exchange = next((ex for key, ex in candidates if key == keys[i]), None) if candidates else None
            if candidates and exchange is None:
                self.metrics.count("toolkeeper_history_restorations_total", outcome="miss")  # expired, or edited
                log.info("history restoration missed at message %d: forwarded as it is", i)
            if exchange is None:
                restored.append(message)
                i += 1
                continue
            self.metrics.count("toolkeeper_history_restorations_total", outcome="hit")
            j = i + 1
            while j < len(messages) and isinstance(messages[j], dict) and messages[j].get("role") == "tool":
                j += 1
            restored.extend(_splice(exchange["messages"], messages[i + 1:j]))
            i = j
        return restored

    async def remember(self, tenant: str, agent_messages: list[dict[str, Any]], received: dict[str, Any],
                 exchange: list[dict[str, Any]]) -> None:
        """Store what the model saw in place of the message the agent received."""
        key = chain_keys(tenant, [*agent_messages, received])[-1]
        if key is None:
            return
        await self.store.put_exchange(key, loose_key(tenant, received), {"messages": exchange}, self.ttl)


def _splice(sequence: list[dict[str, Any]], agent_results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored sequence, its trailing declared results merged with the agent's own, in call order."""
    last = max((k for k, m in enumerate(sequence) if m.get("role") == "assistant"), default=-1)
    head, trailing = sequence[: last + 1], sequence[last + 1:]
    order = {entry.get("id"): position for position, entry in
             enumerate(sequence[last].get("tool_calls") or [] if last >= 0 else [])}
    block = sorted([*trailing, *agent_results], key=lambda m: order.get(m.get("tool_call_id"), len(order)))
    return head + block
