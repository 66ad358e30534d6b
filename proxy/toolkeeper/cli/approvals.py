"""`toolkeeper approvals [--always]`, `approve ID [--always]`, `deny ID [--reason]`, `revoke ID`.

Clients of the admin API: the token comes from $TOOLKEEPER_ADMIN_TOKEN, the
server is the one at --url. Every value shown has its control characters
escaped: what the model wrote cannot rewrite the lines above it.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any

from toolkeeper.common import printable
from toolkeeper.settings import TOKEN_VARIABLE, Settings

APPROVALS = "/toolkeeper/approvals"


def add_parser(commands: argparse._SubParsersAction) -> None:
    default_url = f"http://{Settings.host}:{Settings.port}"
    admin = argparse.ArgumentParser(add_help=False)
    admin.add_argument("--url", default=default_url,
                       help=f"toolkeeper's address (default {default_url}); the token comes from ${TOKEN_VARIABLE}")
    listing = commands.add_parser("approvals", parents=[admin], help="list the calls waiting for approval")
    listing.add_argument("--always", action="store_true", help="list the always grants in force instead")
    listing.set_defaults(run=lambda args: grants_command(args.url) if args.always else list_command(args.url))
    revoke = commands.add_parser("revoke", parents=[admin], help="revoke an always grant")
    revoke.add_argument("id", help="the grant's id, as `toolkeeper approvals --always` lists it (al_...)")
    revoke.set_defaults(run=lambda args: revoke_command(args.url, args.id))
    approve = commands.add_parser("approve", parents=[admin], help="approve a waiting call")
    approve.add_argument("id", help="the waiting call's id, as `toolkeeper approvals` lists it (ap_...)")
    approve.add_argument("--always", action="store_true",
                         help="and always allow this agent this tool from now on (never when a security rule asked)")
    approve.add_argument("--as", dest="approver", help="who approves (default: your user name)")
    deny = commands.add_parser("deny", parents=[admin], help="deny a waiting call")
    deny.add_argument("id", help="the waiting call's id, as `toolkeeper approvals` lists it (ap_...)")
    deny.add_argument("--reason", help="what the model is told")
    deny.add_argument("--as", dest="approver", help="who denies (default: your user name)")
    for verb in (approve, deny):
        verb.set_defaults(run=lambda args: answer_command(
            args.url, args.id, args.command, always=getattr(args, "always", False),
            reason=getattr(args, "reason", None), approver=args.approver))


def _call(url: str, method: str = "GET", body: dict | None = None) -> dict:
    if not url.startswith(("http://", "https://")):
        raise SystemExit(f"toolkeeper: --url must be an http:// or https:// address, not {url!r}")
    token = os.environ.get(TOKEN_VARIABLE, "")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, method=method, data=data,  # noqa: S310 - http(s) only, checked above
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            detail = json.loads(detail).get("error", detail)
        raise SystemExit(printable(f"toolkeeper: {exc.code}: {detail}")) from None
    except urllib.error.URLError as exc:
        raise SystemExit(f"toolkeeper: cannot reach {url}: {exc.reason}") from None


def list_command(base: str) -> int:
    waiting = _call(base.rstrip("/") + APPROVALS)["approvals"]
    if not waiting:
        print("nothing waits for approval")
        return 0
    for approval in waiting:
        arguments = ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                              for k, v in approval["arguments"].items())
        why = f"rule {approval['rule']}: {approval['why']}" if approval.get("rule") else approval.get("why") or "?"
        header = f" ({approval['agent_header']})" if approval.get("agent_header") else ""
        print(printable(f"{approval['id']}  {approval['tool']}({arguments})  argv {json.dumps(approval['argv'])}"))
        left = f", {approval['left']:.0f} s left" if approval.get("left") is not None else ""
        print(printable(f"    why: {why}; agent {approval['agent']}{header}; waiting {approval['age']:.0f} s{left}"))
    return 0


def grants_command(base: str) -> int:
    grants = _call(base.rstrip("/") + APPROVALS + "/always")["grants"]
    if not grants:
        print("no always grant is in force")
    for grant in grants:
        when = datetime.fromtimestamp(grant["created"]).astimezone().strftime("%Y-%m-%d %H:%M %Z")
        print(printable(f"{grant['id']}  {grant['tool']} always allowed for {grant['agent']}, "
                        f"by {grant['approver']} since {when}"))
    return 0


def revoke_command(base: str, grant_id: str) -> int:
    _call(f"{base.rstrip('/')}{APPROVALS}/always/{grant_id}/revoke", "POST", {})
    print(f"{printable(grant_id)}: revoked")
    return 0


def answer_command(base: str, approval_id: str, verb: str, *, always: bool = False, reason: str | None = None,
                   approver: str | None = None) -> int:
    body: dict[str, Any] = {"approver": approver or getpass.getuser()}
    if always:
        body["always"] = True
    if reason:
        body["reason"] = reason
    result = _call(f"{base.rstrip('/')}{APPROVALS}/{approval_id}/{verb}", "POST", body)
    if result.get("note"):
        suffix = f" ({result['note']})"
    elif result.get("granted"):
        suffix = f" (and {result['tool']} is now always allowed for {result['agent']}: grant {result['granted']})"
    else:
        suffix = ""
    print(printable(f"{approval_id}: {result['status']} by {result['approver']}{suffix}"))
    return 0
