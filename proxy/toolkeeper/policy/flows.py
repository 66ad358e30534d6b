"""Flows: the tests a rule puts to a call's labels, to its session, and to the secrets in its arguments.

A call carries labels (`untrusted`, `private`, `egress`, and a team's own):
its tool's declared ones and those of the label rules that match it. Its
session (one conversation) has seen the labels of the calls allowed before
it, each with the calls that brought it. A rule that tests the session names
that flow: the decision carries the record ids of those calls, and its
reason says them in words, for the model that reads it and the person asked.
"""

from __future__ import annotations

from typing import Any

from pydantic import field_validator, model_validator

from toolkeeper.common import Strict
from toolkeeper.policy.conditions import ValueTest
from toolkeeper.policy.situation import MembersTest
from toolkeeper.tools import LABEL  # one spelling of a label for the agent file, the rules and the records

SECRETS_MODES = ("allow", "redact", "block")  # the loosest first: of the rules that say one, the strictest wins
# how a reason says what a session has seen: a label's own words, else the label itself
SEEN_WORDS = {"untrusted": "untrusted content from {tools}", "private": "private data from {tools}",
              "egress": "data sent out by {tools}"}
NAMED_TOOLS = 3  # a reason names this many tools of a flow, then says how many more


def label_names(value: Any) -> Any:
    """A validator: labels are lowercase words (`untrusted`, `customer-data`), as the agent file writes them."""
    if isinstance(value, list | tuple):
        for label in value:
            if not isinstance(label, str) or not LABEL.fullmatch(label):
                raise ValueError(f"{label!r} is not a label: a lowercase letter, then up to 63 lowercase letters, "
                                 "digits, '_' or '-' (untrusted, private, egress, or a team's own)")
        return tuple(dict.fromkeys(value))
    return value


class LabelsTest(MembersTest):
    """Tests on the call's own labels: `any` of them, `all` of them, `none` of them; a list is `any`."""

    @field_validator("any", "all", "none", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        return label_names(value)


class SessionTest(Strict):
    """Tests on what the call's session has done before it: `has` every one of these labels, `has_any` one of
    them, `calls` (how many calls it has decided) a number test."""

    has: tuple[str, ...] | None = None
    has_any: tuple[str, ...] | None = None
    calls: ValueTest | None = None

    @field_validator("has", "has_any", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        return label_names([value] if isinstance(value, str) else value)

    @model_validator(mode="after")
    def _something(self) -> SessionTest:
        if not self.model_fields_set:
            raise ValueError("session needs at least one of has, has_any, calls")
        if self.has_any == ():
            raise ValueError("has_any: [] never holds; name at least one label")
        return self

    def holds(self, session: Any) -> bool:
        session = session if isinstance(session, dict) else {}
        seen = set(session.get("has") or ()) | set(session.get("seen") or {})
        if self.has is not None and not set(self.has) <= seen:
            return False
        if self.has_any is not None and not seen & set(self.has_any):
            return False
        calls = session.get("calls", 0)
        return self.calls is None or self.calls.holds(calls, True)

    def tested(self, session: dict[str, Any]) -> list[str]:
        """The labels this test found in the session: those that led to the decision."""
        seen = set(session.get("has") or ()) | set(session.get("seen") or {})
        return [label for label in dict.fromkeys((*(self.has or ()), *(self.has_any or ()))) if label in seen]


def empty_session(session_id: str = "") -> dict[str, Any]:
    """The policy input's `session` for a call that belongs to none (or to a session with nothing in it yet)."""
    return {"id": session_id, "calls": 0, "has": [], "seen": {}}


def flow(test: SessionTest, document: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """What of the session made `test` hold: the record ids of the calls that brought the labels it tested
    (earliest first), and the words a reason says it in: `this session has already seen untrusted content from
    web_fetch and private data from read_file`."""
    session = document.get("session") if isinstance(document.get("session"), dict) else {}
    seen = session.get("seen") if isinstance(session.get("seen"), dict) else {}
    calls: list[dict[str, Any]] = []
    parts = []
    for label in test.tested(session):
        entries = [entry for entry in seen.get(label) or () if isinstance(entry, dict)]
        calls += entries
        tools = list(dict.fromkeys(str(entry.get("tool") or "an earlier call") for entry in entries))
        parts.append(SEEN_WORDS.get(label, label + " from {tools}").format(tools=_listed(tools) or "an earlier call"))
    calls.sort(key=lambda entry: str(entry.get("time") or ""))
    ids = tuple(dict.fromkeys(str(entry["record_id"]) for entry in calls if entry.get("record_id")))
    words = f"this session has already seen {_listed(parts, any(' and ' in part for part in parts))}" if parts else ""
    if test.calls is not None:
        made = f"made {session.get('calls', 0)} calls"
        words = f"{words} and {made}" if words else f"this session has already {made}"
    return ids, words


def _listed(words: list[str], serial: bool = False) -> str:
    """`a`, `a and b`, `a, b and c`, `a, b, c and 2 more`; `serial`: `x and y, and z` (parts that say `and`)."""
    if len(words) > NAMED_TOOLS + 1:
        words = [*words[:NAMED_TOOLS], f"{len(words) - NAMED_TOOLS} more"]
    if len(words) < 2:
        return "".join(words)
    return ", ".join(words[:-1]) + (", and " if serial else " and ") + words[-1]


def secrets_found(document: dict[str, Any]) -> bool:
    """Whether the scan of the call's arguments found a secret (it scans an `egress` call's only)."""
    secrets = document.get("secrets")
    found = secrets.get("arguments") if isinstance(secrets, dict) else None
    return bool(found)


def strictest(modes: list[str]) -> str | None:
    """Of the `secrets:` modes the matching rules say, the strictest (block > redact > allow); None for none."""
    return max(modes, key=SECRETS_MODES.index) if modes else None

