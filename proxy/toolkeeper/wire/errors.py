"""Every error toolkeeper answers with, in the shape of the API asked, and the one mapping from an upstream failure.

    Exception
     ├── UpstreamError       the answer a failed turn gets: the model server's status and body as they came, or
     │                       toolkeeper's own (`UpstreamError.ours`) when the server could not give one
     ├── MalformedResponse   the server's answer is not of its API's shape (ValueError)      -> 502
     └── UpstreamFailed      the server ended its answer with a failure event                 -> 502 (529 overloaded)

A model's `round` reads the server inside `UpstreamFailures()`, which turns
every foreign exception (aiohttp's, a timeout, a stream too large) into an
`UpstreamError`, as httpx's `map_httpcore_exceptions()` does. An adapter
answers one in its API's `ErrorShape`: OpenAI's for Chat Completions and
Responses, Anthropic's for Messages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from toolkeeper.store import StoreError
from toolkeeper.wire.sse import EventTooLarge

ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
                   429: "rate_limit_error", 529: "overloaded_error"}


class MalformedResponse(ValueError):
    """The model server's response is not of its API's shape; the agent gets a 502."""


class UpstreamFailed(Exception):
    """The model server ended its answer with a failure event (`response.failed`, an `error` event)."""

    def __init__(self, error: dict[str, Any], response: dict[str, Any] | None = None):
        super().__init__(error.get("message") or "the model server failed")
        self.error = error
        self.response = response


class UpstreamError(Exception):
    def __init__(self, status: int, body: bytes, content_type: str = "application/json",
                 headers: dict[str, str] | None = None):
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}  # toolkeeper's own, for the agent's client (x-should-retry)

    @classmethod
    def ours(cls, status: int, message: str, code: str = "upstream_error") -> UpstreamError:
        return cls(status, openai_body(message, code))

    @classmethod
    def limit_reached(cls, reason: str) -> UpstreamError:
        """A token budget spent: a 429 the OpenAI and Anthropic clients do not retry (`x-should-retry: false`,
        which both read): the budget will not come back within their backoff."""
        return cls(429, openai_body(reason, "limit_reached", "tokens"), headers={"x-should-retry": "false"})

    def error_object(self) -> dict[str, Any]:
        """The `error` object of the body (OpenAI's shape), or one that says what came."""
        try:
            parsed = orjson.loads(self.body)
            if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
                return parsed["error"]
        except orjson.JSONDecodeError:
            pass
        text = self.body.decode("utf-8", errors="replace")[:500]
        return {"message": f"upstream error {self.status}: {text}", "type": "upstream_error", "code": self.status}


def json_object(raw: bytes, what: str) -> dict[str, Any]:
    """A model server's JSON object (a whole answer, one stream event), or the MalformedResponse saying why not."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedResponse(f"malformed JSON in {what} ({exc})") from exc
    if not isinstance(parsed, dict):
        raise MalformedResponse(f"{what} that is not a JSON object")
    return parsed


def openai_body(message: str, code: str, kind: str = "upstream_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def anthropic_body(status: int, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"),
                                                    "message": message}})


def store_unavailable(exc: StoreError) -> UpstreamError:
    return UpstreamError.ours(503, f"toolkeeper's store did not answer: {exc}", "store_unavailable")


@dataclass(frozen=True)
class ErrorShape:
    """How one API says an error: a refusal before the turn, a failed turn, an error once the stream began."""

    anthropic: bool = False

    def refusal(self, status: int, message: str, code: str = "invalid_request",
                kind: str = "invalid_request_error") -> web.Response:
        body = anthropic_body(status, message) if self.anthropic else openai_body(message, code, kind)
        return web.Response(status=status, body=body, content_type="application/json")

    def body(self, error: UpstreamError) -> bytes:
        """A failed turn's body: the model server's own when it is already of this shape."""
        if not self.anthropic:
            return error.body
        try:
            parsed = orjson.loads(error.body)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("type") == "error":
            return error.body
        return anthropic_body(error.status, str(error.error_object().get("message") or "the model server failed"))

    def response(self, error: UpstreamError) -> web.Response:
        """A failed turn, before anything was sent: its status, and its body in this shape."""
        content_type = "application/json" if self.anthropic else error.content_type
        return web.Response(status=error.status, body=self.body(error),
                            headers={**error.headers, "Content-Type": content_type})

    def failed(self, exc: UpstreamFailed) -> UpstreamError:
        """The server's failure event as the agent's error: Anthropic's error object kept as it came."""
        if self.anthropic:
            status = 529 if exc.error.get("type") == "overloaded_error" else 502
            return UpstreamError(status, orjson.dumps({"type": "error", "error": exc.error}))
        error = {"message": exc.error.get("message") or "the model server failed", "type": "upstream_error",
                 "param": None, "code": exc.error.get("code") or "upstream_failed"}
        return UpstreamError(502, orjson.dumps({"error": error}))


OPENAI = ErrorShape()
ANTHROPIC = ErrorShape(anthropic=True)


def shape_of(path: str) -> ErrorShape:
    """The shape of the API a path belongs to: Anthropic's for /v1/messages, OpenAI's otherwise."""
    return ANTHROPIC if path.startswith(("/v1/messages", "/messages")) else OPENAI


class UpstreamFailures:
    """Every way a model server can fail one round, as the `UpstreamError` the agent gets. A class, not a
    generator: it is entered on every round, and costs nothing until something fails."""

    def __init__(self, shape: ErrorShape = OPENAI):
        self.shape = shape

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            mapped = self.failure(exc)
            if mapped is not None:
                raise mapped from exc

    def failure(self, exc: BaseException) -> UpstreamError | None:
        if isinstance(exc, UpstreamFailed):
            return self.shape.failed(exc)
        if isinstance(exc, EventTooLarge):
            return UpstreamError.ours(502, f"the model server sent {exc}", "upstream_too_large")
        if isinstance(exc, MalformedResponse):
            return UpstreamError.ours(502, f"the model server sent a malformed response: {exc}", "upstream_malformed")
        if isinstance(exc, TimeoutError):
            return UpstreamError.ours(504, "the model server did not answer in time", "upstream_timeout")
        if isinstance(exc, aiohttp.ClientPayloadError):
            return UpstreamError.ours(502, f"the model server broke off its response: {exc}")
        if isinstance(exc, aiohttp.ClientError):
            return unreachable(exc)
        return None


def unreachable(exc: Exception) -> UpstreamError:
    """A model server toolkeeper could not reach, said plainly: where, and why (never the client's internals)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        errno = getattr(exc.os_error, "errno", None)
        why = os.strerror(errno) if errno else type(exc.os_error).__name__
        return UpstreamError.ours(502, f"cannot reach the model server at {exc.host}:{exc.port}: {why}",
                                  "upstream_unreachable")
    return UpstreamError.ours(502, f"cannot reach the model server: {str(exc)[:200] or type(exc).__name__}",
                              "upstream_unreachable")
