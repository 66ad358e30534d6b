"""Consent channels: who is asked when a call's decision is "ask".

For now there are two: the terminal toolkeeper runs in, and none (every ask is a
deny the model is told about). The approvals API joins them behind the same
`Consent` interface.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from toolkeeper.tools import render_scalar


@dataclass(frozen=True)
class ConsentRequest:
    tool: str
    arguments: dict[str, Any]
    argv: list[str] = field(default_factory=list)
    agent: str = ""  # who asks: an approval is for this agent only

    def summary(self) -> str:
        args = ", ".join(f"{k}={render_scalar(v)}" for k, v in self.arguments.items())
        return f"{self.tool}({args})"


@dataclass(frozen=True)
class ConsentAnswer:
    allowed: bool
    approver: str
    reason: str = ""


class Consent(Protocol):
    can_ask: bool  # someone can answer: the policy input's `mode.interactive`

    async def ask(self, request: ConsentRequest) -> ConsentAnswer: ...


class NoConsent:
    """No one to ask: every ask is a deny."""

    can_ask = False

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        return ConsentAnswer(False, "none", "no consent channel: toolkeeper runs without a terminal and yolo is false")


class TerminalConsent:
    """Asks on the terminal toolkeeper runs in, one question at a time."""

    can_ask = True

    def __init__(self, stdin: TextIO = sys.stdin, stderr: TextIO = sys.stderr, timeout: float = 300):
        self.stdin = stdin
        self.stderr = stderr
        self.timeout = timeout
        self.always: set[str] = set()
        self._lock = asyncio.Lock()

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        if request.tool in self.always:
            return ConsentAnswer(True, "terminal", "always allowed earlier in this session")
        async with self._lock:
            if request.tool in self.always:
                return ConsentAnswer(True, "terminal", "always allowed earlier in this session")
            argv = f"\n  argv: {request.argv}" if request.argv else ""
            self.stderr.write(f"{argv}\nAllow {request.summary()}? [y]es [n]o [a]lways ")
            self.stderr.flush()
            loop = asyncio.get_running_loop()
            try:
                line = await asyncio.wait_for(loop.run_in_executor(None, self.stdin.readline), self.timeout)
            except TimeoutError:
                self.stderr.write("\n(no answer: denied)\n")
                return ConsentAnswer(False, "terminal", f"no answer within {self.timeout:g} s")
        answer = line.strip().lower()
        if answer in ("a", "always"):
            self.always.add(request.tool)
            return ConsentAnswer(True, "terminal", "always")
        if answer in ("y", "yes"):
            return ConsentAnswer(True, "terminal", "yes")
        return ConsentAnswer(False, "terminal", "the user said no")


def has_terminal() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()

