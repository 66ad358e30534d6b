"""`toolkeeper audit`: what the agents ran, who allowed it, and what came out."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from toolkeeper.audit import (
    FORMATS,
    SOURCES,
    STATUSES,
    AuditEntry,
    AuditError,
    DamagedTrail,
    SQLAudit,
    open_audit,
    principal_user,
)
from toolkeeper.common import TIME_GRAMMAR, counted, moment, printable
from toolkeeper.database import is_postgres_url
from toolkeeper.settings import Settings


def since(text: str | None, flag: str = "--since") -> float | None:
    """`7d` (that long ago) or an ISO time (`2026-11-30T09:00`, local unless it says its zone): seconds. The
    grammar is the console's too (`common.moment`)."""
    if not text:
        return None
    parsed = moment(text)
    if parsed is None:
        # exit 2, a usage error: `policy replay` exits 1 only for what a candidate would stop
        print(f"toolkeeper: {flag} is {TIME_GRAMMAR}; got {text!r}", file=sys.stderr)
        raise SystemExit(2) from None
    return parsed


def trail_arguments() -> argparse.ArgumentParser:
    """The options that find serve's trail, for every command that reads it."""
    trail = argparse.ArgumentParser(add_help=False)
    trail.add_argument("--db", "--audit", dest="audit", default=argparse.SUPPRESS,
                       help="the audit trail: serve's --audit (an SQLite file, or a postgresql:// URL); default "
                       "$TOOLKEEPER_AUDIT, else the config file's, else toolkeeper-audit.sqlite3 next to the agent "
                       "file, else in the current directory")
    Settings.client_arguments(trail)
    return trail


def open_trail(args: argparse.Namespace) -> SQLAudit | None:
    """serve's trail, as the options and settings name it; None when there is none (said on stderr)."""
    trail = Settings.for_command(args).kept("audit")
    if not is_postgres_url(trail) and not Path(trail).exists():
        print(f"toolkeeper: no audit trail at {trail}: name serve's trail with --db, or its agent file with "
              "--agent-file (the trail is next to it unless serve was given --audit), or serve's --config",
              file=sys.stderr)
        return None
    try:
        return open_audit(trail)
    except AuditError as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return None


def add_parser(commands: argparse._SubParsersAction) -> None:
    trail = trail_arguments()
    audit = commands.add_parser("audit", parents=[trail],
                                help="read the audit trail: list, show, tail, export, verify")
    audit.set_defaults(run=run)
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    listing = audit_commands.add_parser("list", parents=[trail], help="recent executions, one line each")
    export = audit_commands.add_parser("export", parents=[trail], help="every record, as JSON lines or CSV")
    for sub in (listing, export):
        sub.add_argument("--since", help="from this long ago, like 7d, 12h, 30m, or an ISO time (2026-11-30T09:00)")
        sub.add_argument("--until", help="until this long ago, or this ISO time (with --since: a time range)")
        sub.add_argument("--approver", help="only calls answered by this approver")
        sub.add_argument("--rule", help="only calls a security rule of this id decided")
        sub.add_argument("--shadow", choices=("deny", "ask", "allow"),
                         help="only calls a shadow rule would have denied (asked about, allowed)")
        sub.add_argument("--header", help="only calls whose identity header (serve --identity-header) says this")
        sub.add_argument("--tool", help="only calls of this tool")
        sub.add_argument("--status", choices=STATUSES, help="only calls in this state")
        sub.add_argument("--agent", help="only calls of this agent (its name, or the hash the records show)")
        sub.add_argument("--user", help="only calls made for this user (principal.user: an agent's token, or the "
                         "trusted identity header, named them)")
        sub.add_argument("--source", choices=SOURCES,
                         help="declared calls (toolkeeper ran them), or the agent's own (passed on or refused)")
        sub.add_argument("--decided-by", dest="decision_source",
                         help="only calls this decided: yolo, tiers, rules, opa, consent, ...")
        sub.add_argument("--request", dest="request_id", help="only the calls of this agent request (its id)")
        sub.add_argument("--search", help="only calls whose arguments contain this text")
    export.add_argument("--format", choices=FORMATS, default="jsonl",
                        help="jsonl (default), csv (times in ISO 8601 with their zone), opa (OPA decision log "
                        "events), or otel (OpenTelemetry spans, OTLP/JSON)")
    audit_commands.add_parser("show", parents=[trail], help="one execution in full").add_argument(
        "id", help="the record's id, as `audit list` shows it, or a unique start of it")
    following = audit_commands.add_parser("tail", parents=[trail], help="the last records, then follow new ones")
    following.add_argument("-n", type=int, default=10, metavar="N", help="how many of the last records first "
                           "(default 10; 0: only new ones)")
    verify = audit_commands.add_parser("verify", parents=[trail],
                                       help="walk the hash chain; name the first record that does not match")
    verify.add_argument("--expect-head", metavar="HASH",
                        help="the head hash noted earlier (`verify` prints it): a trail that lost its tail fails")


def line(record: AuditEntry) -> str:
    when = datetime.fromtimestamp(record.time).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    decided = record.decision or "-"
    by = record.decision_rule or record.decision_source or "-"
    duration = f"{record.duration_ms:.1f} ms"
    tool = record.tool if record.source == "declared" else f"{record.tool} ({record.source})"
    user = principal_user(record.policy_input)
    return printable(f"{record.record_id}  {when}  {record.status:<9} {tool:<16} "
                     f"{decided}/{by:<22} {duration:>10}  agent {record.agent}" + (f" for {user}" if user else ""))


def run(args: argparse.Namespace) -> int:
    audit = open_trail(args)
    if audit is None:
        return 2
    try:
        return COMMANDS[args.audit_command](audit, args)
    except DamagedTrail as exc:
        print(f"toolkeeper: {printable(str(exc))}", file=sys.stderr)
        return 1
    finally:
        audit.close()


def verify(audit: SQLAudit, args: argparse.Namespace) -> int:
    intact, what = audit.verify(expect_head=args.expect_head)
    print(("intact: " if intact else "TAMPERED: ") + what)
    return 0 if intact else 1


def show(audit: SQLAudit, args: argparse.Namespace) -> int:
    try:
        record = audit.record(args.id) or audit.record_by_prefix(args.id)
    except LookupError as exc:
        print(f"toolkeeper: {printable(str(exc))}", file=sys.stderr)
        return 1
    if record is None:
        print(f"toolkeeper: no record {printable(args.id)}", file=sys.stderr)
        return 1
    print(printable(json.dumps(record.model_dump(), indent=2, ensure_ascii=False, sort_keys=True),
                    keep_newlines=True))
    return 0


def tail(audit: SQLAudit, args: argparse.Namespace) -> int:
    """The last N calls, one line each, then every event as it is written."""
    try:
        head, _ = audit.head()  # first: nothing falls between the two
        for record in audit.records(limit=args.n, until_seq=head) if args.n > 0 else []:
            print(f"{record.kind:<9} {line(record)}", flush=True)
        for event in audit.follow(after_seq=head):
            record = audit.record(event["record_id"]) or AuditEntry.model_validate(event)
            print(f"{event['kind']:<9} {line(record)}", flush=True)
    except KeyboardInterrupt:
        pass
    return 0


def _filters(args: argparse.Namespace) -> dict:
    return {"since": since(args.since), "until": since(args.until, "--until"), "tool": args.tool,
            "status": args.status, "agent": args.agent, "user": args.user, "source": args.source,
            "approver": args.approver, "rule": args.rule, "header": args.header,
            "decision_source": args.decision_source, "request_id": args.request_id, "search": args.search,
            "shadow": args.shadow}


def export(audit: SQLAudit, args: argparse.Namespace) -> int:
    sys.stdout.write(audit.export(args.format, **_filters(args)))
    return 0


def listing(audit: SQLAudit, args: argparse.Namespace) -> int:
    records = audit.records(**_filters(args))
    for record in records:
        print(line(record))
    print(counted(len(records), "record"))
    return 0


COMMANDS = {"verify": verify, "show": show, "tail": tail, "export": export, "list": listing}
