"""The record of one declared call: one shape that every consumer reads.

The audit trail stores it, the demo prints it, metrics count it. Observers get
it after the call; they must not fail the call.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

CallStatus = Literal["ok", "failed", "invalid", "denied", "timeout"]


class ExecutionRecord(BaseModel):
    version: int = 1
    record_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    time: float = Field(default_factory=time.time)
    request_id: str = ""
    agent: str = ""  # a short hash identifying the agent's credentials, never the key
    tool: str
    runner: str
    call_id: str
    arguments_sent: Any = None
    arguments: dict[str, Any] | None = None
    argv: list[str] | None = None
    decision: str = ""  # allow | deny | ask
    decision_source: str = ""
    decision_reason: str = ""
    decision_rule: str | None = None  # the rule that decided, when the security team's rules did
    policy_revision: str | None = None  # which rules: a hash of the rules file, or OPA's bundle revision
    decision_id: str | None = None  # OPA's decision id
    policy_input: dict[str, Any] | None = None  # the document the policy read
    consent: str | None = None  # approved | denied, when someone was asked
    approver: str | None = None
    status: CallStatus
    exit_code: int | None = None
    trap: str | None = None  # why a wasm module was stopped, in words
    duration_ms: float = 0.0
    output_bytes: int = 0
    output_sha256: str | None = None
    answer: str = ""  # what the model was told
    redacted: list[str] = Field(default_factory=list)  # which values were replaced before storing

    @staticmethod
    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()


class Observer(Protocol):
    def __call__(self, record: ExecutionRecord) -> None: ...
