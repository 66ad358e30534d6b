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
"""

from __future__ import annotations

import logging
import time
from typing import Any

from toolkeeper.common import canonical_json, sha256_hex
from toolkeeper.policy.consent import ConsentAnswer, ConsentRequest
from toolkeeper.store import Store, StoreError, new_id

log = logging.getLogger("toolkeeper")

def arguments_hash(arguments: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(arguments))


class ApprovalsConsent:
    can_ask = True

    def __init__(self, store: Store, timeout: float = 300):
        self.store = store
        self.timeout = timeout

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        try:
            return await self._ask(request)
        except StoreError as exc:  # fail closed: no answer can be read, so none is assumed
            return ConsentAnswer(False, "approvals", f"the approvals store did not answer: {exc}")

    async def _ask(self, request: ConsentRequest) -> ConsentAnswer:
        store = self.store
        grant = None if request.rule_asks else await store.grant_for(request.agent, request.tool)
        if grant:
            return ConsentAnswer(True, grant["approver"], f"{request.tool} is always allowed for {request.agent} "
                                                          f"({grant['id']})", always=True)
        given = await store.find_approval(request.agent, request.tool, request.args_hash, ("approved",))
        if given and await store.settle_approval(given["id"], "used", None, None, only_from=("approved",)):
            return ConsentAnswer(True, given["approver"] or "approvals", "approved while no request waited")
        while True:  # an identical call waiting beside this one shares its approval; one approval runs one call
            approval = await store.find_approval(request.agent, request.tool, request.args_hash, ("waiting",))
            if approval is None:
                approval = {"id": new_id("ap_"), "agent": request.agent, "tool": request.tool,
                            "args_hash": request.args_hash, "arguments": request.arguments, "argv": request.argv,
                            "created": time.time(), "expires": time.time() + self.timeout, "status": "waiting",
                            "why": request.reason,
                            "rule": request.rule, "source": request.source, "agent_header": request.agent_header}
                await store.add_approval(approval)
            log.warning("waiting for approval %s: %s, because %s (toolkeeper approve %s, or deny)", approval["id"],
                        request.summary(), request.why(), approval["id"])
            answer = await self._wait(approval["id"])
            if answer is not None:
                return answer

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
                                     always=bool(current.get("granted")))
            if current["status"] in ("denied", "expired"):
                return ConsentAnswer(False, current["approver"] or "approvals",
                                     current["reason"] or f"the request was {current['status']}")
            left = deadline - time.monotonic()
            if left <= 0:
                await self.store.settle_approval(approval_id, "expired", None, f"no answer within {self.timeout:g} s")
                return ConsentAnswer(False, "approvals", f"no one answered within {self.timeout:g} s")
            await self.store.approval_moved(approval_id, left)
