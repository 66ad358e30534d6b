"""What every runner shares: the `Runner` interface, its result, and bounded output.

A runner executes one declared call whose argv is already rendered and whose
run is already decided and recorded: it never decides, records, or knows the
turn. It answers with a `RunResult` the model can read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from toolkeeper.common import sha256_hex
from toolkeeper.tools import DeclaredTool, minimal_path


class OutputBuffer:
    """Keeps the head and the tail of a stream within a byte limit, and counts the rest."""

    def __init__(self, limit: int):
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        keep_head = self.limit // 2
        if len(self.head) < keep_head:
            room = keep_head - len(self.head)
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            overflow = len(self.tail) - (self.limit - keep_head)
            if overflow > 0:
                del self.tail[:overflow]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        if not self.cut:
            return head + self.tail.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        return f"{head}\n[... {self.cut:,} bytes cut by toolkeeper; {self.total:,} bytes in all ...]\n{tail}"

    def bytes(self) -> bytes:
        return bytes(self.head + self.tail)

    def digest(self) -> str:
        """The SHA-256 of what was kept: the record's `output_sha256`."""
        return sha256_hex(self.bytes())


# How a run ended; "error": it could not start (the audit record says "failed").
Status = Literal["ok", "failed", "timeout", "error"]


@dataclass
class RunResult:
    status: Status
    exit_code: int | None
    stdout: OutputBuffer
    stderr: OutputBuffer
    duration: float
    detail: str = ""
    subject: str = "command"  # or "module": what ran, in the model's words
    trap: str | None = None  # why a module was stopped, in words

    def answer(self) -> str:
        """The tool result the model reads."""
        out = self.stdout.text()
        if self.status == "ok":
            return out if out.strip() else f"(the {self.subject} succeeded and printed nothing)"
        if self.status == "timeout":
            killed = " (its whole process group killed)" if self.subject == "command" else ""
            head = f"The {self.subject} timed out after {self.detail} and was stopped{killed}."
        elif self.status == "error":
            head = f"The {self.subject} could not be started: {self.detail}"
        elif self.trap:
            head = f"The {self.subject} was stopped: {self.trap}."
        else:
            head = f"The {self.subject} failed with exit status {self.exit_code}."
        parts = [head]
        if out.strip():
            parts.append("stdout:\n" + out)
        err = self.stderr.text()
        if err.strip():
            parts.append("stderr:\n" + err)
        return "\n".join(parts)


class Runner(Protocol):
    async def run(self, tool: DeclaredTool, argv: list[str], values: dict[str, Any]) -> RunResult: ...


def declared_environment(tool: DeclaredTool) -> dict[str, str]:
    """Only the variables the tool's entry gives (values, or names passed through): nothing else leaks in."""
    if isinstance(tool.spec.env, dict):
        return dict(tool.spec.env)
    return {name: os.environ[name] for name in tool.spec.env if name in os.environ}


def tool_environment(tool: DeclaredTool) -> dict[str, str]:
    """A process also gets a minimal PATH (unless its entry gives one)."""
    return {"PATH": minimal_path(tool.spec), **declared_environment(tool)}
