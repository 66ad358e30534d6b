"""The agents' own tool hooks: what each sends on its hook's stdin, and how it reads the hook's answer.

The one place that knows these formats; `toolkeeper hook AGENT` (cli/hooks.py)
and `POST /toolkeeper/hooks` (hooks_api.py) both read events here, and only the
command renders answers. Verified against the agents themselves, not their docs
alone:

    claude-code   Claude Code 2.1.197: PreToolUse, PostToolUse, PostToolUseFailure (strings of its binary:
                  `hook_event_name:"PreToolUse",tool_name:e,tool_input:n,tool_use_id:t`, the PreToolUse
                  `hookSpecificOutput` schema with `permissionDecision` allow|deny|ask|defer)
    gemini-cli    Gemini CLI 0.61.0: BeforeTool, AfterTool (its bundle: `fireBeforeToolEvent`,
                  `DefaultHookOutput.isBlockingDecision`, `isAskDecision`; docs/hooks/reference.md)
    codex         Codex CLI 0.169.0: PreToolUse, PostToolUse (the JSON schemas in its binary,
                  `pre-tool-use.command.input`/`.output`, and its parser's refusals:
                  "PreToolUse hook returned unsupported permissionDecision:allow", "...:ask")

Every agent treats a hook that crashes (an exit status other than 0 or 2) or
prints what it cannot parse as no hook: the call goes ahead. So a deny is always
the agent's documented JSON on stdout with exit status 0, never a crash.

"defer" (no rule decided the call) is no decision: the hook prints nothing and
exits 0, which each agent reads as a hook with no opinion, so its own permission
flow decides. Not Claude Code's own `permissionDecision: "defer"`: in 2.1.197
that pauses a `claude -p` session at the call for its host to resume later
(`hook_deferred_tool`, "defer is print-mode only"; ignored interactively).
Codex 0.169.0's schema has no such value (allow|deny|ask), and its parser takes
an empty stdout as no output. Gemini CLI (not installed here; its source,
packages/core/src/hooks/hookRunner.ts and scheduler/scheduler.ts) parses a
hook's stdout only when it is not empty, and its scheduler acts only on a
deny/block (before its policy check) or an ask (forcing its prompt): its
`decision: "allow"` grants nothing either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from toolkeeper.common import canonical_json, digest, nesting, printable

HOOK_AGENTS = ("claude-code", "gemini-cli", "codex")
HOOK_DECISIONS = ("allow", "deny", "ask", "defer")  # defer: no rule decided, the agent's own flow applies
# whose hook can hand an ask to a person; the others' ask is rendered as a deny (see render), which the server
# may record as one instead of delegating
HOOK_AGENTS_THAT_ASK = ("claude-code",)
MAX_NESTING = 64  # of a tool's input or output: far deeper than any agent's tool, and within what is recorded

# hook_event_name -> phase, per agent
EVENTS: dict[str, dict[str, Literal["pre", "post"]]] = {
    "claude-code": {"PreToolUse": "pre", "PostToolUse": "post", "PostToolUseFailure": "post"},
    "gemini-cli": {"BeforeTool": "pre", "AfterTool": "post"},
    "codex": {"PreToolUse": "pre", "PostToolUse": "post"},
}
# Said instead of a person's question where the agent cannot ask one from a hook (see render)
NEEDS_A_PERSON = "a person must approve this call, and {agent}'s hook cannot ask one"


class HookFormatError(ValueError):
    """The event is not what this agent's hook receives; the message says what is wrong."""


@dataclass(frozen=True)
class HookEvent:
    agent: str  # one of HOOK_AGENTS
    phase: Literal["pre", "post"]
    tool: str  # as the agent names it: "Bash", "run_shell_command", "mcp__server__tool"
    arguments: Any  # the tool's input, a JSON object normally
    call_id: str  # joins the pre and the post event of one call
    session: str = ""
    cwd: str | None = None
    result: Any = None  # post only: what the tool returned (for a failure: {"error": ..., ...})
    error: str | None = None  # post only: the agent says the tool failed, and why


def read_event(agent: str, event: Any) -> HookEvent:
    """The event an agent's hook received on stdin (parsed JSON), or HookFormatError saying what is wrong."""
    if agent not in EVENTS:
        raise HookFormatError(f"no hook format is known for {agent!r} (known: {', '.join(HOOK_AGENTS)})")
    if not isinstance(event, dict):
        raise HookFormatError(f"a {agent} hook event is a JSON object, not {type(event).__name__}")
    name = event.get("hook_event_name")
    phases = EVENTS[agent]
    if name not in phases:
        others = [other for other, names in EVENTS.items() if name in names and other != agent]
        hint = f" ({name} is what {' and '.join(others)} send{'s' if len(others) == 1 else ''})" if others else ""
        raise HookFormatError(f"{agent} hooks receive hook_event_name {' or '.join(phases)}, not "
                              f"{printable(repr(name))}{hint}: is the hook set on the right event and agent?")
    tool = event.get("tool_name")
    if not isinstance(tool, str) or not tool:
        raise HookFormatError(f"a {name} event names its tool in `tool_name`, a non-empty string")
    if "tool_input" not in event:
        raise HookFormatError(f"a {name} event carries the tool's arguments in `tool_input`")
    session = _text(event, "session_id", name) or ""
    arguments = event["tool_input"]
    phase = phases[name]
    result, error = _outcome(agent, name, event) if phase == "post" else (None, None)
    if nesting(arguments, MAX_NESTING) > MAX_NESTING or nesting(result, MAX_NESTING) > MAX_NESTING:
        raise HookFormatError(f"a {name} event whose tool input or output nests more than {MAX_NESTING} levels deep")
    return HookEvent(agent=agent, phase=phase, tool=tool, arguments=arguments,
                     call_id=_call_id(event, name, session, tool, arguments), session=session,
                     cwd=_text(event, "cwd", name), result=result, error=error)


def _text(event: dict[str, Any], key: str, name: str) -> str | None:
    value = event.get(key)
    if value is not None and not isinstance(value, str):
        raise HookFormatError(f"`{key}` of a {name} event is a string, not {type(value).__name__}")
    return value


def _call_id(event: dict[str, Any], name: str, session: str, tool: str, arguments: Any) -> str:
    """Claude Code and Codex give the model's tool_use_id; Gemini CLI gives none, so the call is known by what
    it is: two identical calls in one session share an id, and their pre and post events pair in order."""
    given = _text(event, "tool_use_id", name)
    if given:
        return given
    try:
        encoded = canonical_json(arguments).decode()
    except (TypeError, ValueError) as exc:
        raise HookFormatError(f"the `tool_input` of a {name} event cannot be read as JSON: {exc}") from None
    return digest(session, tool, encoded)


def _outcome(agent: str, name: str, event: dict[str, Any]) -> tuple[Any, str | None]:
    """A post event's (result, error): Claude Code reports a failure as its own event, Gemini CLI as an `error`
    inside `tool_response` ({llmContent, returnDisplay, error: {message, type}})."""
    if name == "PostToolUseFailure":
        error = event.get("error")
        error = error if isinstance(error, str) else "the tool failed" if error is None else json.dumps(error)
        return {"error": error, "is_interrupt": bool(event.get("is_interrupt"))}, error
    if "tool_response" not in event:
        raise HookFormatError(f"a {name} event carries what the tool returned in `tool_response`")
    result = event["tool_response"]
    if agent == "gemini-cli" and isinstance(result, dict) and result.get("error"):
        failure = result["error"]
        message = failure.get("message") if isinstance(failure, dict) else failure
        return result, str(message or "the tool failed")
    return result, None


def render(event_agent: str, phase: str, decision: str, reason: str) -> tuple[str, int]:
    """What the hook prints and its exit status, exactly as `event_agent` reads a hook's answer.

    The reason is shown to people (and the model), so its control characters are escaped. A post event
    cannot be undone: every agent gets a quiet success. A defer is no decision: nothing printed, exit 0.
    """
    if event_agent not in EVENTS:
        raise ValueError(f"no hook format is known for {event_agent!r}")
    if phase not in ("pre", "post") or decision not in HOOK_DECISIONS:
        raise ValueError(f"cannot render phase {phase!r} with decision {decision!r}")
    if phase == "post" or decision == "defer":  # said by saying nothing (see the module's docstring)
        return "", 0
    reason = printable(reason).strip() or f"toolkeeper decided {decision}"
    if event_agent == "claude-code":
        return _claude_code(decision, reason), 0
    if event_agent == "codex":
        return _codex(decision, reason), 0
    return _gemini_cli(decision, reason), 0


def _claude_code(decision: str, reason: str) -> str:
    # allow skips Claude Code's own permission prompt, ask shows it with the reason, deny tells the model why
    return _json({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": decision,
                                         "permissionDecisionReason": reason}})


def _codex(decision: str, reason: str) -> str:
    # Codex 0.169.0 refuses permissionDecision allow (without updatedInput) and ask as invalid output, and runs
    # the call as if there were no hook: allow is said by saying nothing (its own approval policy still applies),
    # and ask, which no person could answer, is the safe deny. A deny needs a non-empty reason.
    if decision == "allow":
        return ""
    if decision == "ask":
        reason = f"{NEEDS_A_PERSON.format(agent='Codex')}: {reason}"
    return _json({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                         "permissionDecisionReason": reason}})


def _gemini_cli(decision: str, reason: str) -> str:
    # Gemini CLI 0.61.0 reads an undocumented "ask" as its confirmation prompt, but headless (`gemini -p`)
    # nothing answers that prompt and the session waits until it is stopped: ask is the safe deny. Its allow
    # grants nothing: its scheduler acts only on deny/block and ask, so its own policy engine still decides.
    if decision == "allow":
        return _json({"decision": "allow"})
    if decision == "ask":
        reason = f"{NEEDS_A_PERSON.format(agent='Gemini CLI')}: {reason}"
    return _json({"decision": "deny", "reason": reason})


def _json(value: dict[str, Any]) -> str:
    # ASCII: whatever the hook's locale, what the agent parses is the same bytes
    return json.dumps(value, ensure_ascii=True)
