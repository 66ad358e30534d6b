"""The model server: one pooled aiohttp session, the headers an agent's request takes upstream, and one round's post.

It knows no agent API: the adapters (`apis/`) say what to post and read the
answer. A status other than 200 is the agent's answer as it came
(`UpstreamError`); every other failure is mapped by `errors.UpstreamFailures`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from toolkeeper.tracing import with_trace
from toolkeeper.wire.errors import UpstreamError

# A model's answer is text and a few calls: past these sizes the server is broken or hostile.
MAX_EVENT_BYTES = 8 * 2**20
MAX_RESPONSE_BYTES = 64 * 2**20

OWN_COOKIE = "toolkeeper_"  # the prefix of toolkeeper's cookies (the console's session): never forwarded
OWN_HEADERS = "x-toolkeeper-"  # the prefix of headers meant for toolkeeper alone (intercept/): never forwarded

# Headers that belong to one connection, or that aiohttp sets itself.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"}
)


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
        # a new connection has sock_connect to open; no `connect`, which arms a timer on every request, pooled or not
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout)

    def url(self, path: str) -> str:
        return self.base_url + path

    def at(self, base_url: str) -> Upstream:
        """The same session and timeouts towards another server (an intercepted request's own), with the agent's
        own key: toolkeeper's key is for the agent file's upstream only."""
        return Upstream(base_url, self.session, read_timeout=self.read_timeout)

    def headers(self, agent_headers: Mapping[str, str], key_header: str = "Authorization") -> dict[str, str]:
        """The headers of a model request: the agent's, forwarded, with toolkeeper's key when it holds one."""
        return {**forward_headers(agent_headers, self.api_key, key_header=key_header),
                "Content-Type": "application/json"}

    def post(self, path: str, payload: bytes, headers: dict[str, str], query: str = "") -> Posted:
        """One model request (the agent's query kept: Azure's api-version); its answer once the status is 200:
        `async with upstream.post(...) as response`."""
        url = self.url(path) + (f"?{query}" if query else "")
        headers = with_trace(headers)  # tracing on: the model round's traceparent, so the server's spans join
        return Posted(self.session.post(url, data=payload, headers=headers, timeout=self.timeout))


class Posted:
    """The answer of one model request, as an async context manager (a class: one round is one request, and a
    generator-based manager would cost a generator and its frames on every one)."""

    def __init__(self, request: Any):
        self.request = request
        self.response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        response = self.response = await self.request.__aenter__()
        if response.status != 200:
            body = await response.read()
            await self.request.__aexit__(None, None, None)
            raise UpstreamError(response.status, body, response.headers.get("Content-Type", "application/json"))
        return response

    async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> None:
        await self.request.__aexit__(kind, exc, tb)


def is_event_stream(response: aiohttp.ClientResponse) -> bool:
    return "text/event-stream" in response.headers.get("Content-Type", "")


async def read_whole(response: aiohttp.ClientResponse) -> bytes:
    length = response.content_length
    if length is not None and length <= MAX_RESPONSE_BYTES and "Content-Encoding" not in response.headers:
        # the usual answer: its length said and nothing to unpack, so no more than that is read
        return await response.read()
    body = bytearray()
    async for data in response.content.iter_any():
        body += data
        if len(body) > MAX_RESPONSE_BYTES:
            raise UpstreamError.ours(502, f"the model server's response is larger than "
                                          f"{MAX_RESPONSE_BYTES // 2**20} MiB", "upstream_too_large")
    return bytes(body)


async def drained(response: aiohttp.ClientResponse, wait: float = 2.0, budget: int = 1 << 16) -> None:
    """The rest of a body after its last event (`[DONE]`): usually only the end of the chunked encoding, read
    so the connection goes back to the pool (released unread, aiohttp closes it, and the next round pays for a
    new one). A server that keeps sending, or keeps the body open, is given up on: the connection is closed."""
    content = response.content
    if content.at_eof():
        return
    try:
        async with asyncio.timeout(wait):
            seen = 0
            while not content.at_eof() and seen <= budget:
                seen += len(await content.readany())
    except (TimeoutError, aiohttp.ClientError):
        pass


UPSTREAM_KEY = web.AppKey("upstream", Upstream)  # the agent file's upstream, on the proxy app
ROUTED = web.RequestKey("routed_upstream", Upstream)  # an intercepted request's own (intercept/)


def upstream_for(request: web.Request, default: Upstream) -> Upstream:
    """The upstream of this request: the one interception named, else toolkeeper's own."""
    return request.get(ROUTED, default)
