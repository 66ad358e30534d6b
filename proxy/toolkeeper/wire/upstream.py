"""The model server upstream: one aiohttp session, and the engine's `Model` over it.

Upstream failures become `UpstreamError`, carrying the status and body the
agent should get when nothing has been sent to it yet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from toolkeeper.common import dumps
from toolkeeper.engine import Round, Visible
from toolkeeper.wire.chat_stream import VISIBLE_FIELDS, MalformedResponse, StreamAssembler, round_from_response
from toolkeeper.wire.sse import EventSplitter, EventTooLarge

# A model's answer is text and a few calls: past these sizes the server is broken or hostile.
MAX_EVENT_BYTES = 8 * 2**20
MAX_RESPONSE_BYTES = 64 * 2**20

OWN_COOKIE = "toolkeeper_"  # the prefix of toolkeeper's cookies (the console's session): never forwarded
OWN_HEADERS = "x-toolkeeper-"  # the prefix of headers meant for toolkeeper alone (intercepted.py): never forwarded

# Headers that belong to one connection, or that aiohttp sets itself.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"}
)


class UpstreamError(Exception):
    def __init__(self, status: int, body: bytes, content_type: str = "application/json"):
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type

    @classmethod
    def ours(cls, status: int, message: str, code: str = "upstream_error") -> UpstreamError:
        return cls(status, error_body(message, code))

    def error_object(self) -> dict[str, Any]:
        """The `error` object for an SSE error event once the stream has begun."""
        try:
            parsed = orjson.loads(self.body)
            if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
                return parsed["error"]
        except orjson.JSONDecodeError:
            pass
        text = self.body.decode("utf-8", errors="replace")[:500]
        return {"message": f"upstream error {self.status}: {text}", "type": "upstream_error", "code": self.status}


def error_body(message: str, code: str, kind: str = "upstream_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


KEY_HEADERS = ("authorization", "x-api-key", "api-key")


def forward_headers(headers: Mapping[str, str], api_key: str | None, *,
                    key_header: str = "Authorization") -> dict[str, str]:
    """The agent's headers as the model server gets them: no hop-by-hop header, never toolkeeper's own cookie."""
    forwarded = {name: value for name, value in headers.items()
                 if name.lower() not in HOP_BY_HOP and not name.lower().startswith(OWN_HEADERS)}
    for name in [n for n in forwarded if n.lower() == "cookie"]:
        kept = "; ".join(part.strip() for part in forwarded[name].split(";")
                         if part.strip() and not part.strip().startswith(OWN_COOKIE))
        if kept:
            forwarded[name] = kept
        else:
            del forwarded[name]
    if api_key is not None:  # toolkeeper's key, in the header the API reads; the agent's own never goes on
        for name in [n for n in forwarded if n.lower() in KEY_HEADERS]:
            del forwarded[name]
        forwarded[key_header] = f"Bearer {api_key}" if key_header == "Authorization" else api_key
    return forwarded


class Upstream:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, *, api_key: str | None = None,
                 read_timeout: float = 300):
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.api_key = api_key
        self.read_timeout = read_timeout
        self.timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10, sock_read=read_timeout)

    def url(self, path: str) -> str:
        return self.base_url + path

    def at(self, base_url: str) -> Upstream:
        """The same session and timeouts towards another server (an intercepted request's own), with the agent's
        own key: toolkeeper's key is for the agent file's upstream only."""
        return Upstream(base_url, self.session, read_timeout=self.read_timeout)

    def model(self, headers: Mapping[str, str], query: str = "") -> UpstreamModel:
        return UpstreamModel(self, forward_headers(headers, self.api_key), query)


class UpstreamModel:
    """The engine's Model: one chat completion request per round."""

    def __init__(self, upstream: Upstream, headers: dict[str, str], query: str = ""):
        self.upstream = upstream
        self.headers = {**headers, "Content-Type": "application/json"}
        self.query = f"?{query}" if query else ""  # the agent's (Azure's api-version): the model server's too

    async def round(self, body: dict[str, Any]) -> AsyncIterator[Visible | Round]:
        streaming = bool(body.get("stream"))
        try:
            async with self.upstream.session.post(
                self.upstream.url("/chat/completions") + self.query, data=dumps(body), headers=self.headers,
                timeout=self.upstream.timeout,
            ) as response:
                if response.status != 200:
                    raise UpstreamError(response.status, await response.read(),
                                        response.headers.get("Content-Type", "application/json"))
                content_type = response.headers.get("Content-Type", "")
                if streaming and "text/event-stream" in content_type:
                    async for event in _read_stream(response):
                        yield event
                else:
                    # not streamed (or a server that ignored `stream`): one whole response
                    raw = await read_whole(response)
                    result = _malformed_is_502(round_from_response, raw, _parse_json(raw))
                    visible = {key: value for key, value in result.message.items()
                               if key in VISIBLE_FIELDS and isinstance(value, str) and value}
                    if visible:
                        yield Visible((visible,), result.head)
                    if streaming:
                        result.raw = None  # the agent gets SSE, not these bytes
                    yield result
        except TimeoutError as exc:
            raise UpstreamError.ours(504, "the model server did not answer in time", "upstream_timeout") from exc
        except aiohttp.ClientPayloadError as exc:
            raise UpstreamError.ours(502, f"the model server broke off its response: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError.ours(502, f"cannot reach the model server: {exc}", "upstream_unreachable") from exc


def _parse_json(raw: bytes) -> dict[str, Any]:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError.ours(502, f"the model server sent malformed JSON: {exc}", "upstream_malformed") from exc
    if not isinstance(parsed, dict) or not isinstance(parsed.get("choices"), list):
        raise UpstreamError.ours(502, "the model server sent a response without choices", "upstream_malformed")
    return parsed


async def read_whole(response: aiohttp.ClientResponse) -> bytes:
    body = bytearray()
    async for data in response.content.iter_any():
        body += data
        if len(body) > MAX_RESPONSE_BYTES:
            raise UpstreamError.ours(502, f"the model server's response is larger than "
                                          f"{MAX_RESPONSE_BYTES // 2**20} MiB", "upstream_too_large")
    return bytes(body)


def _malformed_is_502(parse: Any, *args: Any) -> Any:
    try:
        return parse(*args)
    except MalformedResponse as exc:
        raise _as_upstream_error(exc) from exc


def _as_upstream_error(exc: Exception) -> UpstreamError:
    if isinstance(exc, EventTooLarge):
        return UpstreamError.ours(502, f"the model server sent {exc}", "upstream_too_large")
    return UpstreamError.ours(502, f"the model server sent a malformed response: {exc}", "upstream_malformed")


async def _read_stream(response: aiohttp.ClientResponse) -> AsyncIterator[Visible | Round]:
    """Parse SSE as it arrives; what one network read brings is handed on together."""
    assembler = StreamAssembler()
    events = EventSplitter(MAX_EVENT_BYTES)
    done = False
    async for data in response.content.iter_any():
        visible: list[dict[str, str]] = []
        broken: UpstreamError | None = None
        try:
            for event in events.feed(data):
                done, seen = _dispatch(event, assembler)
                if done:
                    break
                if seen:
                    visible.append(seen)
        except UpstreamError as exc:
            broken = exc
        except (MalformedResponse, EventTooLarge) as exc:
            broken = _as_upstream_error(exc)
        # what came before a broken event is the agent's, whatever the network's timing
        if visible:
            yield Visible(tuple(visible), assembler.head)
        if broken is not None:
            raise broken
        if done:
            break
    last = events.rest()
    if last and not done:  # the last event, with no blank line after it
        done, seen = _malformed_is_502(_dispatch, last, assembler)
        if seen:
            yield Visible((seen,), assembler.head)
    if not done and assembler.finish_reason is None:
        raise UpstreamError.ours(502, "the model server's stream ended before the response was complete",
                                 "upstream_incomplete")
    yield assembler.finish()


def _dispatch(event: bytes, assembler: StreamAssembler) -> tuple[bool, dict[str, str] | None]:
    """One SSE event: (the stream is done, what the agent may see of it)."""
    if event.startswith(b"data: ") and b"\n" not in event:
        data = event[6:]  # the usual shape: one data line
    else:
        lines = [line[6:] if line[5:6] == b" " else line[5:]
                 for line in event.split(b"\n") if line.startswith(b"data:")]
        if not lines:
            return False, None  # a comment, or event:/id:/retry: fields only
        data = b"\n".join(lines)
    if data.strip() == b"[DONE]":
        return True, None
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError.ours(502, f"the model server sent a malformed stream event: {exc}",
                                 "upstream_malformed") from exc
    if not isinstance(chunk, dict):
        raise UpstreamError.ours(502, "the model server sent a stream event that is not an object",
                                 "upstream_malformed")
    if chunk.get("error"):
        raise UpstreamError(502, orjson.dumps({"error": chunk["error"]}))
    return False, assembler.feed(chunk)


UPSTREAM_KEY = web.AppKey("upstream", Upstream)  # the agent file's upstream, on the proxy app
ROUTED = web.RequestKey("routed_upstream", Upstream)  # an intercepted request's own (intercepted.py)
