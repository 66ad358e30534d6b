"""Redaction: secret-named values replaced before a record reaches any store.

Argument values whose names match the configured patterns (default: key,
token, secret, password, authorization) are replaced in the arguments, the
policy input and the argv, and wherever their text appears in the answer; the
record lists what was redacted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import orjson

from toolkeeper.audit.record import ExecutionRecord

DEFAULT_PATTERNS = ("key", "token", "secret", "password", "authorization")
REDACTED = "[redacted]"


class Redactor:
    def __init__(self, patterns: Iterable[str] = DEFAULT_PATTERNS):
        self.pattern = re.compile("|".join(re.escape(p) for p in patterns), re.IGNORECASE)

    def apply(self, record: ExecutionRecord) -> ExecutionRecord:
        """The record as it may be stored: secret-named values replaced everywhere they appear."""
        secrets: list[str] = []
        redacted: list[str] = []
        data = record.model_dump()
        for field in ("arguments_sent", "arguments"):
            value = data.get(field)
            if isinstance(value, str):
                try:
                    value = orjson.loads(value)
                except orjson.JSONDecodeError:
                    continue
                data[field] = value
            if isinstance(value, dict):
                for name in list(value):
                    if self.pattern.search(name) and value[name] not in (None, ""):
                        secrets.append(str(value[name]))
                        value[name] = REDACTED
                        redacted.append(f"{field}.{name}")
        policy_input = data.get("policy_input") or {}
        for name in list(policy_input.get("arguments") or {}):
            if self.pattern.search(name):
                policy_input["arguments"][name] = REDACTED
        if secrets:
            data["argv"] = [_erase(entry, secrets) for entry in data.get("argv") or []] or data.get("argv")
            data["answer"] = _erase(data.get("answer") or "", secrets)
            if policy_input.get("argv"):
                policy_input["argv"] = [_erase(entry, secrets) for entry in policy_input["argv"]]
        data["redacted"] = sorted(set(redacted))
        return ExecutionRecord.model_validate(data)


def _erase(text: str, secrets: list[str]) -> str:
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, REDACTED)
    return text
