"""`toolkeeper tokens add NAME --role approver|auditor|admin`, `tokens list`, `tokens revoke NAME`.

Named tokens, for the people who answer calls and read the trail: an approval records the token's name, not a
name the caller gives. They live in the store (hashed: the token is printed once, never kept), so every replica
and worker sharing the store knows them. The store is serve's, found as serve finds it: `--store`, else
$TOOLKEEPER_STORE, else `store:` in the --config file, else toolkeeper.sqlite3 next to the agent file (--agent-file,
$TOOLKEEPER_AGENT_FILE, `agent_file:`), else in the current directory.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
import sys
from datetime import datetime
from pathlib import Path

from toolkeeper.settings import Settings

ROLES = ("approver", "auditor", "admin")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")  # what records and listings show, as it is


def add_parser(commands: argparse._SubParsersAction) -> None:
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--store", default=argparse.SUPPRESS, help="serve's --store (an SQLite file or a "
                       "postgresql:// URL); default $TOOLKEEPER_STORE, else the config file's, else "
                       "toolkeeper.sqlite3 next to the agent file, else in the current directory")
    Settings.client_arguments(where)
    tokens = commands.add_parser("tokens", parents=[where], help="named tokens for approvers and auditors")
    verbs = tokens.add_subparsers(dest="tokens_command", required=True)
    add = verbs.add_parser("add", parents=[where], help="a new token, printed once")
    add.add_argument("name", help="who holds it, as approvals will record (ada, ci-bot)")
    add.add_argument("--role", choices=ROLES, required=True,
                     help="approver: answers calls; auditor: reads the trail; admin: both")
    verbs.add_parser("list", parents=[where], help="the tokens in force: names and roles")
    revoke = verbs.add_parser("revoke", parents=[where], help="end a token: its holder is refused from now on")
    revoke.add_argument("name", help="the token's name")
    tokens.set_defaults(run=run)


def no_store_at(location: str) -> bool:
    """True, said on stderr, when no store is there to read: a command that only reads makes none (in the wrong
    folder it would make an empty one and say there is nothing in it)."""
    from toolkeeper.database import is_postgres_url

    if is_postgres_url(location) or Path(location).exists():
        return False
    print(f"toolkeeper: no store at {location}: name serve's store with --store, or its agent file with "
          "--agent-file (the store is next to it unless serve was given --store), or serve's --config",
          file=sys.stderr)
    return True


def run(args: argparse.Namespace) -> int:
    from toolkeeper.common import printable
    from toolkeeper.store import SchemaError, StoreError, open_store

    location = Settings.for_command(args).kept("store")
    # `add` makes the store (serve uses the same file, before or after); reading or revoking needs one there
    if args.tokens_command != "add" and no_store_at(location):
        return 2
    name = getattr(args, "name", None)
    if name is not None and (not NAME.fullmatch(name) or name == "admin"):
        print(f"toolkeeper: a token's name is 1 to 64 letters, digits, '.', '_', '@' or '-', and not 'admin' (the "
              f"admin token's): {printable(name)!r}", file=sys.stderr)
        return 2

    async def act() -> int:
        store = open_store(location)
        try:
            if args.tokens_command == "add":
                token = await store.add_token(args.name, args.role)
                print(f"{args.name} ({args.role}): {token}")
                print("keep it now: it is not shown again (the store keeps only its SHA-256)", file=sys.stderr)
            elif args.tokens_command == "list":
                for held in await store.list_tokens():
                    since = datetime.fromtimestamp(held["created"]).astimezone().isoformat(timespec="seconds")
                    print(printable(f"{held['name']}  {held['role']}  since {since}"))
            elif not await store.revoke_token(args.name):
                print(f"toolkeeper: no token named {printable(args.name)} in force", file=sys.stderr)
                return 1
            else:
                print(f"revoked {printable(args.name)}: its holder is refused from now on, its sessions ended")
            return 0
        finally:
            await store.close()

    try:
        return asyncio.run(act())
    except (StoreError, SchemaError, sqlite3.Error, OSError) as exc:
        print(f"toolkeeper: cannot use the store at {location}: {exc}", file=sys.stderr)
        return 2
