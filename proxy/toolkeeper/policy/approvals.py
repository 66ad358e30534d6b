"""The approvals channel: a gated call waits for a person, who answers from anywhere.

    toolkeeper approvals                  what waits: tool, arguments, argv, agent, age
    toolkeeper approve ap_7KQ2M4XD [--always]
    toolkeeper deny ap_7KQ2M4XD [--reason "not today"]

The commands call the admin API (`/toolkeeper/approvals`, on toolkeeper's own
port, behind the token in TOOLKEEPER_ADMIN_TOKEN). Waiting calls and "always"
answers live in the store, so a restart loses nothing, and an answer given to
any replica or worker releases the call wherever it waits: an approval given
after the call's request died is used by the same agent's next identical call.

An approval is for one agent, one tool and the SHA-256 of its canonical
arguments: approving one call never approves different arguments. "Always"
grants one agent one tool ("always allow this script"), whatever its
arguments, until revoked (`toolkeeper approvals --always`, `toolkeeper revoke
ID`); it never lifts a security rule's ask: approved --always, such a call is
approved once.

Four eyes: a call asked for on behalf of a person (its principal's user) is
never approved by that same person, whether they answer it, gave the always
grant that would answer it, or approved an identical call of another user's.
So an approval is also for one user: its key holds the user with the
arguments. Denying one's own call is allowed: it only takes away.

A new waiting call is announced (`announce`, given by the composition root:
the notifier that sends it to the policy's `notify:` channels) once, when it
is added; an identical call that joins it is not announced again. The
announcement only schedules work: it never waits for a channel, and no
failure of one reaches the ask.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from toolkeeper.common import canonical_json, sha256_hex
from toolkeeper.policy.consent import ConsentAnswer, ConsentRequest
from toolkeeper.store import Store, StoreError, new_id

log = logging.getLogger("toolkeeper")

# What an announcement holds: the waiting call as a person may see it (its arguments and argv already redacted)
ANNOUNCED = ("id", "agent", "tool", "arguments", "argv", "why", "rule", "source", "principal_user", "created",
             "expires")
Announce = Callable[[dict[str, Any]], None]

def arguments_hash(arguments: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(arguments))


def same_person(user: str | None, user_issuer: str | None, approver: str,
                identity: dict[str, Any] | None = None) -> bool:
    """Whether the one answering is the person the call is for: the same issuer and subject, or the call's user
    equal to their subject, email or username (a named token's or `--as` name when no provider vouched for them),
    whatever the letters' case (mail systems and directories ignore it)."""
    if not user:
        return False
    if identity and user_issuer and identity.get("issuer") == user_issuer and identity.get("subject") == user:
        return True
    names = (identity.get("subject"), identity.get("email"), identity.get("username")) if identity else (approver,)
    return any(isinstance(name, str) and name.casefold() == user.casefold() for name in names)


def four_eyes_refusal(approval: dict[str, Any], approver: str, identity: dict[str, Any] | None) -> str | None:
    """Why `approver` may not approve this waiting call (it was asked for on their behalf), or None."""
    if not same_person(approval.get("principal_user"), approval.get("principal_issuer"), approver, identity):
        return None
    return (f"{approval['id']} was asked for on behalf of {approval['principal_user']}, who may not approve it "
            "(four eyes): another approver must; they may deny it")


def approval_key(request: ConsentRequest) -> str:
    """What an approval is for: the exact arguments, and the person the call acts for when it names one."""
    if not request.user:
        return request.args_hash
    return sha256_hex(canonical_json([request.args_hash, request.user_issuer, request.user]))


class ApprovalsConsent:
    can_ask = True

    def __init__(self, store: Store, timeout: float = 300, announce: Announce | None = None):
        self.store = store
        self.timeout = timeout
        self.announce = announce  # told of each new waiting call (the notifier); never waited for

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        try:
            return await self._ask(request)
        except StoreError as exc:  # fail closed: no answer can be read, so none is assumed
            return ConsentAnswer(False, "approvals", f"the approvals store did not answer: {exc}")

    async def _ask(self, request: ConsentRequest) -> ConsentAnswer:
        store, key = self.store, approval_key(request)
        grant = None if request.rule_asks else await store.grant_for(request.agent, request.tool)
        if grant and not same_person(request.user, request.user_issuer, grant["approver"],
                                     grant.get("approver_identity")):
            return ConsentAnswer(True, grant["approver"], f"{request.tool} is always allowed for {request.agent} "
                                                          f"({grant['id']})", always=True,
                                 approver_identity=grant.get("approver_identity"))
        given = await store.find_approval(request.agent, request.tool, key, ("approved",))
        if given and await store.settle_approval(given["id"], "used", None, None, only_from=("approved",)):
            return ConsentAnswer(True, given["approver"] or "approvals", "approved while no request waited",
                                 approver_identity=given.get("approver_identity"))
        while True:  # an identical call waiting beside this one shares its approval; one approval runs one call
            approval = await store.find_approval(request.agent, request.tool, key, ("waiting",))
            if approval is None:
                approval = {"id": new_id("ap_"), "agent": request.agent, "tool": request.tool,
                            "args_hash": key, "arguments": request.arguments, "argv": request.argv,
                            "created": time.time(), "expires": time.time() + self.timeout, "status": "waiting",
                            "why": request.reason, "rule": request.rule, "source": request.source,
                            "agent_header": request.agent_header, "principal_user": request.user,
                            "principal_issuer": request.user_issuer}
                await store.add_approval(approval)
                self._announce(approval)
            log.warning("waiting for approval %s: %s, because %s (toolkeeper approve %s, or deny)", approval["id"],
                        request.summary(), request.why(), approval["id"])
            answer = await self._wait(approval["id"])
            if answer is not None:
                return answer

    def _announce(self, approval: dict[str, Any]) -> None:
        if self.announce is None:
            return
        try:
            self.announce({key: approval.get(key) for key in ANNOUNCED})
        except Exception:  # a notifier's bug: the ask goes on (it times out to deny as it would have), logged
            log.exception("announcing approval %s failed", approval["id"])

    async def _wait(self, approval_id: str) -> ConsentAnswer | None:
        """Until the approval moves (answered here, on another replica, or its time runs out); None when another
        call took it (an identical call waiting beside this one): this one must ask anew."""
        deadline = time.monotonic() + self.timeout
        while True:
            current = await self.store.get_approval(approval_id)
            if current is None:
                return ConsentAnswer(False, "approvals", "the approval disappeared from the store")
            if current["status"] == "used":
                return None
            if current["status"] == "approved":
                if not await self.store.settle_approval(approval_id, "used", None, None, only_from=("approved",)):
                    return None  # taken between the look and the claim
                return ConsentAnswer(True, current["approver"] or "approvals", f"approved ({approval_id})",
                                     always=bool(current.get("granted")),
                                     approver_identity=current.get("approver_identity"))
            if current["status"] in ("denied", "expired"):
                return ConsentAnswer(False, current["approver"] or "approvals",
                                     current["reason"] or f"the request was {current['status']}",
                                     approver_identity=current.get("approver_identity"))
            left = deadline - time.monotonic()
            if left <= 0:
                await self.store.settle_approval(approval_id, "expired", None, f"no answer within {self.timeout:g} s")
                return ConsentAnswer(False, "approvals", f"no one answered within {self.timeout:g} s")
            await self.store.approval_moved(approval_id, left)
