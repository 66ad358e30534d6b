"""What every agent API adapter does the same way: read the JSON body, say who asks, relay or gather the turn.

An adapter (Chat Completions, Responses, Messages) subclasses `AgentAPI`,
names its `errors` shape and implements `answer(request, body, raw)`; a
streamed turn goes through a `TurnWriter`, which reads the engine's events
and nothing else, a whole one through `AgentAPI.whole`. Errors before the
turn are 4xx in the API's shape (`refuse`), a failed turn its upstream's
status (`errors.py`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.common import dumps
from toolkeeper.engine import (
    Engine,
    Event,
    LimitReached,
    TurnContext,
    TurnResult,
    Visible,
    Working,
    conversation_session,
)
from toolkeeper.metrics import Metrics
from toolkeeper.store import StoreError
from toolkeeper.tracing import RequestTrace, Tracing
from toolkeeper.wire.errors import OPENAI, ErrorShape, UpstreamError, store_unavailable
from toolkeeper.wire.guard import AGENT_NAME, PRINCIPAL, SUBJECT_TOKEN, is_json
from toolkeeper.wire.upstream import Upstream

log = logging.getLogger("toolkeeper")

KEEPALIVE = b": keep-alive\n\n"
# A whole turn's answer, from its result and what each round relayed; what an adapter keeps of it (the ids given;
# None: the model server's answer went back as it came).
Whole = Callable[[TurnResult, list[tuple[Any, ...]]], dict[str, Any]]
Keep = Callable[[TurnResult, dict[str, Any] | None], Awaitable[None]]
# The model server's failure that ended this request's turn (its status, or ours: 502 unreachable, 504 timeout),
# for the metrics; one per request, as each request is its own task.
UPSTREAM_FAILURE: ContextVar[int | None] = ContextVar("upstream_failure", default=None)
TRACE = web.RequestKey("trace", RequestTrace)  # the request's span, when tracing is on


# A request field the engine reads: its name, the JSON types it may have (null always may), and the 400's words.
Field = tuple[str, tuple[type, ...], str]


def of_json_type(value: Any, kinds: tuple[type, ...]) -> bool:
    """A parsed JSON value is exactly one of dict, list, str, int, float, bool (never a subclass), so its type
    is looked up, not walked: JSON's true is no number."""
    return type(value) in kinds


def field_problem(body: dict[str, Any], fields: tuple[Field, ...]) -> str | None:
    """The first field of `body` that has a value of the wrong type: what the 400 says of it."""
    for key, kinds, problem in fields:
        value = body.get(key)
        if value is not None and type(value) not in kinds:  # of_json_type, inline: this runs on every request
            return problem
    return None


def first_problem(entries: Any, check: Callable[[dict[str, Any]], str | None], label: str, kind: str, *,
                  required: str = "") -> str | None:
    """The first entry's problem (an entry is an object, a `kind`; `check` says the rest), said with where it
    stands: `label[position]: problem`. `required`: what to say when `entries` is no non-empty list."""
    if required and (not isinstance(entries, list) or not entries):
        return required
    for position, entry in enumerate(entries):
        problem = check(entry) if isinstance(entry, dict) else f"each {kind} must be an object"
        if problem:
            return f"{label}[{position}]: {problem}"
    return None


def credentials_hash(request: web.Request) -> str:
    """Whose stored history a request reads: a hash of the agent's credentials, never the key itself; for an
    agent whose token a provider signed, of who the token names (an access token is replaced every few minutes,
    and a conversation must outlive it)."""
    principal = request.get(PRINCIPAL)
    if principal is not None and principal.issuer is not None:
        # as JSON: the claims are the provider's strings, which may hold any character (a NUL too)
        return _tenant("token\x00" + orjson.dumps([principal.issuer, principal.agent, principal.user]).decode())
    headers = request.headers
    return _tenant(headers.get("Authorization") or headers.get("api-key") or headers.get("x-api-key") or "")


@functools.lru_cache(maxsize=1024)
def _tenant(credential: str) -> str:  # an agent sends the same key on every request: hashed once
    return hashlib.sha256(b"toolkeeper-tenant\x00" + credential.encode()).hexdigest()


_REQUEST_IDS = itertools.count(1)
_PROCESS = secrets.token_hex(4)  # request ids: unique across processes, and no random bytes drawn per request


def request_id() -> str:
    return f"{_PROCESS}{next(_REQUEST_IDS):08x}"


class AgentAPI:
    api = "chat"  # what records say the agent spoke
    errors: ErrorShape = OPENAI

    @staticmethod
    def check(body: dict[str, Any]) -> str | None:
        """What is wrong with a request body (a JSON object), in the words a 400 gives; None when it can be
        served."""
        raise NotImplementedError

    def __init__(self, engine: Engine, upstream: Upstream, *, keepalive: float = 5.0,
                 identity_header: str | None = None, metrics: Metrics | None = None, tracing: Tracing | None = None):
        self.engine = engine
        self.upstream = upstream
        self.keepalive = keepalive
        self.identity_header = identity_header  # set by the deployment, read by policies
        self.metrics = metrics
        self.tracing = tracing  # None: tracing off
        if metrics is not None:  # the series there from the start
            for stream in ("false", "true"):
                metrics.expect("toolkeeper_requests_total", api=self.api, code="200", stream=stream)
            for status in ("502", "504"):  # toolkeeper's own: unreachable or malformed, no answer in time
                metrics.expect("toolkeeper_upstream_errors_total", api=self.api, status=status)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.tracing is not None:
            return await self._traced(request)
        response = await self._handle(request)
        self._count(response)
        return response

    async def _traced(self, request: web.Request) -> web.StreamResponse:
        route = request.match_info.route.resource
        path = route.canonical if route is not None else request.path
        with self.tracing.request(f"{request.method} {path}", request.headers, path) as trace:  # type: ignore[union-attr]
            request[TRACE] = trace  # the turn's (self.context)
            response = await self._handle(request)
            self._count(response)
            return trace.answered(response)

    def _count(self, response: web.StreamResponse) -> None:
        """The answer, counted in the metrics."""
        if self.metrics is not None:
            self.metrics.count("toolkeeper_requests_total", api=self.api, code=str(response.status),
                               stream=str(response.content_type == "text/event-stream").lower())
            failure = UPSTREAM_FAILURE.get()
            if failure is not None:
                self.metrics.count("toolkeeper_upstream_errors_total", api=self.api, status=str(failure))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if not is_json(request.headers.get("Content-Type", "")):
            # a web page can post text/plain without asking first; an agent always sends JSON
            return self.refuse("the request body must be sent as Content-Type: application/json",
                               "unsupported_content_type", status=415)
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self.refuse(f"the request body is not valid JSON: {exc}")
        problem = self.check(body) if isinstance(body, dict) else "the request body must be a JSON object"
        if problem:
            return self.refuse(problem)
        return await self.answer(request, body, raw)

    def refuse(self, message: str, code: str = "invalid_request", status: int = 400) -> web.Response:
        """A request refused before the turn, in the API's error shape."""
        return self.errors.refusal(status, message, code)

    async def whole(self, events: AsyncIterator[Event], answer: Whole, keep: Keep | None = None) -> web.Response:
        """A turn that is not streamed: the upstream's own bytes when nothing happened in between, else
        `answer(result, relayed)` (`relayed`: what each Visible relayed, a tuple a round), kept (`keep`) before
        the agent has it; or the error in the API's shape, never a bare 500."""
        result, relayed = None, []
        try:
            async for event in events:
                if isinstance(event, TurnResult):
                    result = event
                elif isinstance(event, Visible) and event.relay:
                    relayed.append(event.relay)
        except Exception as exc:
            return self.errors.response(failure_of(exc))
        if result is None:
            raise RuntimeError("the engine ended a turn without a result")
        if result.passthrough:
            if keep is not None:  # the id in those bytes may need keeping too (whose it is: responses/owners.py)
                await keep(result, None)
            return web.Response(body=result.last.raw, content_type="application/json")
        answered = answer(result, relayed)
        if keep is not None:
            await keep(result, answered)
        return web.Response(body=dumps(answered), content_type="application/json")

    async def answer(self, request: web.Request, body: Any, raw: bytes) -> web.StreamResponse:
        raise NotImplementedError

    async def offered(self, entries: list[Any], hosted: Callable[[Any], tuple[str, str] | None],
                      turn: TurnContext) -> list[Any]:
        """The agent's tools (or MCP servers) as the model server gets them: one the server runs itself
        (`hosted` names it and its kind) goes only when the rules allow it; one they deny is withheld and
        recorded."""
        kept = []
        for entry in entries:
            found = hosted(entry)
            if found is None or await self.engine.hosted.offer(found[0], found[1], entry, turn):
                kept.append(entry)
        return kept

    def context(self, request: web.Request, raw: bytes, conversation: Any = None) -> TurnContext:
        """Who asks; `conversation`: the request's messages in neutral form, whose opening names its session
        (engine/flows.py). Without them (a Responses chain), the adapter names the session itself."""
        tenant = credentials_hash(request)
        return TurnContext(
            request_id=request.headers.get("X-Request-Id") or request_id(),
            agent=request.get(AGENT_NAME) or tenant[:16],
            tenant=tenant,
            request_body=raw,
            agent_header=request.headers.get(self.identity_header) if self.identity_header else None,
            principal=principal.document() if (principal := request.get(PRINCIPAL)) is not None else None,
            subject_token=request.get(SUBJECT_TOKEN),  # for an MCP server that exchanges it; never sent on as is
            api=self.api,
            trace=request.get(TRACE),
            session=conversation_session(tenant, conversation) if conversation is not None else "",
        )


async def keep_alive(every: float, write: Callable[[bytes], Awaitable[None]], data: bytes = KEEPALIVE) -> None:
    """SSE comments (or the API's own ping) while a declared call is decided or run: the connection stays open."""
    while True:
        await asyncio.sleep(every)
        await write(data)


class EventStream(web.StreamResponse):
    """A streamed answer whose headers go out with its first bytes, in one send (as a `web.Response`'s do), not
    in one of their own: the agent is woken once, and a writer always has bytes to send once it prepares."""

    _send_headers_immediately = False  # aiohttp's own switch (web.Response sets it so)


class TurnWriter:
    """One streamed turn, relayed to the agent: an adapter's writer says what each event becomes.

    The engine runs in this handler's task: when the agent goes away, aiohttp
    cancels the handler, and the cancellation reaches the running tool, whose
    process group is killed. Keep-alives come from a timer task that lives only
    while a declared call is decided or run.
    """

    keepalive_data = KEEPALIVE
    errors: ErrorShape = OPENAI

    def __init__(self, request: web.Request, keepalive: float):
        self.request = request
        self.keepalive = keepalive
        self.response: web.StreamResponse | None = None
        self._held = b""  # the model's last piece of a round, sent with what comes next (`Visible.last`)

    async def relay(self, events: AsyncIterator[Event]) -> web.StreamResponse:
        keepalive: asyncio.Task[None] | None = None
        try:
            async for event in events:
                if isinstance(event, Working):
                    await self.working(event.head)
                    await self.write(b"")  # what is held goes out before the wait
                    keepalive = keepalive or asyncio.create_task(
                        keep_alive(self.keepalive, self.write, self.keepalive_data))
                    continue
                if keepalive is not None:
                    keepalive.cancel()
                    await asyncio.gather(keepalive, return_exceptions=True)
                    keepalive = None
                if isinstance(event, Visible):
                    await self.visible(event)
                elif isinstance(event, TurnResult):
                    await self.finish(event)
        except ConnectionResetError:  # the agent went away mid-answer: no one to tell
            return self.response or web.Response(status=499)
        except Exception as exc:
            return await self.fail(failure_of(exc))
        finally:
            if keepalive is not None:
                keepalive.cancel()
        if self.response is None:
            raise RuntimeError("the engine ended a turn without a result")
        return self.response

    async def prepared(self) -> web.StreamResponse:
        if self.response is None:
            self.response = EventStream(headers={
                "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await self.response.prepare(self.request)  # returns at once once prepared
        return self.response

    async def write(self, data: bytes, *, hold: bool = False) -> None:
        """Send `data` (after what is held), or hold it for the next send: the end of a round, which the turn's
        next event follows at once (its end, a declared call's start), so the two go out in one send."""
        if self._held:
            data, self._held = self._held + data, b""
        if hold:
            self._held = data
        elif data:
            response = await self.prepared()
            await response.write(data)

    async def end(self, data: bytes) -> web.StreamResponse:
        """The answer's last bytes (after what is held) and the end of the body, in one send."""
        data, self._held = self._held + data, b""
        response = await self.prepared()
        await response.write_eof(data)
        return response

    async def working(self, head: dict[str, Any] | None) -> None:
        """A declared call is about to be decided or run (`head`: the turn's first round's)."""

    async def visible(self, event: Visible) -> None:
        raise NotImplementedError

    async def finish(self, result: TurnResult) -> None:
        raise NotImplementedError

    def failure(self, error: UpstreamError) -> bytes:
        """The event that ends a stream that had begun when the turn failed."""
        raise NotImplementedError

    async def fail(self, error: UpstreamError) -> web.StreamResponse:
        if self.response is None and not self._held:  # nothing sent yet: the error keeps its status
            return self.errors.response(error)
        return await self.end(self.failure(error))


def failure_of(exc: Exception) -> UpstreamError:
    """What a failed turn is to the agent: the model server's error, the store's 503, a spent token budget's 429,
    or a bug of ours (500)."""
    if isinstance(exc, UpstreamError):
        UPSTREAM_FAILURE.set(exc.status)
        return exc
    if isinstance(exc, StoreError):
        return store_unavailable(exc)
    if isinstance(exc, LimitReached):
        return UpstreamError.limit_reached(exc.reason)
    log.error("turn failed", exc_info=exc)
    return UpstreamError.ours(500, f"toolkeeper failed: {exc}", "toolkeeper_error")
