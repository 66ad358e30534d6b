"""The limits of the policy in force, on each call and each model round (policy/limits.py says what they are).

    a call:   judge -> `check`: each limit that selects it takes its count (calls) or reads it (run time);
                       one past its maximum decides deny (or ask), beside the rules
              noted  -> `settle`: a call that will not run gives its counts back; one approved past an
                       ask-limit is counted all the same
              run    -> `started`, then `ran`: its run time added (a declared tool's)
              end    -> `forget`: a call that never started gives back what it still holds
    a round:  before -> `before_round`: a token budget spent ends the turn (`LimitReached`)
              after  -> `after_round`: the round's tokens added, from its usage

Counts live in the store, so every replica and worker counts the same calls.
A store that does not answer refuses the call: a limit that cannot be read
is not known to leave room.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from toolkeeper.engine.types import Round, TurnContext
from toolkeeper.metrics import Metrics
from toolkeeper.policy import Decision, Limit, assess_limits, limits_on_call, policy_input
from toolkeeper.store import Count, Store, StoreError, Taken

if TYPE_CHECKING:
    from toolkeeper.audit import ExecutionRecord
    from toolkeeper.policy import Policy

log = logging.getLogger("toolkeeper")

Budgets = list[tuple[Limit, list[Count], dict[str, Any]]]  # each token limit of a turn, its counts and document

CHARACTERS_PER_TOKEN = 4  # a round whose server says no usage: its tokens guessed from its size, as OpenAI's rule
MOST_TOKENS = 10**9  # one round's tokens, at most, whatever its server says
PARTS = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens", "cache_creation_input_tokens",
         "cache_read_input_tokens")


class LimitReached(Exception):
    """A token budget is spent: the turn ends with this reason, in the API's error shape (a 429)."""

    def __init__(self, reason: str, limit_id: str):
        super().__init__(reason)
        self.reason = reason
        self.limit_id = limit_id


@dataclass
class Held:
    """What one call holds between its decision and its run."""

    taken: list[Taken] = field(default_factory=list)  # calls counts it took
    past: list[Count] = field(default_factory=list)  # calls counts of ask-limits it is past: taken if approved
    timed: list[Count] = field(default_factory=list)  # run-time counts, added to once it has run
    started: float | None = None  # when its run began (time.monotonic())


def tokens_of(usage: dict[str, Any] | None) -> int | None:
    """A round's tokens from its usage, on any of the three APIs (cached and cache-writing input included): its
    `total_tokens` or the sum of its parts, whichever is more. The server's numbers are not believed past sense:
    each is taken between 0 and MOST_TOKENS (a negative part cannot cancel another, nor a huge one break the
    count)."""
    if not isinstance(usage, dict):
        return None
    numbers = {key: min(max(value, 0), MOST_TOKENS) for key, value in usage.items()
               if isinstance(value, int) and not isinstance(value, bool)}
    found = [numbers[key] for key in PARTS if key in numbers]
    if not found and "total_tokens" not in numbers:
        return None
    return min(max(numbers.get("total_tokens", 0), sum(found)), MOST_TOKENS)


class Limiter:
    def __init__(self, policy: Callable[[], Policy], store: Store | None, metrics: Metrics):
        self._policy = policy  # the policy in force (a reload replaces it)
        self.store = store
        self.metrics = metrics
        self._held: dict[int, Held] = {}  # by the call's record

    def limits(self) -> tuple[Limit, ...]:
        rules = self._policy().rules
        return rules.limits if rules is not None else ()

    async def check(self, record: ExecutionRecord | None, document: dict[str, Any]) -> Decision | None:
        """The call's counts taken (calls) or read (run time) into its document's `limits`; the decision of a
        limit it is past, None when none. An offer (`record` None) counts nothing."""
        selected = limits_on_call(self.limits(), document)
        if record is None or not selected:
            return None
        held = self._held[id(record)] = Held()
        found: list[tuple[Limit, str, int]] = []
        try:
            for limit in selected:
                counts = [Count(limit.id, scope, limit.per, limit.most) for scope in limit.scopes(document)]
                if limit.counts == "run_time":
                    held.timed += counts
                    used = await self.store.used(counts) if self.store is not None else [0] * len(counts)
                    found += [(limit, count.scope, amount) for count, amount in zip(counts, used, strict=True)]
                    continue
                taken = await self.store.take(counts) if self.store is not None else []
                held.taken += [one for one in taken if one.taken]
                held.past += [one.count for one in taken if not one.taken and limit.effect == "ask"]
                found += [(limit, one.count.scope, one.used) for one in taken]
        except StoreError as exc:
            await self.forget(record)
            return Decision("deny", "store", f"the store did not answer, so the limits on this call could not be "
                                             f"counted ({exc})")
        decision = assess_limits(found, document, self._policy().revision)
        if decision is not None:
            self.metrics.count("toolkeeper_limit_stopped_total", limit=decision.rule_id or "", effect=decision.effect)
        return decision

    async def settle(self, record: ExecutionRecord, passed: bool) -> None:
        """The call's decision is final: one that will not run gives its counts back; one approved past an
        ask-limit is counted. A declared call keeps what it holds until it runs (`started`, `ran`)."""
        held = self._held.get(id(record))
        if held is None:
            return
        if not passed:
            await self.forget(record)
            return
        if held.past and self.store is not None:
            held.taken += await self.store.take(held.past, force=True)
            held.past = []
        if record.source != "declared":
            self._held.pop(id(record), None)  # the agent (or the server) runs it: counted as it goes

    def started(self, record: ExecutionRecord) -> None:
        held = self._held.get(id(record))
        if held is not None:
            held.started = time.monotonic()

    async def ran(self, record: ExecutionRecord, milliseconds: float) -> None:
        """A declared call has run: its run time added to its run-time counts."""
        held = self._held.pop(id(record), None)
        if held is not None and held.timed and self.store is not None:
            await self._add(held.timed, round(milliseconds), record)

    async def forget(self, record: ExecutionRecord) -> None:
        """The call is done with: one that never started gives back the counts it took; one whose run was cut
        short (its agent left, a failure) counts the time it ran. Shielded: a cancellation brings it here."""
        held = self._held.pop(id(record), None)
        if held is None or self.store is None:
            return
        if held.started is not None:
            if held.timed:
                await _finished(self._add(held.timed, round((time.monotonic() - held.started) * 1000), record))
        elif held.taken:
            await _finished(self._give_back(held.taken, record))

    async def _add(self, counts: list[Count], milliseconds: int, record: ExecutionRecord) -> None:
        try:
            await self.store.add_to_counts(counts, milliseconds)  # type: ignore[union-attr]
        except StoreError as exc:
            log.error("the run time of %s could not be counted: %s", record.tool, exc)

    async def _give_back(self, taken: list[Taken], record: ExecutionRecord) -> None:
        try:
            await self.store.give_back(taken)  # type: ignore[union-attr]
        except StoreError as exc:  # counted though it did not run: stricter, never looser
            log.error("the counts taken by %s could not be given back: %s", record.tool, exc)

    # -- model rounds -------------------------------------------------------------------

    def budgets(self, turn: TurnContext) -> Budgets:
        """The token limits that count this turn's rounds, each with its counts and the round's document."""
        limits = [limit for limit in self.limits() if limit.counts == "tokens"]
        if not limits:
            return []
        document = policy_input("", None, None, agent_id=turn.agent, agent_header=turn.agent_header,
                                request_id=turn.request_id, principal=turn.principal, source="model", kind="round")
        return [(limit, [Count(limit.id, scope, limit.per, limit.most) for scope in limit.scopes(document)],
                 document) for limit in limits if limit.selects(document)]

    async def before_round(self, budgets: Budgets) -> None:
        """Raises LimitReached when a budget this round counts against is spent."""
        assert self.store is not None
        found = []
        for limit, counts, _ in budgets:
            found += [(limit, count.scope, used) for count, used in
                      zip(counts, await self.store.used(counts), strict=True)]
        decision = assess_limits(found, dict(budgets[0][2]), self._policy().revision, amount=0)
        if decision is not None:
            self.metrics.count("toolkeeper_limit_stopped_total", limit=decision.rule_id or "", effect="deny")
            raise LimitReached(decision.reason, decision.rule_id or "")

    def spending(self, budgets: Budgets, sent: dict[str, Any]) -> Spending:
        """One model round of the turn, under its budgets: `async with limiter.spending(budgets, body) as spent`."""
        return Spending(self, budgets, sent)

    async def after_round(self, budgets: Budgets, answered: Round | None, sent: dict[str, Any]) -> None:
        """The round's tokens added to each budget; guessed from its size when its server said none, or when it
        never ended (the model server spent them all the same)."""
        tokens = tokens_of(answered.usage) if answered is not None else None
        if tokens is None:
            said = len(orjson.dumps(answered.message, default=str)) if answered is not None else 0
            tokens = (len(orjson.dumps(sent, default=str)) + said) // CHARACTERS_PER_TOKEN
            log.warning("a model round %s: its tokens are counted as about %d, from its size",
                        "came without usage" if answered is not None else "did not end", tokens)
        await self.count_tokens(budgets, tokens)

    async def count_tokens(self, budgets: Budgets, tokens: int) -> None:
        """Tokens spent, added to each budget. A store that fails here is logged: what they paid for is answered,
        and is not lost for it."""
        try:
            await self.store.add_to_counts([count for _, counts, _ in budgets for count in counts], tokens)  # type: ignore[union-attr]
        except StoreError as exc:
            log.error("%d tokens spent could not be counted: %s", tokens, exc)


async def _finished(work: Coroutine[Any, Any, None]) -> None:
    """`work` done, even when a cancellation brought the caller here (then in a task of its own, shielded: the
    cancellation would stop it at its first wait); else at once, in this task, before any other call's check."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        await asyncio.shield(work)
    else:
        await work


class Spending:
    """One model round under the turn's token budgets: checked before it is sent, and counted when it ends,
    however it ends: answered (from its usage), or cut short (the agent left, the server failed; from its
    request's size), the count shielded from the cancellation that cut it."""

    __slots__ = ("answered", "budgets", "limiter", "sent")

    def __init__(self, limiter: Limiter, budgets: Budgets, sent: dict[str, Any]):
        self.limiter = limiter
        self.budgets = budgets if limiter.store is not None else []
        self.sent = sent
        self.answered: Round | None = None

    async def __aenter__(self) -> Spending:
        if self.budgets:
            await self.limiter.before_round(self.budgets)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.budgets:
            await _finished(self.limiter.after_round(self.budgets, self.answered, self.sent))
