"""Where each ask was sent (mixed into SQLStore): one row per waiting call and channel, so any replica's queue
page shows whether the people it was sent to were reached.

    sending     the first attempt is under way, or a failed one will be tried again (`error` says why it failed)
    delivered   the channel answered 2xx
    failed      given up: the call was answered or expired first, or the channel cannot be used

No secret is kept here: a row names the channel (its name in the policy file), never its URL or its key, and
`error` is written by the sender, who leaves both out of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

UPSERT = ("INSERT INTO notify_deliveries (approval_id, channel, status, attempts, error, updated) "
          "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (approval_id, channel) DO UPDATE SET status = excluded.status, "
          "attempts = excluded.attempts, error = excluded.error, updated = excluded.updated")
FIELDS = ("approval_id", "channel", "status", "attempts", "error", "updated")


class Deliveries:
    async def note_delivery(self: Any, approval_id: str, channel: str, status: str, attempts: int,
                            error: str | None = None) -> None:
        """Where the delivery of one ask to one channel stands now."""
        await self._execute(UPSERT, (approval_id, channel, status, attempts, error, self.now()))

    async def deliveries(self: Any, approval_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """approval id -> its deliveries, by channel name."""
        found: dict[str, list[dict[str, Any]]] = {}
        for start in range(0, len(approval_ids), 500):
            batch = list(approval_ids[start:start + 500])
            rows = await self._fetch(f"SELECT {', '.join(FIELDS)} FROM notify_deliveries "  # noqa: S608
                                     f"WHERE approval_id IN ({','.join('?' * len(batch))}) ORDER BY channel", batch)
            for row in rows:
                delivery = dict(zip(FIELDS, row, strict=True))
                found.setdefault(delivery["approval_id"], []).append(delivery)
        return found

    async def failing_channels(self: Any, since: float) -> list[dict[str, Any]]:
        """The channels whose latest delivery (written after `since`) is failing: given up, or retrying after an
        error. A channel that delivered since is not failing, whatever it did before."""
        rows = await self._fetch(f"SELECT {', '.join(FIELDS)} FROM notify_deliveries WHERE updated >= ? "  # noqa: S608
                                 "ORDER BY updated DESC", (since,))
        latest: dict[str, dict[str, Any]] = {}
        for row in rows:
            delivery = dict(zip(FIELDS, row, strict=True))
            latest.setdefault(delivery["channel"], delivery)
        return [d for _, d in sorted(latest.items()) if d["status"] != "delivered" and d["error"]]
