"""Reading the trail's events back: a body that parses, an entry that validates, or the trail was altered."""

from __future__ import annotations

import os
from typing import Any

import orjson

from toolkeeper.audit.record import AuditEntry
from toolkeeper.common import sha256_hex

# In every event, and in its columns: what filters read.
INDEXED_FIELDS = ("record_id", "kind", "time", "tool", "agent", "status")
GENESIS = "0" * 64  # the "previous hash" of the first event


def chain_hash(prev_hash: str, body: bytes) -> str:
    return sha256_hex(prev_hash.encode() + b"\x00" + body)


class AuditError(Exception):
    """A record could not be written (or read): the call it describes must not run."""


class DamagedTrail(AuditError):
    """An event that cannot be read back: someone wrote into the trail by hand."""


def event_body(body: Any) -> dict[str, Any]:
    try:
        parsed = orjson.loads(bytes(body) if not isinstance(body, str) else body.encode())
    except orjson.JSONDecodeError as exc:
        raise DamagedTrail(f"an event is not valid JSON ({exc}): the trail was altered; run `toolkeeper audit "
                           "verify`") from exc
    if not isinstance(parsed, dict) or "record_id" not in parsed:
        raise DamagedTrail("an event is not a record: the trail was altered; run `toolkeeper audit verify`")
    return parsed


def entry_of(merged: dict[str, Any]) -> AuditEntry:
    try:
        return AuditEntry.model_validate(merged)
    except ValueError as exc:
        raise DamagedTrail(f"record {merged.get('record_id')} cannot be read ({str(exc).splitlines()[0]}): the "
                           "trail was altered; run `toolkeeper audit verify`") from exc


UNHASHED = object()  # a column an event of an earlier version did not repeat in its body


def hashed_columns(body: bytes) -> tuple[Any, ...]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return (None,) * len(INDEXED_FIELDS)
    if not isinstance(parsed, dict):
        return (None,) * len(INDEXED_FIELDS)
    return tuple(parsed.get(name, UNHASHED) for name in INDEXED_FIELDS)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()  # a process that wrote it and is this one: a pid reused since
