"""`toolkeeper audit`: what the agents ran, who allowed it, and what came out."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from toolkeeper.audit import STATUSES, AuditEntry, AuditError, open_audit

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def since(text: str | None) -> float | None:
    if not text:
        return None
    match = re.fullmatch(r"(\d+)([smhdw])", text.strip())
    if not match:
        raise SystemExit(f"toolkeeper: --since is a number and a unit, like 7d, 12h or 30m; got {text!r}")
    return time.time() - int(match.group(1)) * UNITS[match.group(2)]


def add_parser(commands: argparse._SubParsersAction) -> None:
    trail = argparse.ArgumentParser(add_help=False)
    trail.add_argument("--db", default=argparse.SUPPRESS,
                       help="the audit trail: serve's --audit (an SQLite file, or a postgresql:// URL); default "
                       "$TOOLKEEPER_AUDIT, else ./toolkeeper-audit.sqlite3")
    audit = commands.add_parser("audit", parents=[trail],
                                help="read the audit trail: list, show, tail, export, verify")
    audit.set_defaults(run=run)
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    listing = audit_commands.add_parser("list", parents=[trail], help="recent executions, one line each")
    export = audit_commands.add_parser("export", parents=[trail], help="every record, as JSON lines or CSV")
    for sub in (listing, export):
        sub.add_argument("--since", help="like 7d, 12h, 30m")
        sub.add_argument("--tool")
        sub.add_argument("--status", choices=STATUSES)
        sub.add_argument("--agent")
    export.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    audit_commands.add_parser("show", parents=[trail], help="one execution in full").add_argument("id")
    audit_commands.add_parser("tail", parents=[trail], help="follow new records as they are written")
    audit_commands.add_parser("verify", parents=[trail],
                              help="walk the hash chain; name the first record that does not match")


def line(record: AuditEntry) -> str:
    when = datetime.fromtimestamp(record.time).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    decided = record.decision or "-"
    by = record.decision_rule or record.decision_source or "-"
    duration = f"{record.duration_ms:.1f} ms"
    return (f"{record.record_id}  {when}  {record.status:<8} {record.tool:<16} "
            f"{decided}/{by:<22} {duration:>10}  agent {record.agent}")


def run(args: argparse.Namespace) -> int:
    args.db = getattr(args, "db", None) or os.environ.get("TOOLKEEPER_AUDIT") or "toolkeeper-audit.sqlite3"
    postgres = args.db.startswith(("postgresql://", "postgres://"))
    if not postgres and not Path(args.db).exists():
        print(f"toolkeeper: no audit database at {args.db}", file=sys.stderr)
        return 2
    try:
        audit = open_audit(args.db)
    except AuditError as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    try:
        if args.audit_command == "verify":
            intact, what = audit.verify()
            print(("intact: " if intact else "TAMPERED: ") + what)
            return 0 if intact else 1
        if args.audit_command == "show":
            record = audit.record(args.id)
            if record is None:
                print(f"toolkeeper: no record {args.id}", file=sys.stderr)
                return 1
            print(json.dumps(record.model_dump(), indent=2, ensure_ascii=False, sort_keys=True))
            return 0
        if args.audit_command == "tail":
            try:
                for event in audit.follow():
                    record = audit.record(event["record_id"]) or AuditEntry.model_validate(event)
                    print(f"{event['kind']:<9} {line(record)}", flush=True)
            except KeyboardInterrupt:
                return 0
        filters = {"since": since(args.since), "tool": args.tool, "status": args.status, "agent": args.agent}
        if args.audit_command == "export":
            sys.stdout.write(audit.export(args.format, **filters))
            return 0
        records = audit.records(**filters)
        for record in records:
            print(line(record))
        print(f"{len(records)} records")
        return 0
    finally:
        audit.close()
