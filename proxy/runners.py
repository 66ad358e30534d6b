"""Runners execute a declared call; the argv runner starts a process, never a shell.

Each run gets its own process group, so a timeout or a cancelled request (the
agent disconnected) kills the program and everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from proxy.agentfile import DeclaredTool, minimal_path

READ_CHUNK = 64 * 1024


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


class ArgvRunner:
    async def run(self, tool: DeclaredTool, argv: list[str], values: dict[str, Any]) -> RunResult:
        spec = tool.spec
        stdout, stderr = OutputBuffer(spec.max_output), OutputBuffer(max(256, spec.max_output // 4))
        started = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=tool.workdir,
                env=tool_environment(tool),
                stdin=asyncio.subprocess.PIPE if spec.stdin == "json" else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as one
            )
        except OSError as exc:
            return RunResult("error", None, stdout, stderr, time.monotonic() - started, exc.strerror or str(exc))

        readers = asyncio.gather(_drain(process.stdout, stdout), _drain(process.stderr, stderr))
        try:
            if spec.stdin == "json":
                await _feed_stdin(process, orjson.dumps(values))
            try:
                await asyncio.wait_for(process.wait(), spec.timeout)
            except TimeoutError:
                _kill_group(process.pid)
                await process.wait()
                await _finish_reading(readers)
                return RunResult("timeout", None, stdout, stderr, time.monotonic() - started, f"{spec.timeout:g} s")
            # Whatever the program left running in its group goes with it, and
            # would otherwise hold the pipes open.
            _kill_group(process.pid)
            await _finish_reading(readers)
        except BaseException:
            # cancelled (the agent went away) or failed: leave no process behind
            _kill_group(process.pid)
            readers.cancel()
            raise
        status: Status = "ok" if process.returncode == 0 else "failed"
        return RunResult(status, process.returncode, stdout, stderr, time.monotonic() - started)


async def _drain(stream: asyncio.StreamReader | None, buffer: OutputBuffer) -> None:
    if stream is None:
        return
    while chunk := await stream.read(READ_CHUNK):
        buffer.feed(chunk)


async def _feed_stdin(process: asyncio.subprocess.Process, data: bytes) -> None:
    if process.stdin is None:
        return
    try:
        process.stdin.write(data)
        await process.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the program did not read its input; its exit status tells the rest
    finally:
        process.stdin.close()


async def _finish_reading(readers: asyncio.Future) -> None:
    try:
        await asyncio.wait_for(readers, 5)
    except TimeoutError:
        readers.cancel()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
