"""What the limits counted (mixed into SQLStore): by limit and scope, in buckets of the limit's window.

A limit's window slides: what it holds is every bucket that has not wholly
left it, so a count leaves the window between `window` and `window + width`
seconds after it was made, never before (a bucket is a sixtieth of the
window, at least a second). Every replica counts in the same rows:

- a reservation (`take`) is one transaction: it locks the scope's row in
  `limit_scopes`, then adds to its bucket only if the window's sum leaves room,
  then reads the sum again. Two replicas reserving at once take turns on the
  lock, so a limit of 20 lets exactly 20 through;
- an amount known only afterwards (tokens, run time) is added in place
  (`amount + ?`), never read, changed and written back;
- a reservation whose call did not run is given back to the bucket it took.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

BUCKETS = 60  # a window in this many buckets
KEPT = 32 * 86400  # seconds a bucket is kept: longer than the longest window a limit may have

LOCK = ("INSERT INTO limit_scopes (limit_id, scope, touched) VALUES (?, ?, ?) ON CONFLICT (limit_id, scope) "
        "DO UPDATE SET touched = excluded.touched")
SUM = "SELECT COALESCE(SUM(amount), 0) FROM limit_counts WHERE limit_id = ? AND scope = ? AND ends > ?"
ADD = ("INSERT INTO limit_counts (limit_id, scope, ends, amount) VALUES (?, ?, ?, ?) ON CONFLICT (limit_id, scope, "
       "ends) DO UPDATE SET amount = limit_counts.amount + excluded.amount")
ADD_IF_ROOM = ("INSERT INTO limit_counts (limit_id, scope, ends, amount) SELECT ?, ?, ?, ? WHERE "
               f"({SUM}) + ? <= ? ON CONFLICT (limit_id, scope, ends) DO UPDATE "
               "SET amount = limit_counts.amount + excluded.amount RETURNING amount")
PURGE = ("DELETE FROM limit_counts WHERE ends <= ?", "DELETE FROM limit_scopes WHERE touched <= ?")


@dataclass(frozen=True)
class Count:
    """One count of one limit: its id, the scope it counts for, its window (seconds) and its maximum."""

    limit_id: str
    scope: str
    window: float
    most: int


@dataclass(frozen=True)
class Taken:
    """A reservation's outcome for one count: taken or not, the sum before it, and where it went."""

    count: Count
    taken: bool
    used: int  # the window's sum before this reservation
    ends: int  # the bucket it was added to (to give it back)
    amount: int


def bucket_end(window: float, now: float) -> int:
    width = max(1, int(window // BUCKETS))
    return (int(now) // width + 1) * width


class LimitCounts:
    async def take(self: Any, counts: Sequence[Count], amount: int = 1, *, force: bool = False) -> list[Taken]:
        """Reserve `amount` on each count where the window leaves room (`force`: on each, room or not), in one
        transaction whose locks are taken in one order (no two reservations wait on each other)."""
        now, statements = self.now(), []
        ordered = sorted(counts, key=lambda c: (c.limit_id, c.scope))
        for count in ordered:
            ends, start = bucket_end(count.window, now), now - count.window  # buckets ending after start count
            where = (count.limit_id, count.scope, start)
            statements += [(LOCK, (count.limit_id, count.scope, now))]
            if force:
                statements += [(ADD + " RETURNING amount", (count.limit_id, count.scope, ends, amount))]
            else:
                statements += [(ADD_IF_ROOM, (count.limit_id, count.scope, ends, amount, *where, amount, count.most))]
            statements += [(SUM, where)]
        rows = await self._atomic(statements) if statements else []
        found = []
        for at, count in enumerate(ordered):
            taken, after = bool(rows[3 * at + 1]), int(rows[3 * at + 2][0][0])
            found.append(Taken(count, taken, after - amount if taken else after, bucket_end(count.window, now),
                               amount))
        await self._wrote()
        return found

    async def give_back(self: Any, taken: Iterable[Taken]) -> None:
        """Reservations whose call did not run, taken out of the buckets they went to."""
        statements = [("UPDATE limit_counts SET amount = amount - ? WHERE limit_id = ? AND scope = ? AND ends = ?",
                       (one.amount, one.count.limit_id, one.count.scope, one.ends)) for one in taken if one.taken]
        if statements:
            await self._atomic(statements)

    async def add_to_counts(self: Any, counts: Iterable[Count], amount: int) -> None:
        """An amount known once it is spent (a round's tokens, a run's milliseconds), added to each count."""
        now = self.now()
        statements = [(ADD, (count.limit_id, count.scope, bucket_end(count.window, now), amount))
                      for count in counts]
        if statements and amount > 0:
            await self._atomic(statements)
            await self._wrote()

    async def used(self: Any, counts: Sequence[Count]) -> list[int]:
        """Each count's sum over its window now."""
        now = self.now()
        found = []
        for count in counts:
            rows = await self._fetch(SUM, (count.limit_id, count.scope, now - count.window))
            found.append(int(rows[0][0]))
        return found

    async def limit_usage(self: Any, limit_id: str, window: float, top: int = 100) -> list[tuple[str, int]]:
        """The scopes with a count in the window, most used first: (scope, used), at most `top`."""
        rows = await self._fetch(
            "SELECT scope, SUM(amount) FROM limit_counts WHERE limit_id = ? AND ends > ? GROUP BY scope "
            "HAVING SUM(amount) > 0 ORDER BY 2 DESC, scope LIMIT ?",
            (limit_id, self.now() - window, top))
        return [(scope, int(used)) for scope, used in rows]

    async def limit_totals(self: Any, limit_id: str, window: float) -> tuple[int, int, int]:
        """(scopes with a count in the window, their sum, the highest one)."""
        rows = await self._fetch(
            "SELECT COUNT(*), COALESCE(SUM(used), 0), COALESCE(MAX(used), 0) FROM (SELECT SUM(amount) AS used "
            "FROM limit_counts WHERE limit_id = ? AND ends > ? GROUP BY scope HAVING SUM(amount) > 0) AS scopes",
            (limit_id, self.now() - window))
        scopes, total, highest = rows[0]
        return int(scopes), int(total), int(highest)

    async def reset_limit(self: Any, limit_id: str, scope: str | None = None) -> int:
        """A limit's counts cleared (one scope's, or every scope's): how many buckets held some."""
        if scope is None:
            return await self._execute("DELETE FROM limit_counts WHERE limit_id = ? AND amount > 0", (limit_id,))
        return await self._execute("DELETE FROM limit_counts WHERE limit_id = ? AND scope = ? AND amount > 0",
                                   (limit_id, scope))

