"""The security team's rules in Rego, evaluated by their OPA server.

toolkeeper posts the policy input to `POST /v1/data/<path>` (through
opa-python-client's async client) and reads the result as a decision:

    {"effect": "allow" | "deny" | "ask", "reason": "...", "rule": "id" | null,
     "flow": ["record id", ...]}                  # optional: the calls of the session that led to it

Anything else fails closed, with the cause logged: no `result` (the rule is
undefined), a status other than 200, no answer within the timeout (short: a
call waits on it), a body that is not such an object, a `flow` that is not a
list of strings. The decision id and the bundle revision OPA reports go into
the record.

Rego reads the call's `labels`, `session` and `secrets` in the input
(`"egress" in input.labels`, `input.session.has`), and a decision a flow
caused names its calls in `flow`, as a YAML rule's does (policies/flows.rego).
OPA is asked after the call is labelled, so labels and `secrets:` modes come
from the tools' declarations and the YAML label rules, never from OPA.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

from toolkeeper.policy.decision import Decision

log = logging.getLogger("toolkeeper")

DEFAULT_PATH = "toolkeeper/decision"


class OpaPolicy:
    def __init__(self, url: str, path: str = DEFAULT_PATH, timeout: float = 1.0, token: str | None = None):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"--opa-url must be an http:// or https:// address, like http://127.0.0.1:8181; "
                             f"got {url!r}")
        self.url = url
        self.path = path.strip("/")
        self.timeout = timeout
        package, _, rule = self.path.rpartition("/")
        self._package, self._rule = package or rule, rule if package else None
        # imported only when OPA is used: the client and `requests` under it cost every start 40 ms
        from opa_client.opa_async import AsyncOpaClient

        # retries=0: a call waits on this answer; the timeout is the whole budget
        self.client = AsyncOpaClient(host=parsed.hostname, port=parsed.port or (443 if parsed.scheme == "https"
                                                                                  else 8181),
                                     ssl=parsed.scheme == "https", token=token, retries=0, timeout=timeout)
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await self.client._init_session()  # the async client opens its session on `async with`
            self._started = True

    async def close(self) -> None:
        if self._started:
            await self.client.close_connection()
            self._started = False

    async def decide(self, document: dict[str, Any]) -> Decision:
        await self.start()
        try:
            answer = await asyncio.wait_for(
                self.client.query_rule(document, self._package, self._rule, {"provenance": "true"}), self.timeout)
        except TimeoutError:
            return self._closed(f"OPA did not answer within {self.timeout:g} s")
        except Exception as exc:
            return self._closed(f"OPA failed: {_cause(exc)}")
        if not isinstance(answer, dict) or "result" not in answer:
            return self._closed(f"OPA has no decision at data/{self.path} for this input (undefined)")
        result = answer["result"]
        if not isinstance(result, dict) or result.get("effect") not in ("allow", "deny", "ask"):
            return self._closed(f"OPA's decision is not an effect object: {str(result)[:200]}")
        flow = result.get("flow") or []
        if not isinstance(flow, list) or not all(isinstance(one, str) for one in flow):
            return self._closed(f"OPA's decision has a flow that is not a list of record ids: {str(flow)[:200]}")
        bundles = (answer.get("provenance") or {}).get("bundles") or {}
        revision = ",".join(f"{name}@{b.get('revision')}" for name, b in sorted(bundles.items())) or None
        return Decision(result["effect"], "opa", str(result.get("reason") or ""), result.get("rule"), revision,
                        answer.get("decision_id"), flow=tuple(dict.fromkeys(flow)))

    def _closed(self, cause: str) -> Decision:
        log.warning("policy decision denied, fail closed: %s", cause)
        return Decision("deny", "opa", f"the policy could not be evaluated: {cause}")


def _cause(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    if status:
        return f"status {status}"
    return f"{type(exc).__name__}: {exc}"[:300]
