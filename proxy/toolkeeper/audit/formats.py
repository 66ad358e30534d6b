"""The trail in the formats other tools read: JSON lines, CSV (times in ISO 8601 with their zone), OPA decision
logs, and OpenTelemetry spans (OTLP/JSON).

OPA decision log events follow https://www.openpolicyagent.org/docs/latest/management-decision-logs/: one event
per call, `path` the rule that decided, `input` the policy input (redacted, its replaced values listed in
`masked` as JSON pointers), `result` the decision. OTLP spans follow the OTLP/HTTP JSON encoding of
ExportTraceServiceRequest: one span per call, its attributes under `toolkeeper.*`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from toolkeeper.audit.record import AuditEntry
from toolkeeper.common import canonical_json

FORMATS = ("jsonl", "csv", "opa", "otel")
DECISION_PATH = "toolkeeper/decision"
SERVICE = "toolkeeper"


def iso(seconds: float) -> str:
    """ISO 8601 with the local zone: 2026-12-01T09:14:03.512+01:00."""
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="milliseconds")


def render(entries: list[AuditEntry], fmt: str) -> str:
    if fmt == "jsonl":
        return "".join(canonical_json(entry.model_dump()).decode() + "\n" for entry in entries)
    if fmt == "opa":
        return "".join(canonical_json(opa_event(entry)).decode() + "\n" for entry in entries)
    if fmt == "otel":
        return canonical_json(otlp_request(entries)).decode() + "\n"
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(AuditEntry.model_fields))
    writer.writeheader()
    for entry in entries:
        row = entry.model_dump()
        row["time"] = iso(entry.time)
        writer.writerow({key: canonical_json(value).decode() if isinstance(value, (dict, list)) else value
                         for key, value in row.items()})
    return out.getvalue()


def opa_event(entry: AuditEntry) -> dict[str, Any]:
    """One OPA decision log event: what a pipeline ingesting OPA's decision logs reads."""
    stamp = datetime.fromtimestamp(entry.time, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    return {
        "labels": {"id": entry.host, "app": SERVICE, "source": entry.source},
        "decision_id": entry.decision_id or entry.record_id,
        "bundles": {"toolkeeper": {"revision": entry.policy_revision or ""}},
        "path": DECISION_PATH,
        "input": entry.policy_input or {},
        "result": {"effect": entry.decision, "source": entry.decision_source, "reason": entry.decision_reason,
                   "rule": entry.decision_rule, "status": entry.status},
        "requested_by": entry.agent,
        "req_id": 0,
        "timestamp": stamp,
        "masked": sorted({found for place in entry.redacted if (found := pointer(place))}),
    }


def pointer(place: str) -> str | None:
    """Where redaction replaced a value in the policy input (`arguments.token`, `argv[2]`), as a JSON pointer
    (RFC 6901: `~` and `/` escaped); None for a place outside it (the arguments as sent)."""
    place = place.removeprefix("policy_input.")
    if not place.startswith(("arguments.", "argv[")):
        return None
    parts = re.sub(r"\[(\d+)\]", r".\1", place).split(".")
    return "/input/" + "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


def _identifier(record_id: str, size: int) -> str:
    return hashlib.sha256(record_id.encode()).hexdigest()[:size]


def otlp_span(entry: AuditEntry) -> dict[str, Any]:
    start = int(entry.time * 1e9)
    attributes = {"toolkeeper.tool": entry.tool, "toolkeeper.source": entry.source,
                  "toolkeeper.decision": entry.decision, "toolkeeper.decision_source": entry.decision_source,
                  "toolkeeper.rule": entry.decision_rule or "", "toolkeeper.status": entry.status,
                  "toolkeeper.agent": entry.agent, "toolkeeper.request_id": entry.request_id,
                  "toolkeeper.record_id": entry.record_id, "toolkeeper.approver": entry.approver or ""}
    if entry.exit_code is not None:
        attributes["toolkeeper.exit_code"] = entry.exit_code
    failed = entry.status in ("failed", "timeout", "interrupted")
    return {
        "traceId": _identifier(entry.request_id or entry.record_id, 32),
        "spanId": _identifier(entry.record_id, 16),
        "name": f"tool {entry.tool}",
        "kind": 1,  # SPAN_KIND_INTERNAL
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + int(entry.duration_ms * 1e6)),
        "attributes": [_attribute(key, value) for key, value in attributes.items()],
        "status": {"code": 2 if failed else 1, "message": entry.status},
    }


def otlp_request(entries: Iterable[AuditEntry]) -> dict[str, Any]:
    """An ExportTraceServiceRequest (OTLP/JSON): one span per call."""
    return {"resourceSpans": [{
        "resource": {"attributes": [_attribute("service.name", SERVICE)]},
        "scopeSpans": [{"scope": {"name": SERVICE}, "spans": [otlp_span(entry) for entry in entries]}],
    }]}


def _attribute(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}
