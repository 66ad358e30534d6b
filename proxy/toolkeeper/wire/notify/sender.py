"""The notifier: each new ask sent to its channels in the background, tried again until it arrives or the call
stops waiting.

    ApprovalsConsent adds a waiting call -> Notifier.announce(approval)   (sync: schedules, returns)
        -> for each channel of the ask (the rule's or limit's `notify:`, else the policy's default):
           one task: attempt, fail, wait 1 s, 2 s, 4 s ... (60 s at most), attempt again ...
           while the call waits and before it expires; each attempt within the channel's timeout
           and the time left; its state written to the store (notify_deliveries) after each attempt

Nothing of this reaches the ask: the call waits for a person and times out
to deny at its own time, whether the channel answered, refused, hung or was
never reached. A failure is logged (the channel's name and why, never its
URL, which for Slack is the secret, nor the signing secret), counted in
toolkeeper_notify_deliveries_total and shown on the console's queue page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import orjson

from toolkeeper.common import printable
from toolkeeper.metrics import Metrics
from toolkeeper.policy import Policy, Rules
from toolkeeper.store import Store, StoreError
from toolkeeper.wire.notify.messages import SecretError, signed_headers, signing_key, slack_message, webhook_body

log = logging.getLogger("toolkeeper")

FIRST_RETRY = 1.0  # seconds before the second attempt; doubled each time after
LAST_RETRY = 60.0  # at most this long between attempts
OUTCOMES = ("delivered", "error", "given_up")
SHOWN_ANSWER = 200  # characters of a refusal's body kept in the error (Slack says why there: invalid_blocks)


class Channel(Protocol):
    """What sending needs of a policy's channel (policy/channels.py)."""

    type: str
    timeout: float
    url_env: str | None
    secret_env: str | None

    def target(self) -> str | None: ...

    def secret(self) -> str | None: ...


@dataclass(frozen=True)
class Message:
    """One message to one channel, the same bytes on every attempt; `key` signs it (a webhook's)."""

    url: str
    body: bytes
    key: bytes | None
    message_id: str

    def headers(self) -> dict[str, str]:
        if self.key is None:
            return {"Content-Type": "application/json"}
        return signed_headers(self.key, self.message_id, int(time.time()), self.body)


class Undeliverable(Exception):
    """A channel that cannot be used as configured (its variable unset, a secret that does not decode)."""


def message_for(channel: Channel, approval: dict[str, Any], link: str) -> Message:
    url = channel.target()
    if url is None:
        raise Undeliverable(f"the variable {channel.url_env} that holds its URL is unset, or holds no http(s) URL")
    if channel.type == "slack":
        return Message(url, orjson.dumps(slack_message(approval, link)), None, "")
    secret = channel.secret()
    if secret is None:
        raise Undeliverable(f"the variable {channel.secret_env} that holds its signing secret is unset")
    try:
        key = signing_key(secret)
    except SecretError as exc:
        raise Undeliverable(str(exc)) from None
    return Message(url, webhook_body(approval, link), key, "msg_" + secrets.token_urlsafe(18))


def failure(exc: BaseException, url: str, timeout: float) -> str:
    """Why an attempt failed, as the log and the queue page say it: never the URL (its path is Slack's secret)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, unreachable, no such host: the OS's own words
        with contextlib.suppress(AttributeError):  # a certificate's refusal holds no OS error
            if isinstance(exc.os_error, socket.gaierror):  # a name that does not resolve: its own words
                return f"cannot connect: {exc.os_error.strerror}"
            if exc.os_error.errno:
                return f"cannot connect: {os.strerror(exc.os_error.errno)}"
    return f"{type(exc).__name__}: {hide_url(str(exc), url)}"


def hide_url(text: str, url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:  # a URL that does not parse: none of the text can be known free of it
        return "(the error's words are left out: they may hold the channel's URL)"
    for secret_part in (url, parts.path if len(parts.path) > 1 else "", parts.query):
        if secret_part:
            text = text.replace(secret_part, "[url]")
    return printable(text)[:300]


class Notifier:
    """Sends each new ask to its channels (`announce`), in tasks of its own that `close` ends."""

    def __init__(self, policy: Callable[[], Policy], store: Store, metrics: Metrics, console_url: str):
        self.policy = policy  # the policy in force now: SIGHUP replaces it
        self.store = store
        self.metrics = metrics
        self.console_url = console_url.rstrip("/")  # where people reach the console (--public-url)
        self.tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._expected: object = None  # the rules whose channels' series are there
        self._closed = False

    def link(self, approval_id: str) -> str:
        return f"{self.console_url}/toolkeeper/queue/{approval_id}"

    def expect_series(self, rules: Rules | None) -> None:
        """Each channel's series at zero, from the start (and for the channels a reload adds)."""
        if rules is None or rules is self._expected:
            return
        self._expected = rules
        for name in rules.channels:
            for outcome in OUTCOMES:
                self.metrics.expect("toolkeeper_notify_deliveries_total", channel=name, outcome=outcome)

    def announce(self, approval: dict[str, Any]) -> None:
        """A new waiting call: a task for each of its channels. Never waits, never raises into the ask."""
        rules = self.policy().rules
        if rules is None or self._closed:  # closed: toolkeeper is stopping, and nothing may outlive it
            return
        self.expect_series(rules)
        for name in rules.channels_for(approval.get("rule")):
            channel = rules.channels.get(name)
            if channel is None:  # load_rules refuses such a file: only a bug gets here
                continue
            task = asyncio.get_running_loop().create_task(self._guarded(approval, name, channel))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        """At shutdown: the deliveries under way stop (their rows say where they were), the connections close."""
        self._closed = True
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # trust_env: HTTPS_PROXY and NO_PROXY, for a network that reaches out through one
            self._session = aiohttp.ClientSession(trust_env=True)
        return self._session

    async def _guarded(self, approval: dict[str, Any], name: str, channel: Channel) -> None:
        try:
            await self._deliver(approval, name, channel)
        except Exception:  # a bug here: said in the log, where a task's lost exception would not be
            log.exception("sending approval %s to %s failed", approval["id"], printable(name))

    async def _deliver(self, approval: dict[str, Any], name: str, channel: Channel) -> None:
        approval_id = approval["id"]
        try:
            message = message_for(channel, approval, self.link(approval_id))
        except Undeliverable as exc:
            await self._given_up(approval_id, name, 0, f"the channel cannot be used: {exc}")
            return
        attempts, wait, error = 0, FIRST_RETRY, None
        while True:
            left = (approval.get("expires") or 0) - time.time()
            status = await self._status(approval_id)
            if left <= 0 or status not in ("waiting", None):
                why = "it expired" if left <= 0 or status == "expired" else f"it was {status}"
                await self._given_up(approval_id, name, attempts, error and f"{error}; given up: {why}")
                return
            attempts += 1
            if attempts == 1:  # after a failure, its row already says "sending" and why the last attempt failed
                await self._note(approval_id, name, "sending", attempts, None)
            error = await self._attempt(message, min(channel.timeout, left))
            if error is None:
                await self._note(approval_id, name, "delivered", attempts, None)
                self.metrics.count("toolkeeper_notify_deliveries_total", channel=name, outcome="delivered")
                log.info("approval %s sent to %s (attempt %d)", approval_id, printable(name), attempts)
                return
            self.metrics.count("toolkeeper_notify_deliveries_total", channel=name, outcome="error")
            await self._note(approval_id, name, "sending", attempts, error)
            log.warning("approval %s was not sent to %s (attempt %d): %s; tried again in %g s", approval_id,
                        printable(name), attempts, error, wait)
            await asyncio.sleep(max(0.0, min(wait, (approval.get("expires") or 0) - time.time())))
            wait = min(wait * 2, LAST_RETRY)

    async def _attempt(self, message: Message, timeout: float) -> str | None:
        """One POST: None when the channel took it (2xx), else why not."""
        try:
            async with asyncio.timeout(timeout), self._client().post(
                    message.url, data=message.body, headers=message.headers(), allow_redirects=False) as answer:
                if 200 <= answer.status < 300:
                    return None
                said = (await answer.content.read(SHOWN_ANSWER)).decode(errors="replace").strip()
                return f"HTTP {answer.status}" + (f": {hide_url(said, message.url)}" if said else "")
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:  # ValueError: a URL aiohttp refuses
            return failure(exc, message.url, timeout)

    async def _given_up(self, approval_id: str, name: str, attempts: int, error: str | None) -> None:
        """Never delivered. Without an error (answered before the first attempt) the channel did not fail: no
        row says it did."""
        self.metrics.count("toolkeeper_notify_deliveries_total", channel=name, outcome="given_up")
        if error is None:
            log.info("approval %s was answered before it was sent to %s", approval_id, printable(name))
            return
        await self._note(approval_id, name, "failed", attempts, error)
        log.warning("approval %s was never sent to %s: %s", approval_id, printable(name), error)

    async def _status(self, approval_id: str) -> str | None:
        """The call's status now (None when the store does not answer: the delivery goes on)."""
        try:
            current = await self.store.get_approval(approval_id)
        except StoreError:
            return None
        return current["status"] if current is not None else "gone"

    async def _note(self, approval_id: str, name: str, status: str, attempts: int, error: str | None) -> None:
        """The delivery's state in the store, for every replica's queue page; a store that does not answer
        costs the page its line, never the delivery."""
        with contextlib.suppress(StoreError):
            await self.store.note_delivery(approval_id, name, status, attempts, error)
