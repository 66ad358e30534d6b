"""`toolkeeper hook AGENT [--url URL] [--fail-open] [--timeout SECONDS]`: an agent's own tool hook.

The agent (Claude Code, Gemini CLI, Codex CLI) runs it before and after each of
its tool calls with the event on stdin; it asks the toolkeeper at --url (else
serve's address, found as the other commands find it) at POST /toolkeeper/hooks,
presenting $TOOLKEEPER_AGENT_KEY, and prints the answer in the agent's own
format (wire/hooks.py).

It fails closed: whatever keeps it from an answer (toolkeeper down, a timeout,
a refusal, an event it cannot read, a crash of its own) is a deny the agent
understands, because every one of these agents treats a hook that crashes or
prints what it cannot parse as no hook at all, and would run the call.
--fail-open makes those failures a warning instead. A post event cannot be
undone, so there a failure is only a line on stderr.

--timeout is a deadline for the whole answer, not for each read: a server
that trickles a byte a second would otherwise hold the hook until the agent
kills it (Gemini CLI at 60 s), and an agent runs the call of a hook it killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from toolkeeper.common import is_loopback, printable
from toolkeeper.settings import Settings, SettingsError
from toolkeeper.wire import HOOK_AGENTS, HOOK_DECISIONS, read_event, render

HOOKS = "/toolkeeper/hooks"
AGENT_KEY_VARIABLE = "TOOLKEEPER_AGENT_KEY"
MAX_ANSWER_BYTES = 1 << 20  # a decision and its reason are a few hundred bytes; a longer answer is no decision
T = TypeVar("T")


class Unanswered(Exception):
    """No decision came from toolkeeper; the message says why, for a person."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    default_url = Settings().local_url
    hook = commands.add_parser("hook", help="an agent's pre- and post-tool hook: toolkeeper decides, the agent is "
                               "answered in its own hook format")
    hook.add_argument("agent", choices=HOOK_AGENTS, metavar="AGENT",
                      help=f"whose hook event comes on stdin: {', '.join(HOOK_AGENTS)}")
    hook.add_argument("--url", help=f"toolkeeper's address (default: the host and port of --config and "
                      f"$TOOLKEEPER_HOST/PORT, else {default_url}); the agent key comes from ${AGENT_KEY_VARIABLE}")
    hook.add_argument("--fail-open", action="store_true",
                      help="when toolkeeper cannot answer, let the call go on as without the hook (with a warning "
                      "on stderr) instead of denying it")
    hook.add_argument("--timeout", type=_seconds, default=330.0, metavar="SECONDS",
                      help="seconds from the hook's start to toolkeeper's whole answer, however slowly it comes, "
                      "before failing (default 330: longer than a call may wait for a person's approval, 300 s by "
                      "default)")
    Settings.client_arguments(hook)
    hook.set_defaults(run=hook_command)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("the timeout must be more than 0 seconds")
    return value


def hook_command(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    agent = args.agent
    try:
        event = json.loads(sys.stdin.buffer.read())
        phase = read_event(agent, event).phase
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, not this agent's event
        _warn(f"cannot read the {agent} hook event: {exc}")
        return _answer(agent, "pre", "deny", f"toolkeeper cannot read this {agent} hook event ({exc}): the hook "
                                             "fails closed")
    try:
        decision, reason = ask(args, event, deadline)
    except Unanswered as exc:
        return _unanswered(args, phase, str(exc))
    except Exception as exc:  # to every agent a crashed hook is no hook: fail closed instead
        return _unanswered(args, phase, f"toolkeeper hook failed: {exc!r}")
    return _answer(agent, phase, decision, reason)


def ask(args: argparse.Namespace, event: Any, deadline: float) -> tuple[str, str]:
    """toolkeeper's (decision, reason) for the event by `deadline` (time.monotonic()), or Unanswered."""
    try:
        settings = Settings.from_arguments(args)
    except SettingsError as exc:
        raise Unanswered(f"toolkeeper's settings cannot be read ({exc})") from None
    base = (args.url or settings.local_url).rstrip("/")
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Unanswered(f"--url must be an http:// or https:// address, not {base!r}")
    headers = {"Content-Type": "application/json"}
    if settings.agent_key:
        headers["Authorization"] = f"Bearer {settings.agent_key}"
    body = json.dumps({"agent": args.agent, "event": event}).encode()
    request = urllib.request.Request(base + HOOKS, data=body, headers=headers, method="POST")  # noqa: S310 - checked
    # a proxy set for the agent's own traffic (HTTPS_PROXY) must not see the agent key on its way to this machine
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}) if is_loopback(parts.hostname) else
                                         urllib.request.ProxyHandler())
    late = f"toolkeeper at {base} did not answer within {args.timeout:g} s"
    status, body = _by_deadline(deadline, late, lambda: _exchange(opener, request, base, deadline, late))
    return _decision(base, status, body)


def _exchange(opener: urllib.request.OpenerDirector, request: urllib.request.Request, base: str, deadline: float,
              late: str) -> tuple[int, bytes]:
    """The request sent and its answer read: (status, body), or Unanswered saying why not."""
    try:
        # each read may take what is left of the deadline; _by_deadline ends the wait for all of them together
        with opener.open(request, timeout=max(deadline - time.monotonic(), 0.001)) as answer:
            return answer.status, answer.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        with exc:
            raise Unanswered(f"toolkeeper at {base} refused the hook ({exc.code}: {_error_of(exc)})") from None
    except urllib.error.URLError as exc:
        raise Unanswered(f"toolkeeper could not be reached at {base} ({exc.reason})") from None
    except TimeoutError:
        raise Unanswered(late) from None
    except OSError as exc:
        raise Unanswered(f"toolkeeper could not be reached at {base} ({exc})") from None


def _by_deadline(deadline: float, late: str, work: Callable[[], T]) -> T:
    """work()'s result, or Unanswered(late) once `deadline` has passed, however far work() has got: it runs in a
    daemon thread, which is left behind (and ends with the process) when it is late. A socket timeout alone is
    per read, and a server answering a byte at a time never trips it."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as exc:  # handed to the caller, as if work() had run there
            outcome.append((False, exc))

    worker = threading.Thread(target=run, name="toolkeeper-hook-request", daemon=True)
    worker.start()
    worker.join(max(deadline - time.monotonic(), 0))
    if not outcome:
        raise Unanswered(late)
    finished, value = outcome[0]
    if not finished:
        raise value
    return value


def _decision(base: str, status: int, body: bytes) -> tuple[str, str]:
    try:
        answer = json.loads(body) if status == 200 and len(body) <= MAX_ANSWER_BYTES else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("decision") not in HOOK_DECISIONS \
            or not isinstance(answer.get("reason", ""), str):
        shown = body[:200].decode(errors="replace")
        raise Unanswered(f"toolkeeper at {base} gave no decision (status {status}: {shown!r})")
    return answer["decision"], answer.get("reason") or ""


def _error_of(exc: urllib.error.HTTPError) -> str:
    detail = exc.read(2000).decode(errors="replace")
    with contextlib.suppress(ValueError, AttributeError):
        detail = json.loads(detail).get("error", detail)
    return str(detail) or exc.reason


def _unanswered(args: argparse.Namespace, phase: str, problem: str) -> int:
    if args.fail_open:
        _warn(f"{problem}; --fail-open: the call goes on as without the hook")
        return 0
    if phase == "post":
        _warn(f"{problem}; the call ran, and toolkeeper's record of it is not completed")
        return 0
    _warn(f"{problem}: the hook fails closed")
    return _answer(args.agent, phase, "deny", f"{problem}: the hook fails closed")


def _answer(agent: str, phase: str, decision: str, reason: str) -> int:
    text, status = render(agent, phase, decision, reason)
    if text:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    return status


def _warn(message: str) -> None:
    print(printable(f"toolkeeper hook: {message}"), file=sys.stderr)
