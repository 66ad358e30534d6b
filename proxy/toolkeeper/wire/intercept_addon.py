"""The mitmproxy addon of `toolkeeper intercept`: an agent's model requests, re-routed into toolkeeper.

mitmdump loads this file (`-s`) in mitmproxy's own environment, so it imports
nothing of toolkeeper. `toolkeeper intercept` (cli/intercept.py) sets:

    TOOLKEEPER_INTERCEPT_CONFIG   a JSON file: {"toolkeeper": "http://127.0.0.1:PORT", "routes": [[host, path,
                                  api], ...], "maps": {host: url}}
    TOOLKEEPER_INTERCEPT_SECRET   the key of the X-Toolkeeper-Upstream signature

A POST to a routed host and path (an API's endpoint: /chat/completions,
/responses, /messages) goes to toolkeeper, which forwards it to the original
server (or the mapped URL) named in a signed X-Toolkeeper-Upstream header.
Other requests to a mapped host go to its URL; everything else is untouched.
The connection strategy is lazy, so a re-routed flow never connects to (or
looks up) its original host. Any X-Toolkeeper-* header an agent sends is
removed first. Responses stream through as they come. When toolkeeper does not
accept a connection, the agent gets a 502 in its API's error shape.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import time
from urllib.parse import urlsplit

from mitmproxy import http

ENDPOINTS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
OWN_HEADERS = "x-toolkeeper-"
HEADER = "X-Toolkeeper-Upstream"
TOOLKEEPER_API = "toolkeeper_api"  # a re-routed flow's metadata: which API it speaks


def _host_matches(pattern: str, host: str) -> bool:
    return host.endswith(pattern[1:]) if pattern.startswith("*.") else host == pattern


def _error(api: str, message: str) -> bytes:
    if api == "messages":
        return json.dumps({"type": "error", "error": {"type": "api_error", "message": message}}).encode()
    return json.dumps({"error": {"message": message, "type": "api_error", "param": None,
                                 "code": "toolkeeper_unreachable"}}).encode()


class Interception:
    def __init__(self) -> None:
        with open(os.environ["TOOLKEEPER_INTERCEPT_CONFIG"], encoding="utf-8") as handle:
            config = json.load(handle)
        toolkeeper = urlsplit(config["toolkeeper"])
        self.toolkeeper = (toolkeeper.hostname or "127.0.0.1", toolkeeper.port or 80)
        self.secret = os.environ["TOOLKEEPER_INTERCEPT_SECRET"].encode()
        self.routes = [(host, path or None, api) for host, path, api in config["routes"]]
        self.maps = {host: url.rstrip("/") for host, url in config["maps"].items()}

    def _api_of(self, host: str, path: str, method: str) -> str | None:
        if method != "POST":
            return None
        for pattern, exact, api in self.routes:
            if _host_matches(pattern, host) and path.endswith(ENDPOINTS[api]) and exact in (None, path):
                return api
        return None

    def _upstream(self, scheme: str, host: str, port: int, path: str, api: str) -> str:
        """The base URL toolkeeper posts the API's endpoint under: the original server's, or the mapped one."""
        prefix = path[: -len(ENDPOINTS[api])]
        if host in self.maps:
            return self.maps[host] + (prefix[3:] if prefix.startswith("/v1") else prefix)
        default = {"https": 443, "http": 80}.get(scheme)
        return f"{scheme}://{host}{'' if port == default else f':{port}'}{prefix}"

    def _sign(self, url: str) -> str:
        stamp = str(int(time.time()))
        signature = hmac.new(self.secret, (url + "\n" + stamp).encode(), hashlib.sha256).hexdigest()
        return f"{url} {stamp} {signature}"

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        for name in [name for name in request.headers if name.lower().startswith(OWN_HEADERS)]:
            del request.headers[name]
        host = request.pretty_host
        path, _, query = request.path.partition("?")
        api = self._api_of(host, path, request.method)
        if api is not None:
            upstream = self._upstream(request.scheme, host, request.port, path, api)
            flow.metadata[TOOLKEEPER_API] = api
            request.headers[HEADER] = self._sign(upstream)
            self._send_to(request, "http", *self.toolkeeper, "/v1" + ENDPOINTS[api] + (f"?{query}" if query else ""))
        elif host in self.maps:
            target = urlsplit(self.maps[host])
            rest = path[3:] if path.startswith("/v1") else path
            base = target.path if path.startswith("/v1") else ""
            self._send_to(request, target.scheme, target.hostname or "", target.port or
                          (443 if target.scheme == "https" else 80), base + rest + (f"?{query}" if query else ""))
            request.stream = True

    @staticmethod
    def _send_to(request: http.Request, scheme: str, host: str, port: int, path: str) -> None:
        request.scheme, request.host, request.port, request.path = scheme, host, port, path
        request.host_header = host if port in (80, 443) else f"{host}:{port}"

    async def request(self, flow: http.HTTPFlow) -> None:
        """A re-routed flow whose toolkeeper does not answer gets the 502 its API would send, never a hang."""
        api = flow.metadata.get(TOOLKEEPER_API)
        if api is None or flow.response is not None:
            return
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(*self.toolkeeper), 2)
            writer.close()
        except (TimeoutError, OSError):
            flow.response = http.Response.make(
                502, _error(api, "toolkeeper is not running behind the interception proxy: the request was not sent"),
                {"Content-Type": "application/json"})

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            flow.response.stream = True  # as it comes: server-sent events, keep-alives, large bodies


addons = [Interception()]
