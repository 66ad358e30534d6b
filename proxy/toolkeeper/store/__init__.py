"""The store: what toolkeeper remembers between requests (hidden history, links, the retry memo, approvals,
sessions).

One interface, `SQLStore`, over two databases: SQLite next to the agent file
(the default, shared by the workers of one machine) and PostgreSQL
(`--store postgresql://...`, shared by replicas). It imports nothing of
toolkeeper but its leaves.
"""

from __future__ import annotations

from pathlib import Path

from toolkeeper.database import is_postgres_url
from toolkeeper.store.base import LEASE, Claim, SQLStore, StoreError, new_id
from toolkeeper.store.limits import Count, Taken
from toolkeeper.store.pins import definition_digest
from toolkeeper.store.schema import VERSION, SchemaError
from toolkeeper.store.sessions import SEEN_KEPT, empty_session
from toolkeeper.store.sqlite import SQLiteStore

Store = SQLStore


def open_store(location: str | Path) -> SQLStore:
    """A path is an SQLite file; a postgresql:// URL a PostgreSQL database."""
    if is_postgres_url(location):
        from toolkeeper.store.postgres import PostgresStore

        return PostgresStore(str(location))
    return SQLiteStore(location)


__all__ = ["LEASE", "SEEN_KEPT", "VERSION", "Claim", "Count", "SQLStore", "SQLiteStore", "SchemaError", "Store",
           "StoreError", "Taken", "definition_digest", "empty_session", "new_id", "open_store"]
