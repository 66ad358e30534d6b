"""The approvals channel: a gated call waits for a person, who answers from anywhere.

    toolkeeper approvals                  what waits: tool, arguments, argv, agent, age
    toolkeeper approve ap_7KQ2M4XD [--always]
    toolkeeper deny ap_7KQ2M4XD [--reason "not today"]

The commands call the admin API (`/toolkeeper/approvals`, on toolkeeper's own
port, behind the token in TOOLKEEPER_ADMIN_TOKEN). Waiting calls and "always"
answers live in the store, so a restart loses nothing: an approval given after
the call's request died is used by the same agent's next identical call.

An approval is for one agent, one tool and the SHA-256 of its canonical
arguments: approving one call never approves different arguments. "Always"
remembers the tool ("always allow this script"), whatever its arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
import urllib.error
import urllib.request
from typing import Any

import orjson
from aiohttp import web

from proxy.consent import ConsentAnswer, ConsentRequest
from proxy.store import SQLiteStore

log = logging.getLogger("toolkeeper")

TOKEN_VARIABLE = "TOOLKEEPER_ADMIN_TOKEN"  # noqa: S105 - the variable's name, not a token
PREFIX = "/toolkeeper/approvals"
ID_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read aloud and typed by people


def arguments_hash(arguments: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)).hexdigest()


def new_approval_id() -> str:
    return "ap_" + "".join(secrets.choice(ID_ALPHABET) for _ in range(8))


class ApprovalsConsent:
    can_ask = True

    def __init__(self, store: SQLiteStore, timeout: float = 300, poll: float = 0.25):
        self.store = store
        self.timeout = timeout
        self.poll = poll
        self._answered: dict[str, asyncio.Event] = {}  # wakes a waiting call at once when this process answers

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        approver = self.store.always_allowed(request.tool)
        if approver:
            return ConsentAnswer(True, approver, f"{request.tool} is always allowed")
        args_hash = arguments_hash(request.arguments)
        given = self.store.find_approval(request.agent, request.tool, args_hash, ("approved",))
        if given and self.store.settle_approval(given["id"], "used", None, None, only_from=("approved",)):
            return ConsentAnswer(True, given["approver"] or "approvals", "approved while no request waited")
        approval = self.store.find_approval(request.agent, request.tool, args_hash, ("waiting",))
        if approval is None:
            approval = {"id": new_approval_id(), "agent": request.agent, "tool": request.tool,
                        "args_hash": args_hash, "arguments": request.arguments, "argv": request.argv,
                        "created": time.time(), "status": "waiting"}
            self.store.add_approval(approval)
        log.warning("waiting for approval %s: %s (toolkeeper approve %s, or deny)", approval["id"],
                    request.summary(), approval["id"])
        return await self._wait(approval["id"])

    async def _wait(self, approval_id: str) -> ConsentAnswer:
        deadline = time.monotonic() + self.timeout
        event = self._answered.setdefault(approval_id, asyncio.Event())
        try:
            while True:
                current = self.store.get_approval(approval_id)
                if current is None:
                    return ConsentAnswer(False, "approvals", "the approval disappeared from the store")
                if current["status"] == "approved":
                    self.store.settle_approval(approval_id, "used", None, None, only_from=("approved",))
                    return ConsentAnswer(True, current["approver"] or "approvals", f"approved ({approval_id})")
                if current["status"] in ("denied", "expired", "used"):
                    return ConsentAnswer(False, current["approver"] or "approvals",
                                         current["reason"] or f"the request was {current['status']}")
                left = deadline - time.monotonic()
                if left <= 0:
                    self.store.settle_approval(approval_id, "expired", None, f"no answer within {self.timeout:g} s")
                    return ConsentAnswer(False, "approvals", f"no one answered within {self.timeout:g} s")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), min(self.poll, left))  # other replicas: the poll
                event.clear()
        finally:
            self._answered.pop(approval_id, None)

    def answered(self, approval_id: str) -> None:
        event = self._answered.get(approval_id)
        if event is not None:
            event.set()


def add_admin_routes(app: web.Application, store: SQLiteStore, token: str,
                     channel: ApprovalsConsent | None) -> None:
    """The admin API under /toolkeeper/approvals, behind a bearer token."""

    def authorized(request: web.Request) -> bool:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        return bool(token) and hmac.compare_digest(given.encode(), token.encode())

    def refuse() -> web.Response:
        message = f"a valid admin token is required (Authorization: Bearer ${TOKEN_VARIABLE})"
        return web.json_response({"error": message}, status=401)

    async def listing(request: web.Request) -> web.Response:
        if not authorized(request):
            return refuse()
        now = time.time()
        waiting = [{**a, "age": round(now - a["created"], 1)} for a in store.list_approvals("waiting")]
        return web.json_response({"approvals": waiting})

    async def answer(request: web.Request) -> web.Response:
        if not authorized(request):
            return refuse()
        approval_id, verb = request.match_info["id"], request.match_info["verb"]
        try:
            body = await request.json() if request.body_exists else {}
        except json.JSONDecodeError:
            return web.json_response({"error": "the body must be JSON"}, status=400)
        approval = store.get_approval(approval_id)
        if approval is None:
            return web.json_response({"error": f"no approval {approval_id}"}, status=404)
        approver = str(body.get("approver") or "admin")
        if verb == "approve":
            moved = store.settle_approval(approval_id, "approved", approver, None)
            if moved and body.get("always"):
                store.allow_always(approval["tool"], approver)
        else:
            moved = store.settle_approval(approval_id, "denied", approver, str(body.get("reason") or "denied by "
                                                                              + approver))
        if not moved:
            return web.json_response({"error": f"{approval_id} is {approval['status']}, not waiting"}, status=409)
        if channel is not None:
            channel.answered(approval_id)
        log.info("approval %s: %s by %s", approval_id, verb, approver)
        return web.json_response(store.get_approval(approval_id))

    app.router.add_get(PREFIX, listing)
    app.router.add_post(PREFIX + "/{id}/{verb:approve|deny}", answer)


# -- the command line: a client of the admin API ----------------------------------------

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
        raise SystemExit(f"toolkeeper: {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise SystemExit(f"toolkeeper: cannot reach {url}: {exc.reason}") from None


def list_command(base: str) -> int:
    waiting = _call(base.rstrip("/") + PREFIX)["approvals"]
    if not waiting:
        print("nothing waits for approval")
        return 0
    for approval in waiting:
        arguments = ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                              for k, v in approval["arguments"].items())
        print(f"{approval['id']}  {approval['tool']}({arguments})  argv {json.dumps(approval['argv'])}  "
              f"agent {approval['agent']}  waiting {approval['age']:.0f} s")
    return 0


def answer_command(base: str, approval_id: str, verb: str, *, always: bool = False, reason: str | None = None,
                   approver: str | None = None) -> int:
    body: dict[str, Any] = {"approver": approver or getpass.getuser()}
    if always:
        body["always"] = True
    if reason:
        body["reason"] = reason
    result = _call(f"{base.rstrip('/')}{PREFIX}/{approval_id}/{verb}", "POST", body)
    suffix = f" (and {result['tool']} is now always allowed)" if always else ""
    print(f"{approval_id}: {result['status']} by {result['approver']}{suffix}")
    return 0
