"""A call in its session: what it brings (its labels), and what the session had already done.

    the call's document (CallHandler.document: its tool's labels and the label rules')
        -> the session, read from the store (`session`: the labels seen so far, and the calls that brought them)
        -> an egress call's arguments scanned for secrets (`secrets.arguments`)
        -> the policy decides (a rule may test `session:`; its decision names the calls of the flow)
        -> the call let through: its labels added to the session; every call decided: counted in it

A session is one conversation, named by a hash its door makes, so that no id
carries what the conversation said: the model APIs from the tenant and the
conversation's opening (`conversation_session`), which every request of that
conversation resends; the hooks door from the agent's own session id;
/mcp from the MCP session (`door_session`, with whose each is).

An allowed call of the agent's own is taken to run: the agent runs it after
the decision, out of sight, and more labels can only make later calls
stricter. A session the store cannot read fails closed: the call is refused,
as no rule on the session could be read.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from toolkeeper.audit import ExecutionRecord
from toolkeeper.common import digest
from toolkeeper.engine.history import UNCHAINED_ROLES, canonical
from toolkeeper.engine.types import TurnContext
from toolkeeper.metrics import Metrics
from toolkeeper.policy import Decision, scan_arguments
from toolkeeper.store import Store, StoreError

log = logging.getLogger("toolkeeper")

EGRESS = "egress"


def door_session(door: str, *parts: str) -> str:
    """A session id from what a door knows of it (an agent's session id, an MCP session, with whose it is)."""
    return digest("toolkeeper-session", door, *parts)


def conversation_session(tenant: str, messages: Any) -> str:
    """The session of a conversation on a model API: the tenant and the conversation's opening, the messages
    before the model's first (system and developer messages left out: agents rebuild them), in the form the
    history compares messages in (an agent re-serialising them does not change it). The first request holds all
    of it, and every later one resends it: an agent that opens with context of its own (Codex's instructions and
    environment) opens with its user's words too. Two conversations that open alike share one session, which can
    only make their calls stricter."""
    opening: list[str] = []
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict) or message.get("role") in UNCHAINED_ROLES:
            continue
        if message.get("role") == "assistant":
            break
        opening.append(canonical(_without_cache_marks(message)).decode())
    return door_session("conversation", tenant, *opening)


def _without_cache_marks(message: dict[str, Any]) -> dict[str, Any]:
    """An agent moves its prompt-cache marks (`cache_control`) to the newest messages from one request to the
    next: what a message says is the same without them."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = [{key: value for key, value in part.items() if key != "cache_control"} if isinstance(part, dict)
             else part for part in content]
    return {**message, "content": parts}


class Flows:
    def __init__(self, store: Store | None, ttl: float, metrics: Metrics):
        self.store = store
        self.ttl = ttl  # seconds a session lives after its last call: the history's
        self.metrics = metrics

    async def read(self, document: dict[str, Any], turn: TurnContext) -> Decision | None:
        """The session into the call's document, and an egress call's arguments scanned; a deny when the store
        cannot say what the session has done."""
        if turn.session and self.store is not None:
            try:
                document["session"] = await self.store.session(turn.session)
            except StoreError as exc:
                return Decision("deny", "store", f"toolkeeper could not read what this session has already done "
                                                 f"({exc}), and decides no call without it")
        if EGRESS in document.get("labels", ()):
            document["secrets"] = {"arguments": scan_arguments(document.get("arguments"))}
        return None

    def counted(self, decision: Decision) -> Decision:
        """A decision a rule on the session made, counted."""
        if decision.flow:
            self.metrics.count("toolkeeper_flow_decisions_total", effect=decision.effect)
        return decision

    async def add(self, record: ExecutionRecord, turn: TurnContext, passed: bool | None = None) -> Decision | None:
        """One call decided in the session: counted, and its labels added when it was let through (`passed`;
        by default, when it was allowed). A deny when they could not be kept: the session would forget them, and
        a later call be judged without them."""
        if not turn.session or self.store is None:
            return None
        passed = record.decision == "allow" if passed is None else passed
        when = datetime.fromtimestamp(record.time).astimezone().isoformat(timespec="seconds")
        try:
            await self.store.add_to_session(turn.session, record.labels if passed else (), record.tool,
                                            record.record_id, when, self.ttl)
            turn.session_calls += 1
        except StoreError as exc:
            log.error("the call of %s is not noted in its session: %s", record.tool, exc)
            if not passed or not record.labels:
                return None
            return Decision("deny", "store", f"toolkeeper could not note in this session what the call brings "
                                             f"({', '.join(record.labels)}: {exc}), so it was not let through")
        return None
