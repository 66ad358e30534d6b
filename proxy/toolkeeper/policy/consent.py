"""Consent channels: who is asked when a call's decision is "ask".

The terminal toolkeeper runs in, the approvals store (approvals.py), or none
(every ask is a deny the model is told about, with the reason it asked). What
a person is shown has its secrets redacted and its control characters
escaped: a value cannot rewrite the lines of the prompt above it.

An "always" answer covers one agent and one tool, and never a security
rule's ask: only the yolo/tier ask ("a gated tool, and yolo: false") can be
answered once for all.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from toolkeeper.common import printable
from toolkeeper.tools import render_scalar

RULE_SOURCES = ("rules", "opa", "limits")  # an ask from these is the security team's: an always answer cannot lift it


@dataclass(frozen=True)
class ConsentRequest:
    tool: str
    arguments: dict[str, Any]  # as a person may see them: secrets redacted
    argv: list[str] = field(default_factory=list)  # likewise
    agent: str = ""  # who asks: an approval is for this agent only
    args_hash: str = ""  # of the exact arguments: an approval is for these only
    reason: str = ""  # why it asks
    rule: str | None = None  # the rule that asks, when one does
    source: str = ""  # rules | opa | yolo
    agent_header: str | None = None  # the identity header the deployment set
    user: str | None = None  # the person the call is for (the principal's user): never its own approver
    user_issuer: str | None = None  # who vouched for that user (None: a trusted header, or no one)

    @property
    def rule_asks(self) -> bool:
        return self.source in RULE_SOURCES

    def summary(self) -> str:
        args = ", ".join(f"{k}={render_scalar(v)}" for k, v in self.arguments.items())
        return printable(f"{self.tool}({args})")

    def why(self) -> str:
        return printable(f"rule {self.rule}: {self.reason}" if self.rule else self.reason)


@dataclass(frozen=True)
class ConsentAnswer:
    allowed: bool
    approver: str
    reason: str = ""
    always: bool = False  # allowed by, or granting, an always answer
    approver_identity: dict[str, Any] | None = None  # the approver as the identity provider vouched for them


class Consent(Protocol):
    can_ask: bool  # someone can answer: the policy input's `mode.interactive`

    async def ask(self, request: ConsentRequest) -> ConsentAnswer: ...


class NoConsent:
    """No one to ask: every ask is a deny, and the model is told why it asked."""

    can_ask = False

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        return ConsentAnswer(False, "none", f"{request.reason.rstrip('.')}; it needs a person's approval and no "
                                            "approver was available (toolkeeper runs without a terminal or an "
                                            "approvals channel)")


def local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's user)
        return f"uid {os.getuid()}"


class TerminalConsent:
    """Asks on the terminal toolkeeper runs in, one question at a time."""

    can_ask = True

    def __init__(self, stdin: TextIO = sys.stdin, stderr: TextIO = sys.stderr, timeout: float = 300):
        self.stdin = stdin
        self.stderr = stderr
        self.timeout = timeout
        self.always: set[tuple[str, str]] = set()  # (agent, tool)
        self.who = f"{local_user()} (terminal)"  # who answers: the records say so
        self._lock = asyncio.Lock()

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        key = (request.agent, request.tool)
        async with self._lock:
            if key in self.always and not request.rule_asks:
                return ConsentAnswer(True, self.who, "always allowed earlier in this session", always=True)
            argv = f"\n  argv: {printable(str(request.argv))}" if request.argv else ""
            self.stderr.write(f"{argv}\n  why: {request.why()}\nAllow {request.summary()}? [y]es [n]o [a]lways ")
            self.stderr.flush()
            try:
                answer = await asyncio.wait_for(self._answer(), self.timeout)
            except TimeoutError:
                self.stderr.write("\n(no answer: denied)\n")
                return ConsentAnswer(False, self.who, f"no answer within {self.timeout:g} s")
        if answer == "a" and request.rule_asks:
            self.stderr.write("(a security rule asked: allowed this once, not always)\n")
            answer = "y"
        if answer == "a":
            self.always.add(key)
            return ConsentAnswer(True, self.who, "always", always=True)
        if answer == "y":
            return ConsentAnswer(True, self.who, "yes")
        return ConsentAnswer(False, self.who, "the user said no")

    async def _answer(self) -> str:
        """y, n or a; anything else asks again (a stray key is no answer)."""
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, self.stdin.readline)
            if not line:
                return "n"  # the terminal closed
            answer = {"y": "y", "yes": "y", "n": "n", "no": "n", "a": "a", "always": "a"}.get(line.strip().lower())
            if answer:
                return answer
            self.stderr.write("Please answer y (yes), n (no) or a (always): ")
            self.stderr.flush()


def has_terminal() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()
