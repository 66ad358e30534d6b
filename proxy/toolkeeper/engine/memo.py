"""The retry memo: a retried request gets the result of the call its first attempt ran, wherever it ran.

The openai client retries twice by default, and a load balancer may send the
retry to another replica. The store holds, per request and call, either the
answer or "still running" (an owner and a lease the running attempt renews):

    lookup -> an answer: replay it
           -> running here: wait for its future; running elsewhere: look again until
              its answer comes or its lease lapses (its process died), then run it here
           -> nothing: an Attempt, which holds the claim until it finishes or lets go
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import orjson

from toolkeeper.audit import CallStatus
from toolkeeper.store import LEASE, Store, StoreError

log = logging.getLogger("toolkeeper")

CLAIM_POLL = 0.05  # seconds between looks at a call another process runs for the same request

Answer = tuple[str, CallStatus]


class RetryMemo:
    def __init__(self, store: Store, window: float):
        self.store = store
        self.window = window  # seconds an answer replays for an identical request
        self.running: dict[str, asyncio.Future[Answer]] = {}  # this process's runs, for an instant answer

    async def lookup(self, key: str) -> tuple[Answer | None, Attempt | None]:
        """The answer an attempt left, or the claim to run it here; raises StoreError when the store is down."""
        while True:
            running = self.running.get(key)
            if running is not None:
                try:
                    return await asyncio.shield(running), None
                except asyncio.CancelledError:
                    if not running.cancelled():
                        raise  # this request was cancelled, not the first
                    continue  # the first attempt was cancelled (its agent left): run it here
            claim = await self.store.claim_call(key, self.window)
            if claim.answer is not None:
                answer, status = orjson.loads(claim.answer)
                return (answer, status), None
            if claim.owner:
                return None, Attempt(self, key, claim.owner)
            await asyncio.sleep(CLAIM_POLL)


@dataclass
class Attempt:
    """This attempt's claim on a call: renewed while it is decided and run, then finished or let go."""

    memo: RetryMemo
    key: str
    owner: str
    finished: bool = False

    def __post_init__(self) -> None:
        self._holding = asyncio.get_running_loop().create_task(self._hold())
        self._local: asyncio.Future[Answer] | None = None

    def started(self) -> None:
        """The tool starts: retries in this process wait for it without asking the store."""
        self._local = asyncio.get_running_loop().create_future()
        self.memo.running[self.key] = self._local

    async def finish(self, answer: str, status: CallStatus) -> None:
        if self._local is not None:
            self._local.set_result((answer, status))
        try:
            await self.memo.store.finish_call(self.key, self.owner, orjson.dumps([answer, status]).decode(),
                                              self.memo.window)
            self.finished = True
        except StoreError as exc:  # a retry elsewhere waits out the lease, then runs it again
            log.error("a call's result could not be kept for retries: %s", exc)

    async def end(self) -> None:
        """Always, last: an unfinished claim is released, so a retry runs the call afresh."""
        self._holding.cancel()
        if self.memo.running.get(self.key) is self._local:
            self.memo.running.pop(self.key, None)
        if self._local is not None and not self._local.done():
            self._local.cancel()
        if not self.finished:
            with contextlib.suppress(StoreError):
                await self.memo.store.release_call(self.key, self.owner)

    async def _hold(self) -> None:
        while True:
            await asyncio.sleep(LEASE / 4)
            try:
                await self.memo.store.renew_claim(self.key, self.owner)
            except StoreError as exc:
                log.warning("the retry memo's lease on a running call could not be renewed: %s", exc)
