"""`toolkeeper limits [--json]`, `toolkeeper limits reset ID [--scope KEY] [--as NAME]`.

Clients of the admin API, as `toolkeeper approvals` is (the same --url, config
file and $TOOLKEEPER_ADMIN_TOKEN): what each limit of the policy in force has
counted in its window, scope by scope, and a count cleared (admin role;
recorded in the trail). Every value shown has its control characters
escaped: a scope holds a user's name.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from urllib.parse import quote

from toolkeeper.cli.approvals import Server, _call, admin_options, server
from toolkeeper.common import printable

LIMITS = "/toolkeeper/limits"


def add_parser(commands: argparse._SubParsersAction) -> None:
    limits = commands.add_parser("limits", parents=[admin_options()],
                                 help="what each limit has counted in its window; `limits reset ID`: clear a count")
    limits.add_argument("words", nargs="*", metavar="reset ID",
                        help="`reset ID`: clear the limit's count of one scope (--scope), or of every scope")
    limits.add_argument("--json", action="store_true", help="print the admin API's JSON instead of a table")
    limits.add_argument("--scope", metavar="KEY", help="reset: the scope whose count is cleared, as listed "
                        "(user=ada@example.com, agent=ci-bot, global); default: every scope's")
    limits.add_argument("--as", dest="approver", metavar="NAME",
                        help="reset: who resets, in the record (default: your user name; a named token or a person "
                        "records their own name)")
    limits.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    words = args.words
    if not words:
        return list_command(server(args), as_json=args.json)
    if words[0] == "reset" and len(words) == 2:
        return reset_command(server(args), words[1], args.scope, args.approver, as_json=args.json)
    print("toolkeeper: usage: toolkeeper limits [--json], or toolkeeper limits reset ID [--scope KEY]",
          file=sys.stderr)
    return 2


def amount(value: float) -> str:
    """An amount as people read it: 1843200, not 1.8432e+06."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}".rstrip("0")


def rows(limits: list[dict]) -> list[tuple[str, ...]]:
    """One row per scope with a count (a limit with none: one row, scope `-`): limit, scope, used/max, window,
    effect."""
    found = []
    for limit in limits:
        unit = "s" if limit["counts"] == "run_time" else ""
        window = f"{limit['per']} ({limit['counts']}, by {'+'.join(limit['scope'])})"
        for scope in limit["scopes"] or [{"scope": "-", "used": 0, "full": False}]:
            used = f"{amount(scope['used'])}{unit}/{amount(limit['max'])}{unit}" + (" full" if scope["full"] else "")
            found.append((limit["id"], scope["scope"], used, window, limit["effect"]))
        if limit["scopes_counted"] > len(limit["scopes"]):
            found.append((limit["id"], f"... {limit['scopes_counted'] - len(limit['scopes'])} more", "", "", ""))
    return found


def list_command(at: Server, *, as_json: bool = False) -> int:
    limits = _call(at, LIMITS)["limits"]
    if as_json:
        print(json.dumps({"limits": limits}, indent=2))
        return 0
    if not limits:
        print("the policy in force declares no limits")
        return 0
    table = [("LIMIT", "SCOPE", "USED/MAX", "WINDOW", "EFFECT"),
             *(tuple(printable(str(cell)) for cell in row) for row in rows(limits))]
    widths = [max(len(row[column]) for row in table) for column in range(4)]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])
    return 0


def reset_command(at: Server, limit_id: str, scope: str | None, approver: str | None, *,
                  as_json: bool = False) -> int:
    body = {"approver": approver or getpass.getuser(), **({"scope": scope} if scope else {})}
    done = _call(at, f"{LIMITS}/{quote(limit_id, safe='')}/reset", "POST", body)
    if as_json:
        print(json.dumps(done, indent=2))
        return 0
    if scope:
        print(printable(f"{limit_id}: the count of {scope} reset (it had used {amount(done['used'])}); recorded "
                        f"as {done['record_id']}"))
    else:
        print(printable(f"{limit_id}: every scope's count reset ({done['scopes']} scopes had used "
                        f"{amount(done['used_total'])} in all); recorded as {done['record_id']}"))
    return 0
