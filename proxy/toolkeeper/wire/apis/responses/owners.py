"""Whose a stored response is, when the model server cannot tell: toolkeeper answers for it.

With `api_key_env`, every agent's request reaches the model server with
toolkeeper's one key; a JWT agent's token is held back (wire/guard.py), so the
server sees no key of the user's. Either way the server takes every tenant for
one client: whoever learns a response id could read it (the declared calls its
owner never saw included) or continue its chain. So each response id
toolkeeper hands a tenant is recorded as the tenant's (a link: adapter.py), and
one it did not hand to this tenant is answered here as OpenAI answers an id it
does not have, never sent on:

    GET, DELETE /v1/responses/{id}, its /input_items, /cancel        404 No response found with id '...'.
    previous_response_id: POST /v1/responses, /compact, /input_tokens    400 previous_response_not_found

(For `previous_response_id` OpenAI answers 400 `previous_response_not_found`,
not 404: clients such as Codex read that code to resend their whole input.)
With the agent's own key going upstream, the model server keeps each key to
its own responses: none of this applies, and an id's link only keeps the
session its chain is in.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.wire.endpoints import normalised, under_v1
from toolkeeper.wire.guard import SUBJECT_TOKEN
from toolkeeper.wire.upstream import Upstream

# Under /v1 (or a prefix: Azure's /openai/...), a stored response or a part of it: its id, and what follows.
STORED = re.compile(r"(?:.+/)?responses/([^/]+)(/.*)?", re.IGNORECASE)
# Endpoints under /responses/ that are no id, and whose body may name a stored response (`previous_response_id`).
NAMING_BODY = frozenset({"compact", "input_tokens"})


def shared_key(request: web.Request, upstream: Upstream) -> bool:
    """Whether the model server takes this request's tenant for every other: toolkeeper's own key goes in place
    of the agent's, or the agent's credential was a token toolkeeper held back. (An intercepted request goes to
    its own server with its own key: `upstream` then holds none.)"""
    return upstream.api_key is not None or SUBJECT_TOKEN in request


def named_in_path(path: str, method: str) -> str | None:
    """The response id a path the catch-all passes on names ("" for a POST to an endpoint whose body may name
    one: `NAMING_BODY`), or None."""
    found = STORED.fullmatch(under_v1(normalised(path)))
    if found is None or method == "OPTIONS":  # a preflight carries no credentials, and reads nothing
        return None
    if found.group(1) in NAMING_BODY and found.group(2) is None and method == "POST":
        return ""
    return found.group(1)


def previous_in(raw: bytes) -> tuple[Any, dict[str, Any] | None]:
    """The `previous_response_id` a body names, and the body as toolkeeper read it (None: not a JSON object it
    reads: another parser may read it otherwise, so it never goes on unread)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    return body.get("previous_response_id"), body


def response_not_found(response_id: str) -> web.Response:
    return _error(404, f"No response found with id '{response_id[:200]}'.", None, None)


def previous_not_found(response_id: str) -> web.Response:
    return _error(400, f"Previous response with id '{response_id[:200]}' not found.", "previous_response_id",
                  "previous_response_not_found")


def _error(status: int, message: str, param: str | None, code: str | None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
