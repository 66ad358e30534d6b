"""The mitmproxy addon of `toolkeeper intercept`: an agent's model requests, re-routed into toolkeeper.

mitmdump loads this file (`-s`) in mitmproxy's own environment, where toolkeeper
is not installed: it imports only routing.py beside it (mitmdump puts this
folder on `sys.path`), which toolkeeper imports too. `toolkeeper intercept`
(cli/intercept.py) sets:

    TOOLKEEPER_INTERCEPT_CONFIG   a JSON file: {"toolkeeper": "http://127.0.0.1:PORT", "routes": [[host, path,
                                  api], ...], "maps": {host: url}}
    TOOLKEEPER_INTERCEPT_SECRET   the key of the X-Toolkeeper-Upstream signature

A request to a routed host and one of its API's endpoints (POST
/chat/completions; POST /responses and GET /responses/{id}; POST /messages and
/messages/count_tokens) goes to toolkeeper, which forwards it to the original
server (or the mapped URL) named in a signed X-Toolkeeper-Upstream header. The
host is the one the client's tunnel named (what mitmproxy decrypted), checked
to be a plain host name, never the Host header alone. Every other request to a
routed or mapped host goes to toolkeeper too, which passes a data endpoint on
(`/v1/models`, files) and refuses a tool-capable one it does not govern (a
WebSocket on `/v1/responses`, `/v1/realtime`): nothing on a routed host is
tunnelled untouched. Requests to other hosts are.
The connection strategy is lazy, so a re-routed flow never connects to (or
looks up) its original host. Any X-Toolkeeper-* header an agent sends is
removed first. Responses stream through as they come. When toolkeeper does not
accept a connection, the agent gets a 502 in its API's error shape.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from urllib.parse import urlsplit

from mitmproxy import http
from routing import ENDPOINTS, HEADER, HOST_NAME, OWN_HEADERS, TOOLKEEPER_PATHS, host_matches, sign

TOOLKEEPER_API = "toolkeeper_api"  # a re-routed flow's metadata: which API it speaks

def _after_v1(path: str) -> str:
    """The path under /v1 (which a mapped URL stands for), or the path itself when it is not under /v1."""
    if path == "/v1":
        return ""
    return path[3:] if path.startswith("/v1/") else path


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
        self.secret = os.environ["TOOLKEEPER_INTERCEPT_SECRET"]
        self.routes = [(host, path or None, api) for host, path, api in config["routes"]]
        self.maps = {host: url.rstrip("/") for host, url in config["maps"].items()}

    def _route_of(self, host: str, path: str, method: str) -> tuple[str, str, str] | None:
        """(API, the path before its endpoint, the endpoint) of a request toolkeeper answers; None otherwise."""
        for pattern, exact, api in self.routes:
            if not host_matches(pattern, host):
                continue
            for verb, tail in TOOLKEEPER_PATHS[api]:
                found = re.search(f"({tail})$", path)
                if verb == method and found and (exact is None or exact == path[: found.start()] + ENDPOINTS[api]):
                    return api, path[: found.start()], found.group(1)
        return None

    def _routed(self, host: str) -> bool:
        return host in self.maps or any(host_matches(pattern, host) for pattern, _, _ in self.routes)

    def _api_of(self, host: str) -> str:
        """The API a routed host speaks, for the shape of an error the addon answers itself."""
        return next((api for pattern, _, api in self.routes if host_matches(pattern, host)), "chat")

    def _upstream(self, scheme: str, host: str, port: int, prefix: str, *, endpoint: bool = True) -> str:
        """The base URL toolkeeper sends the request under: the original server's, or the mapped one (which
        stands for the host's /v1)."""
        if host in self.maps:
            if not endpoint and not prefix:  # another request, not under /v1: the mapped server's own root
                target = urlsplit(self.maps[host])
                return f"{target.scheme}://{target.netloc}"
            return self.maps[host] + _after_v1(prefix)
        default = {"https": 443, "http": 80}.get(scheme)
        return f"{scheme}://{host}{'' if port == default else f':{port}'}{prefix}"

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        for name in [name for name in request.headers if name.lower().startswith(OWN_HEADERS)]:
            del request.headers[name]
        host = request.host.lower().rstrip(".")  # the tunnel's host: what was decrypted, and where it would go
        if not HOST_NAME.fullmatch(host):
            return  # not a plain host name (an address, userinfo, an escape): never routed, never signed
        path, _, query = request.path.partition("?")
        query = f"?{query}" if query else ""
        route = self._route_of(host, path, request.method)
        if route is not None:
            api, prefix, endpoint = route
            upstream, target = self._upstream(request.scheme, host, request.port, prefix), "/v1" + endpoint
        elif self._routed(host):  # any other request on the host: toolkeeper passes it on, or refuses it
            api, prefix = self._api_of(host), "/v1" if path == "/v1" or path.startswith("/v1/") else ""
            upstream = self._upstream(request.scheme, host, request.port, prefix, endpoint=False)
            target = path
            request.stream = True  # a data endpoint's upload streams on
        else:
            return
        flow.metadata[TOOLKEEPER_API] = api
        request.headers[HEADER] = sign(self.secret, upstream, time.time())
        self._send_to(request, "http", *self.toolkeeper, target + query)

    @staticmethod
    def _send_to(request: http.Request, scheme: str, host: str, port: int, path: str) -> None:
        request.scheme, request.host, request.port, request.path = scheme, host, port, path
        name = f"[{host}]" if ":" in host else host  # an IPv6 literal
        request.host_header = name if port in (80, 443) else f"{name}:{port}"

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
