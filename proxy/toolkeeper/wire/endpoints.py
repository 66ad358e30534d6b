"""What toolkeeper does with a request its agent APIs do not answer: pass a data endpoint on, refuse the rest.

    POST /v1/chat/completions, /v1/responses, /v1/messages   governed: the engine answers (server.py's routes)
    /v1/models, embeddings, files, count_tokens, ...         data: passed on untouched
    a WebSocket upgrade, /v1/realtime, Assistants runs,
      batches, legacy /v1/completions with tools             tool-capable, and not governed: refused
    a path read differently than the model server reads it   refused (//v1/chat/completions, ;x, a trailing /,
                                                               ./ and ../, a backslash, a governed path in
                                                               another case)

A tool-capable endpoint is refused unless the operator lets it through by
name (`--pass-ungoverned PATH`); each one passed is logged once and counted.
An endpoint toolkeeper does not speak but that calls no tool (`/v1/responses/
compact`, `/v1/completions` without tools) is passed and counted, never
silently. Paths are compared normalised, so no spelling of a governed path
reaches the model server untouched, and the tool-capable ones are found under
any prefix (Azure's `/openai/...`, reached through `toolkeeper intercept`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from aiohttp import web

from toolkeeper.metrics import Metrics

log = logging.getLogger("toolkeeper")

# Tool-capable endpoints toolkeeper does not govern: (name, path pattern under /v1 or any prefix, methods; None:
# any). Case is ignored: a server whose routes ignore it would answer another spelling as the endpoint.
ANY_PREFIX = r"(?:.+/)?"
UNGOVERNED = (
    ("realtime", re.compile(ANY_PREFIX + r"realtime(/.*)?", re.IGNORECASE), None),  # sessions, secrets, calls, socket
    ("assistants_runs", re.compile(ANY_PREFIX + r"threads/(runs|[^/]+/runs(/.*)?)", re.IGNORECASE), ("POST",)),
    ("batches", re.compile(ANY_PREFIX + r"(batches|messages/batches)", re.IGNORECASE), ("POST",)),
    # stored chat completions: each round toolkeeper ran is one, the declared calls the agent never saw included
    ("stored_chat_completions", re.compile(ANY_PREFIX + r"chat/completions(/.*)?", re.IGNORECASE), ("GET",)),
)
WHY = {"stored_chat_completions": "a stored chat completion shows the rounds the agent never saw, the declared "
                                  "calls toolkeeper ran among them"}
# The governed APIs' paths under /v1, which the engine answers only spelled exactly so.
GOVERNED = ("chat/completions", "responses", "messages")
LEGACY_COMPLETIONS = re.compile(ANY_PREFIX + r"completions", re.IGNORECASE)
# Model endpoints toolkeeper does not speak, whose model calls no tool: passed, counted.
UNSPOKEN = (("responses_compact", re.compile(r"responses/compact")), ("completions", re.compile(r"completions")))
# Every name an ungoverned endpoint is counted by: the table's, a WebSocket, a legacy completion offering tools.
UNGOVERNED_NAMES = (*(name for name, _, _ in UNGOVERNED), "websocket", "completions_with_tools")
LEGACY_TOOLS = ("tools", "functions", "tool_choice", "function_call")  # a legacy completion that may call tools


@dataclass(frozen=True)
class Verdict:
    """What to do with one request: pass it on (`refusal` empty), or refuse it saying why; `endpoint` names it for
    the log and the metrics."""

    endpoint: str = ""
    refusal: str = ""


def normalised(path: str) -> str:
    """A path as a model server would read it: one slash between segments, no `;parameters`, `.` and `..`
    resolved (as a client library resolves them on the way out), no trailing slash."""
    kept: list[str] = []
    for segment in path.split("/"):
        segment = segment.split(";", 1)[0]
        if segment == "..":
            del kept[-1:]
        elif segment and segment != ".":
            kept.append(segment)
    return "/" + "/".join(kept)


def legacy_completion(path: str) -> bool:
    """A legacy completion's path (`/v1/completions`, Azure's `/openai/deployments/NAME/completions`)."""
    under = under_v1(normalised(path))
    return LEGACY_COMPLETIONS.fullmatch(under) is not None and not under.lower().endswith("chat/completions")


def another_spelling(path: str, raw_path: str) -> bool:
    """A path a model server may read as another: not normalised, an escaped slash, a backslash (some servers
    take it for a slash), or a governed API's path in another case."""
    if normalised(path) != path or "%2f" in raw_path.lower() or "\\" in path:
        return True
    segments = path.strip("/").split("/")
    for api in GOVERNED:  # /v1 and the API's own part compared; what follows (an id) is the server's to spell
        for spelled in (["v1", *api.split("/")], api.split("/")):
            given = segments[:len(spelled)]
            if given != spelled and [segment.lower() for segment in given] == spelled:
                return True
    return False


def under_v1(path: str) -> str:
    """The path below /v1 (the API's own part), or the path itself without its leading slash."""
    path = path.lstrip("/")
    return path[3:] if path.startswith("v1/") else path


class Endpoints:
    def __init__(self, passed: tuple[str, ...], metrics: Metrics):
        self.passed = tuple(normalised(path) for path in passed)  # --pass-ungoverned
        self.metrics = metrics
        self._said: set[str] = set()
        for name in UNGOVERNED_NAMES:  # every endpoint's series, from the start
            metrics.expect("toolkeeper_ungoverned_refused_total", endpoint=name)
            metrics.expect("toolkeeper_ungoverned_passed_total", endpoint=name)
        for name, _ in UNSPOKEN:
            metrics.expect("toolkeeper_unspoken_requests_total", endpoint=name)

    def verdict(self, request: web.Request, body: dict | None = None) -> Verdict:
        path = normalised(request.path)
        if another_spelling(request.path, request.raw_path):
            read = f"is {path!r}" if path != request.path else "is a governed path in another case"
            return Verdict("path_variant", f"toolkeeper forwards no path it reads differently from the model "
                                           f"server ({request.path!r} {read}): send the path as it is")
        name = self._ungoverned(request, under_v1(path), body)
        if name:
            if self._passes(path):
                if request.headers.get("Upgrade", "").lower() == "websocket":
                    self.metrics.count("toolkeeper_ungoverned_refused_total", endpoint=name)
                    return Verdict(name, f"--pass-ungoverned names {path}, but toolkeeper carries no WebSocket: the "
                                         "upgrade is refused (use the API over HTTP)")
                self._note(name, f"{request.method} {path} passes ungoverned (--pass-ungoverned): no rule, consent "
                                 "or record applies to the tool calls it makes", "toolkeeper_ungoverned_passed_total")
                return Verdict(name)
            self.metrics.count("toolkeeper_ungoverned_refused_total", endpoint=name)
            why = WHY.get(name, "the tool calls made there would escape its rules, consent and audit")
            return Verdict(name, f"toolkeeper does not govern {request.method} {path} ({name.replace('_', ' ')}): "
                                 f"{why}, so it is refused. An operator may let it through with --pass-ungoverned "
                                 f"{path}")
        unspoken = next((name for name, pattern in UNSPOKEN if pattern.fullmatch(under_v1(path))), None)
        if unspoken and request.method == "POST":
            self._note(unspoken, f"{path} is passed through untouched: toolkeeper does not speak this API, so its "
                                 "model gets no declared tools", "toolkeeper_unspoken_requests_total")
        return Verdict(unspoken or "")

    def _ungoverned(self, request: web.Request, path: str, body: dict | None) -> str:
        for name, pattern, methods in UNGOVERNED:
            if pattern.fullmatch(path) and (methods is None or request.method in methods):
                return name
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return "websocket"
        if legacy_completion(path) and request.method == "POST" and any(key in (body or {}) for key in LEGACY_TOOLS):
            return "completions_with_tools"
        return ""

    def _passes(self, path: str) -> bool:
        return any(path == passed or path.startswith(passed + "/") for passed in self.passed)

    def _note(self, name: str, message: str, metric: str) -> None:
        self.metrics.count(metric, endpoint=name)
        if name not in self._said:
            self._said.add(name)
            log.warning("%s", message)
