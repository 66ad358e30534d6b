"""The store's tables, as numbered migrations: one schema, two dialects (SQLite and PostgreSQL).

Each process applies the missing steps at start, one process at a time (an
exclusive transaction in SQLite, an advisory lock in PostgreSQL), so replicas
and workers starting together never race; a store migrated by a newer
toolkeeper is refused rather than misread. `{real}` and `{blob}` are the
dialect's types.
"""

from __future__ import annotations

from collections.abc import Callable

VERSION_TABLE = "CREATE TABLE IF NOT EXISTS toolkeeper_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
COMPONENT = "store"

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the tables of the first releases (an unversioned file adopts this step as it is)
    (
        """CREATE TABLE IF NOT EXISTS exchanges (
            key TEXT PRIMARY KEY,       -- tenant, conversation and the message the agent received
            loose_key TEXT NOT NULL,    -- tenant and the message alone: tells an edited history from none
            body {blob},                -- NULL once expired: kept a while longer so a miss can be told
            expires {real} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS exchanges_loose ON exchanges (loose_key)",
        """CREATE TABLE IF NOT EXISTS links (
            key TEXT PRIMARY KEY,       -- tenant and an id the agent received (a response id, a forwarded call)
            value {blob} NOT NULL,      -- what it stands for
            expires {real} NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS call_results (
            key TEXT PRIMARY KEY, answer TEXT NOT NULL, expires {real} NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS approvals (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            tool TEXT NOT NULL,
            args_hash TEXT NOT NULL,    -- SHA-256 of the canonical arguments: an approval is for these only
            body {blob} NOT NULL,       -- what the person is shown: arguments, argv, why it asks, created
            status TEXT NOT NULL,       -- waiting | approved | denied | expired | used
            approver TEXT,
            reason TEXT,                -- the approver's, when denied
            updated {real} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS approvals_call ON approvals (agent, tool, args_hash, status)",
        """CREATE TABLE IF NOT EXISTS always_grants (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            tool TEXT NOT NULL,
            approver TEXT NOT NULL,
            created {real} NOT NULL,
            revoked {real})             -- a grant answers calls until revoked""",
    ),
    # 2: the retry memo says "still running" (whose, until when), for retries landing on another process;
    #    an always grant's id is a column, so answering is one statement
    (
        "DROP TABLE call_results",  # a cache of seconds: nothing worth converting
        """CREATE TABLE call_results (
            key TEXT PRIMARY KEY,       -- tenant, request body and the call
            answer TEXT,                -- NULL while the first attempt runs
            owner TEXT NOT NULL,        -- the attempt that runs it
            lease {real} NOT NULL,      -- past it, an unfinished attempt is presumed dead
            expires {real} NOT NULL)""",
        "ALTER TABLE approvals ADD COLUMN granted TEXT",
    ),
    # 3: the purge finds what expired without reading every row
    (
        "CREATE INDEX IF NOT EXISTS exchanges_expires ON exchanges (expires)",
        "CREATE INDEX IF NOT EXISTS links_expires ON links (expires)",
        "CREATE INDEX IF NOT EXISTS call_results_expires ON call_results (expires)",
    ),
    # 4: named tokens, each with a role: an approval records who answered
    (
        """CREATE TABLE IF NOT EXISTS tokens (
            name TEXT PRIMARY KEY,
            role TEXT NOT NULL,         -- approver | auditor | admin
            token_sha256 TEXT NOT NULL UNIQUE,  -- the token itself is shown once, never kept
            created {real} NOT NULL,
            revoked {real})""",
    ),
    # 5: the definitions of the agent's MCP servers' tools, pinned the first time they were seen
    (
        """CREATE TABLE IF NOT EXISTS mcp_pins (
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            digest TEXT NOT NULL,       -- SHA-256 of the approved definition (name, description, schema)
            definition {blob} NOT NULL, -- the approved definition, to show what changed
            seen_digest TEXT NOT NULL,  -- the definition the server gives now: another digest is withheld
            seen_definition {blob} NOT NULL,
            approver TEXT,              -- who took the definition in force (none: the first one seen)
            updated {real} NOT NULL,
            PRIMARY KEY (server, tool))""",
    ),
    # 6: people signed in through the OpenID provider: their console sessions, the sign-ins under way, and the
    #    identity an approval and an always grant were given with
    (
        """CREATE TABLE IF NOT EXISTS console_sessions (
            key_sha256 TEXT PRIMARY KEY, -- SHA-256 of the session cookie: the cookie itself is never kept
            issuer TEXT NOT NULL,
            subject TEXT NOT NULL,
            person {blob} NOT NULL,     -- name, email, username, groups and roles, as last read from the provider
            sealed {blob},              -- the refresh and ID tokens, encrypted with a key only the cookie gives
            created {real} NOT NULL,
            refreshed {real} NOT NULL,  -- when the groups were last read from the provider
            refreshing {real},          -- a process reading them again holds this lease
            expires {real} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS console_sessions_expires ON console_sessions (expires)",
        """CREATE TABLE IF NOT EXISTS console_sign_ins (
            state_sha256 TEXT PRIMARY KEY, -- SHA-256 of the `state` sent to the provider
            body {blob} NOT NULL,       -- the nonce, the PKCE verifier, the browser's binding, where to go after
            expires {real} NOT NULL)""",
        "ALTER TABLE approvals ADD COLUMN approver_identity {blob}",  # who answered, as the provider vouched
        "ALTER TABLE always_grants ADD COLUMN approver_identity {blob}",
    ),
    # 7: the agents' sessions (sessions.py): the calls decided in each, and the labels they brought
    (
        """CREATE TABLE IF NOT EXISTS flow_sessions (
            id TEXT PRIMARY KEY,        -- a hash the door makes: tenant and conversation, hook or MCP session
            calls INTEGER NOT NULL,     -- calls decided in it
            started {real} NOT NULL,    -- when it began (again, if it had lapsed): older labels are not its own
            expires {real} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS flow_sessions_expires ON flow_sessions (expires)",
        """CREATE TABLE IF NOT EXISTS flow_labels (
            session TEXT NOT NULL,
            label TEXT NOT NULL,
            record_id TEXT NOT NULL,    -- the call that brought it, in the audit trail
            tool TEXT NOT NULL,
            time TEXT NOT NULL,         -- the call's, as the policy input shows it
            added {real} NOT NULL,
            PRIMARY KEY (session, label, record_id))""",
    ),
    # 8: limits (limits.py): what each limit counted, by scope, in buckets of its window; and where the asks went
    (
        """CREATE TABLE IF NOT EXISTS limit_scopes (
            limit_id TEXT NOT NULL,
            scope TEXT NOT NULL,        -- whose count: `global`, `user=ada@example.com`, `agent=ci,tool=deploy`
            touched {real} NOT NULL,    -- the row a reservation locks, so two replicas take turns on one count
            PRIMARY KEY (limit_id, scope))""",
        """CREATE TABLE IF NOT EXISTS limit_counts (
            limit_id TEXT NOT NULL,
            scope TEXT NOT NULL,
            ends BIGINT NOT NULL,       -- the end of the bucket, in epoch seconds: counted while it is in the window
            amount BIGINT NOT NULL,     -- calls, tokens, or milliseconds of run time
            PRIMARY KEY (limit_id, scope, ends))""",
        "CREATE INDEX IF NOT EXISTS limit_counts_ends ON limit_counts (ends)",
        """CREATE TABLE IF NOT EXISTS notify_deliveries (
            approval_id TEXT NOT NULL,
            channel TEXT NOT NULL,
            status TEXT NOT NULL,       -- sending, delivered, failed
            attempts INTEGER NOT NULL,
            error TEXT,                 -- the last failure, as the log says it
            updated {real} NOT NULL,
            PRIMARY KEY (approval_id, channel))""",
        "CREATE INDEX IF NOT EXISTS notify_deliveries_updated ON notify_deliveries (updated)",
    ),
)
VERSION = len(MIGRATIONS)


class SchemaError(Exception):
    pass


def migrate(run: Callable[[str, tuple], list[tuple]], real: str, blob: str) -> int:
    """Bring the store to VERSION with `run(sql, params) -> rows`, inside the caller's exclusive transaction:
    the version it found."""
    run(VERSION_TABLE, ())
    found = run("SELECT version FROM toolkeeper_schema WHERE component = ?", (COMPONENT,))
    version = found[0][0] if found else 0
    for statement in steps_after(version, real, blob):
        run(statement, ())
    run("INSERT INTO toolkeeper_schema (component, version) VALUES (?, ?) ON CONFLICT (component) DO UPDATE "
        "SET version = excluded.version", (COMPONENT, VERSION))
    return version


def steps_after(version: int, real: str, blob: str) -> list[str]:
    """The statements that bring a store at `version` to the current one."""
    if version > VERSION:
        raise SchemaError(f"the store was migrated by a newer toolkeeper (schema version {version}; this one "
                          f"knows {VERSION}): upgrade toolkeeper, or point --store elsewhere")
    return [statement.format(real=real, blob=blob) for step in MIGRATIONS[version:] for statement in step]
