"""Requests that `toolkeeper intercept` re-routed from an agent's HTTPS traffic: their upstream, in a signed header.

mitmproxy's addon (addon.py) sends each intercepted model request here with

    X-Toolkeeper-Upstream: <url> <unix time> <signature>

where the signature is the hex HMAC-SHA256 of "<url>\\n<unix time>" under the
secret `toolkeeper intercept` gave both at start (TOOLKEEPER_INTERCEPT_SECRET).
Such a request goes to that upstream, not the agent file's, with the agent's
own key as it came. The header is refused (400, in the API's error shape, and
nothing is forwarded) when toolkeeper runs without a secret, when it is not
signed with it, older than `MAX_AGE`, or names a host interception does not
route: toolkeeper can never be made an open relay. No `X-Toolkeeper-*`
header is ever forwarded to a model server (upstream.forward_headers). The
header's name and signature are routing.py's, which the addon imports too.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from toolkeeper.wire.errors import shape_of
from toolkeeper.wire.intercept.routing import HEADER, sign
from toolkeeper.wire.upstream import ROUTED, UPSTREAM_KEY

MAX_AGE = 120.0  # seconds: a signed header is made for one request, now

class InterceptedUpstream:
    """`own`: the paths toolkeeper answers for itself (probes, /toolkeeper/); a re-routed request for one of them
    is the model server's, and goes to `elsewhere` (what toolkeeper does with any other endpoint)."""

    def __init__(self, secret: str | None, routed: tuple[str, ...], *, own: tuple[str, ...] = (),
                 elsewhere: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None):
        self.secret = secret
        self.routed = frozenset(origin.rstrip("/") for origin in routed)  # scheme://host[:port] interception routes
        self.own = own
        self.elsewhere = elsewhere

    def upstream_of(self, value: str) -> str:
        """The upstream URL a header names; raises ValueError saying why it is refused."""
        if not self.secret:
            raise ValueError(f"{HEADER} is accepted only from `toolkeeper intercept`")
        try:
            url, stamp, signature = value.strip().split(" ")
            if not math.isfinite(float(stamp)):  # inf, nan, 1e400: no time, and no integer to sign
                raise ValueError(stamp)
            expected = sign(self.secret, url, float(stamp)).rsplit(" ", 1)[1]
        except ValueError:
            raise ValueError(f"{HEADER} is malformed") from None
        if not hmac.compare_digest(signature.encode(), expected.encode()):
            raise ValueError(f"{HEADER} is not signed by this toolkeeper's interception")
        if abs(time.time() - float(stamp)) > MAX_AGE:
            raise ValueError(f"{HEADER} is stale")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{HEADER} is malformed") from None
        if parts.username is not None or parts.password is not None or not self._routes(parts.scheme, parts.hostname,
                                                                                        port):
            raise ValueError(f"{HEADER} names {parts.scheme}://{parts.netloc}, which interception does not route")
        return url

    def _routes(self, scheme: str, host: str | None, port: int | None) -> bool:
        """An origin interception routes: by scheme, host name and port, never by the text of a netloc."""
        if scheme not in ("http", "https") or not host:
            return False
        default = 443 if scheme == "https" else 80
        for origin in self.routed:
            routed = urlsplit(origin)
            pattern = routed.hostname or ""  # lowercased, an IPv6 literal without its brackets
            same_host = host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:]))
            if routed.scheme == scheme and same_host and (routed.port or default) == (port or default):
                return True
        return False

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        value = request.headers.get(HEADER)
        if value is None:
            return await handler(request)
        try:
            url = self.upstream_of(value)
        except ValueError as exc:
            return shape_of(request.path).refusal(400, str(exc), "upstream_not_allowed")
        request[ROUTED] = request.app[UPSTREAM_KEY].at(url)
        if self.elsewhere is not None and request.path.startswith(self.own):
            return await self.elsewhere(request)
        return await handler(request)

