"""What the audit trail and the store both need of their databases: a leaf, imported lazily.

Every connection waits at most `CONNECT_WAIT` seconds to open and `wait`
seconds for a statement or a lock, and has TCP keep-alives, so a server that
stops answering is noticed; a URL's password never reaches a log or an error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
from typing import Any

CONNECT_WAIT = 2


def private_file(path: str) -> None:
    """A SQLite file only its owner may read: the store holds hidden exchanges (arguments, tool output) and
    the trail every call. A new one is made 0600 (SQLite gives its -wal and -shm files the same mode); an
    existing one that others may read is said at start."""
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        for name in (path, path + "-wal", path + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                if os.stat(name).st_mode & 0o077:
                    logging.getLogger("toolkeeper").warning(
                        "%s may be read by other users of this machine (mode %o): it holds what toolkeeper "
                        "keeps of every call; chmod 600 it", name, os.stat(name).st_mode & 0o777)
    except OSError:  # no such folder, no right to create: SQLite says so, as it did
        return


def write_ahead(db: Any, wait: float) -> None:
    """Put a SQLite file in WAL mode. Workers opening one new file at once: the switch may answer "database is
    locked" at once, without the busy wait (SQLite's deadlock guard), so it is tried again until `wait` is up."""
    deadline = time.monotonic() + wait
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except Exception as exc:  # sqlite3.OperationalError: not imported here, the PostgreSQL side needs none
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def is_postgres_url(location: object) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


def without_password(url: str) -> str:
    """The URL as it may be shown: a password in the user part (even one holding `@`) or in a `password=`
    parameter becomes `***`."""
    shown = re.sub(r"://([^:/@]*):[^/?#]*@", r"://\1:***@", url)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", shown)


def connect_arguments(url: str, wait: float) -> dict[str, Any]:
    """psycopg.connect's keyword arguments: bounded waits and keep-alives, beside the URL's own options."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(url).get("options") or ""
    waited = int(wait * 1000)
    return {"connect_timeout": CONNECT_WAIT, "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
            "keepalives_count": 2,
            "options": f"{given} -c statement_timeout={waited} -c lock_timeout={waited}".strip()}


def cut(connection: Any) -> None:
    """Cut the socket under a psycopg connection stuck on a server that does not answer: what waits on it fails
    at once, and the connection is dropped (a duplicate descriptor is shut down; libpq's own is left to it)."""
    if connection is None:
        return
    with contextlib.suppress(OSError, ValueError), socket.socket(fileno=os.dup(connection.pgconn.socket)) as dup:
        dup.shutdown(socket.SHUT_RDWR)
