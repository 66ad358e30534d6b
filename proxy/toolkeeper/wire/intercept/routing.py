"""What `toolkeeper intercept`'s two sides agree on: which requests go to toolkeeper, and how they are signed.

Imported by toolkeeper (`toolkeeper.wire.intercept`) and by the mitmproxy
addon beside it (addon.py), which mitmdump runs in mitmproxy's own
environment, where toolkeeper is not installed: this module imports nothing
but the standard library, and the addon finds it on the folder mitmdump puts
on `sys.path`.
"""

from __future__ import annotations

import hashlib
import hmac
import re

HEADER = "X-Toolkeeper-Upstream"  # the signed upstream: "<url> <unix time> <hex HMAC-SHA256 of url\ntime>"
OWN_HEADERS = "x-toolkeeper-"  # the prefix of headers meant for toolkeeper alone: never forwarded, never trusted
ENDPOINTS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
# The requests toolkeeper answers for each API: method, and a pattern the end of the path must match.
TOOLKEEPER_PATHS = {
    "chat": (("POST", r"/chat/completions"),),
    "responses": (("POST", r"/responses"), ("GET", r"/responses/[A-Za-z0-9_-]+")),
    "messages": (("POST", r"/messages"), ("POST", r"/messages/count_tokens")),
}
# A plain host name, lowercased: never an address, userinfo or an escape.
HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def sign(secret: str, url: str, now: float) -> str:
    """The header's value for `url` at `now`. `now` must be a finite number (OverflowError otherwise)."""
    stamp = str(int(now))
    signature = hmac.new(secret.encode(), (url + "\n" + stamp).encode(), hashlib.sha256).hexdigest()
    return f"{url} {stamp} {signature}"


def host_matches(pattern: str, host: str) -> bool:
    """A routed host pattern (`api.openai.com`, `*.openai.azure.com`) against a lowercased host name."""
    return host.endswith(pattern[1:]) if pattern.startswith("*.") else host == pattern
