"""The agents' sessions: what each conversation has already done, as the rules read it (mixed into SQLStore).

A session is one conversation, named by a hash its door makes (engine/flows.py):
how many calls were decided in it, and each label its allowed calls brought,
with the calls that brought it. Every replica reads and adds to the same rows:

- an add is one transaction, and each of its statements changes a row in
  place (`calls + 1`, a label's row inserted or left), never read, changed and
  written back, so two replicas adding at once lose nothing;
- a label keeps the first `SEEN_KEPT` calls that brought it: what a rule tests
  is that it was seen, and a long session must not make each call's lookup
  longer without end;
- a session lives `ttl` seconds (the history's) after its last call. One that
  lapsed and comes back starts empty (`started`): the labels it had are left
  unread, and the purge takes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SEEN_KEPT = 10  # calls kept per label of a session (the first ones)

UPSERT = ("INSERT INTO flow_sessions (id, calls, started, expires) VALUES (?, 1, ?, ?) ON CONFLICT (id) DO UPDATE "
          "SET calls = CASE WHEN flow_sessions.expires <= ? THEN 1 ELSE flow_sessions.calls + 1 END, "
          "started = CASE WHEN flow_sessions.expires <= ? THEN excluded.started ELSE flow_sessions.started END, "
          "expires = excluded.expires")
# A label's row, unless SEEN_KEPT calls of this session already brought it (a bound, not a count: two replicas
# adding at once may keep one more)
ADD_LABEL = ("INSERT INTO flow_labels (session, label, record_id, tool, time, added) SELECT ?, ?, ?, ?, ?, ? "
             "WHERE (SELECT COUNT(*) FROM flow_labels l JOIN flow_sessions s ON s.id = l.session "
             "WHERE l.session = ? AND l.label = ? AND l.added >= s.started) < ? "
             "ON CONFLICT (session, label, record_id) DO NOTHING")
READ = ("SELECT s.calls, l.label, l.tool, l.record_id, l.time FROM flow_sessions s LEFT JOIN flow_labels l "
        "ON l.session = s.id AND l.added >= s.started WHERE s.id = ? AND s.expires > ? ORDER BY l.label, l.added")
PURGE = (
    "DELETE FROM flow_labels WHERE session IN (SELECT id FROM flow_sessions WHERE expires <= ?)",
    "DELETE FROM flow_sessions WHERE expires <= ?",
)


def empty_session(session_id: str = "") -> dict[str, Any]:
    """The `session` of a call with nothing before it (or no session at all: id "")."""
    return {"id": session_id, "calls": 0, "has": [], "seen": {}}


class Sessions:
    async def session(self: Any, session_id: str) -> dict[str, Any]:
        """The session as the policy input holds it: its id, the calls decided in it, the labels seen (`has`) and,
        for each, the calls that brought it (`seen`: tool, record id, time)."""
        rows = await self._fetch(READ, (session_id, self.now()))
        found = empty_session(session_id)
        if not rows:
            return found
        found["calls"] = rows[0][0]
        for _, label, tool, record_id, time in rows:
            if label is not None:
                found["seen"].setdefault(label, []).append({"tool": tool, "record_id": record_id, "time": time})
        found["has"] = sorted(found["seen"])
        return found

    async def add_to_session(self: Any, session_id: str, labels: Iterable[str], tool: str, record_id: str,
                             time: str, ttl: float) -> None:
        """One call decided in the session, and the labels it brought (none when it was refused); `time`: the
        call's, as the policy input shows it. The session lives `ttl` seconds from now."""
        now = self.now()
        statements: list[tuple[str, tuple[Any, ...]]] = [(UPSERT, (session_id, now, now + ttl, now, now))]
        statements += [(ADD_LABEL, (session_id, label, record_id, tool, time, now, session_id, label, SEEN_KEPT))
                       for label in sorted(set(labels))]
        await self._atomic(statements)
        await self._wrote()
