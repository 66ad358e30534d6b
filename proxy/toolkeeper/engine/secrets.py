"""Secrets in the results the model reads: found, then redacted, withheld or let through, and recorded.

    a declared tool's result (calls.py)           the tool's `secrets:` and the rules' -> the strictest
    an MCP server's tool's result (mcp.py)        the server's (or the tool's) and the rules' -> the strictest
    the agent's own tools' results, as they pass  the rules' on the call that made the result, else redact
      in its next request (the wire's adapters:
      `AgentResults`)

Each finding goes into the call's record (kind, where, what was done; never
the value) and into `toolkeeper_secrets_found_total{action,kind}`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from toolkeeper.audit import ExecutionRecord
from toolkeeper.engine.types import TurnContext
from toolkeeper.metrics import Metrics
from toolkeeper.policy import SECRETS_DEFAULT, Guarded, Policy, guard_result, scan_result, strictest_secrets

log = logging.getLogger("toolkeeper")

FOUND = "toolkeeper_secrets_found_total"


class CallHandler(Protocol):
    """What is read of calls.py's CallHandler (which calls this module: named, not imported)."""

    policy: Policy
    metrics: Metrics

    def document(self, tool: Any, arguments: Any, argv: list[str] | None, turn: TurnContext, *,
                 source: str = ...) -> dict[str, Any]: ...


def ruled_mode(policy: Policy, document: dict[str, Any] | None) -> str | None:
    """The strictest `secrets:` of the rules that match the call; block when they cannot be read (fail closed)."""
    if document is None:
        return None
    try:
        return policy.secrets_mode(document)
    except Exception as exc:
        log.error("the rules' secrets: mode could not be read (%r): the result is withheld", exc)
        return "block"


def noted(record: ExecutionRecord, findings: Iterable[dict[str, str]], metrics: Metrics | None) -> None:
    """Findings into the record and the metrics."""
    findings = list(findings)
    if not findings:
        return
    record.secrets = [*record.secrets, *findings]
    counted(findings, metrics)


def counted(findings: Iterable[dict[str, str]], metrics: Metrics | None) -> None:
    if metrics is not None:
        for finding in findings:
            metrics.count(FOUND, action=finding["action"], kind=finding["kind"])


def arguments_found(record: ExecutionRecord, metrics: Metrics | None) -> None:
    """An egress call's findings in its arguments (its policy input's `secrets.arguments`), once its decision is
    final: recorded and counted, `allow` when the call went out with them, `block` when it did not."""
    document = record.policy_input or {}
    found = (document.get("secrets") or {}).get("arguments") or []
    action = "allow" if record.decision == "allow" else "block"
    noted(record, [{"kind": f["kind"], "where": f["where"], "action": action} for f in found], metrics)


def declared_result(handler: CallHandler, record: ExecutionRecord, own: str | None, text: str) -> str:
    """What the model reads of a declared tool's result (`own`: the tool's `secrets:`)."""
    guarded = guard_result(text, strictest_secrets(own or SECRETS_DEFAULT,
                                                   ruled_mode(handler.policy, record.policy_input)))
    noted(record, guarded.findings, handler.metrics)
    return guarded.text


def proxied_result(handler: CallHandler, record: ExecutionRecord, own: str | None,
                   result: dict[str, Any]) -> dict[str, Any]:
    """What the client reads of an MCP server's tool's result (its `content` and `structuredContent`); one
    withheld is an error result that says why."""
    readable = {key: result[key] for key in ("content", "structuredContent") if key in result}
    found = scan_result(readable)
    if not found:
        return result
    guarded = guard_result(readable, strictest_secrets(own or SECRETS_DEFAULT,
                                                       ruled_mode(handler.policy, record.policy_input)), found=found)
    noted(record, guarded.findings, handler.metrics)
    if guarded.withheld:
        return {"content": [{"type": "text", "text": guarded.value}], "isError": True}
    return {**result, **guarded.value}


class AgentResults:
    """The agent's own tools' results as its request carries them: each one holding a secret is redacted,
    withheld or let through, under the rules that match the call that made it (found in the same request); a
    result of this request (after the model's last message: not seen before) is recorded and counted once."""

    def __init__(self, handler: CallHandler, turn: TurnContext):
        self.handler = handler
        self.turn = turn

    def guarded(self, call_id: str, value: Any, call: dict[str, Any] | None, fresh: bool) -> Guarded | None:
        """`value` as the model may read it (None: unchanged, the usual case); `call`: the neutral call entry
        that made it, when the request holds it."""
        found = scan_result(value)
        if not found:
            return None
        guarded = guard_result(value, self.mode(call), found=found)
        if fresh:  # new in this request: recorded with its call's result, and counted, once
            self.turn.result_secrets[call_id] = list(guarded.findings)
            counted(guarded.findings, self.handler.metrics)
        return guarded

    def mode(self, call: dict[str, Any] | None) -> str:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return SECRETS_DEFAULT
        arguments: Any = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):  # not JSON: the rules read the text, as they did
                arguments = orjson.loads(arguments)
        document = self.handler.document(function["name"], arguments, None, self.turn, source="agent")
        return strictest_secrets(ruled_mode(self.handler.policy, document)) or SECRETS_DEFAULT
