"""`toolkeeper approvals [--always]`, `approve ID [--always]`, `deny ID [--reason]`, `revoke ID`.

Clients of the admin API, finding serve the way serve finds its settings: the
server is the one at --url, else the host and port of serve's --config file and
TOOLKEEPER_* variables; the token is $TOOLKEEPER_ADMIN_TOKEN (or its _FILE, or
`admin_token_file:` in the config file). Every value shown has its control characters
escaped: what the model wrote cannot rewrite the lines above it.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from toolkeeper.common import printable
from toolkeeper.settings import TOKEN_VARIABLE, Settings

APPROVALS = "/toolkeeper/approvals"


def admin_options() -> argparse.ArgumentParser:
    """The options of every client of the admin API (a parent parser): where serve is, and its config file."""
    default_url = Settings().local_url
    admin = argparse.ArgumentParser(add_help=False)
    admin.add_argument("--url", help=f"toolkeeper's address (default: the host and port of --config and "
                       f"$TOOLKEEPER_HOST/PORT, else {default_url}); the token comes from ${TOKEN_VARIABLE}")
    Settings.client_arguments(admin)
    return admin


def add_parser(commands: argparse._SubParsersAction) -> None:
    admin = admin_options()
    listing = commands.add_parser("approvals", parents=[admin], help="list the calls waiting for approval")
    listing.add_argument("--always", action="store_true", help="list the always grants in force instead")
    listing.set_defaults(run=lambda args: grants_command(server(args)) if args.always else list_command(server(args)))
    revoke = commands.add_parser("revoke", parents=[admin], help="revoke an always grant")
    revoke.add_argument("id", help="the grant's id, as `toolkeeper approvals --always` lists it (al_...)")
    revoke.set_defaults(run=lambda args: revoke_command(server(args), args.id))
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
            server(args), args.id, args.command, always=getattr(args, "always", False),
            reason=getattr(args, "reason", None), approver=args.approver))


@dataclass(frozen=True)
class Server:
    url: str
    token: str


def server(args: argparse.Namespace) -> Server:
    settings = Settings.for_command(args)
    return Server((args.url or settings.local_url).rstrip("/"), settings.admin_token or "")


def _call(at: Server, path: str, method: str = "GET", body: dict | None = None) -> dict:
    url = at.url + path
    if not url.startswith(("http://", "https://")):
        raise SystemExit(f"toolkeeper: --url must be an http:// or https:// address, not {at.url!r}")
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {at.token}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, method=method, data=data, headers=headers)  # noqa: S310 - http(s), checked
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            detail = json.loads(detail).get("error", detail)
        if exc.code == 401 and not at.token:  # the likely cause first: no token was given at all
            detail = (f"no admin token is set here (TOOLKEEPER_ADMIN_TOKEN, its _FILE, or the config file's "
                      f"admin_token_file:), and serve asks for one: {detail}")
        raise SystemExit(printable(f"toolkeeper: {exc.code}: {detail}")) from None
    except urllib.error.URLError as exc:
        raise SystemExit(f"toolkeeper: cannot reach {at.url}: {exc.reason} (serve's address: --url, or its --config, "
                         "or $TOOLKEEPER_HOST and $TOOLKEEPER_PORT)") from None


def list_command(at: Server) -> int:
    waiting = _call(at, APPROVALS)["approvals"]
    if not waiting:
        print("nothing waits for approval")
        return 0
    for approval in waiting:
        arguments = ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                              for k, v in approval["arguments"].items())
        why = f"rule {approval['rule']}: {approval['why']}" if approval.get("rule") else approval.get("why") or "?"
        header = f" ({approval['agent_header']})" if approval.get("agent_header") else ""
        user = approval_user(approval)
        header += f" for {user}" if user else ""
        print(printable(f"{approval['id']}  {approval['tool']}({arguments})  argv {json.dumps(approval['argv'])}"))
        left = f", {approval['left']:.0f} s left" if approval.get("left") is not None else ""
        print(printable(f"    why: {why}; agent {approval['agent']}{header}; waiting {approval['age']:.0f} s{left}"))
    return 0


def approval_user(approval: dict) -> str | None:
    """Whom a waiting call is for, when serve noted it (`principal_user`, or the call's `principal`)."""
    principal = approval.get("principal")
    user = approval.get("principal_user") or (principal.get("user") if isinstance(principal, dict) else None)
    return str(user) if user else None


def grants_command(at: Server) -> int:
    grants = _call(at, APPROVALS + "/always")["grants"]
    if not grants:
        print("no always grant is in force")
    for grant in grants:
        when = datetime.fromtimestamp(grant["created"]).astimezone().strftime("%Y-%m-%d %H:%M %Z")
        print(printable(f"{grant['id']}  {grant['tool']} always allowed for {grant['agent']}, "
                        f"by {grant['approver']} since {when}"))
    return 0


def revoke_command(at: Server, grant_id: str) -> int:
    _call(at, f"{APPROVALS}/always/{grant_id}/revoke", "POST", {})
    print(f"{printable(grant_id)}: revoked")
    return 0


def answer_command(at: Server, approval_id: str, verb: str, *, always: bool = False, reason: str | None = None,
                   approver: str | None = None) -> int:
    body: dict[str, Any] = {"approver": approver or getpass.getuser()}
    if always:
        body["always"] = True
    if reason:
        body["reason"] = reason
    result = _call(at, f"{APPROVALS}/{approval_id}/{verb}", "POST", body)
    if result.get("note"):
        suffix = f" ({result['note']})"
    elif result.get("granted"):
        suffix = f" (and {result['tool']} is now always allowed for {result['agent']}: grant {result['granted']})"
    else:
        suffix = ""
    print(printable(f"{approval_id}: {result['status']} by {result['approver']}{suffix}"))
    return 0
