"""The argv runner: a process started from its argv, never through a shell.

Each run gets its own process group, so a timeout or a cancelled request (the
agent disconnected) kills the program and everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from pathlib import Path
from typing import Any

from toolkeeper.common import dumps
from toolkeeper.runners import spawn
from toolkeeper.runners.base import OutputBuffer, RunResult, Status, tool_environment
from toolkeeper.runners.reaper import Reaper
from toolkeeper.tools import DeclaredTool

READ_CHUNK = 64 * 1024


class ArgvRunner:
    def __init__(self) -> None:
        self.reaper = Reaper()

    def close(self) -> None:
        self.reaper.close()

    async def run(self, tool: DeclaredTool, argv: list[str], values: dict[str, Any]) -> RunResult:
        spec = tool.spec
        stdout, stderr = OutputBuffer(spec.max_output), OutputBuffer(max(256, spec.max_output // 4))
        started = time.monotonic()
        try:
            # its own session, so its own process group, killed as one
            process = await spawn.start(argv, cwd=tool.workdir, env=tool_environment(tool),
                                        with_stdin=spec.stdin == "json")
        except OSError as exc:
            return RunResult("error", None, stdout, stderr, time.monotonic() - started,
                             why_not_started(exc, argv[0], tool.workdir))

        self.reaper.watch(process.pid)
        readers = asyncio.gather(_drain(process.stdout, stdout), _drain(process.stderr, stderr))
        stdin = dumps(values) if spec.stdin == "json" else None
        try:
            try:
                # writing the input counts: a program that never reads it must not hold the call past its time
                await asyncio.wait_for(_feed_and_wait(process, stdin), spec.timeout)
            except TimeoutError:
                spawn.kill_group(process.pid)
                await process.wait()
                await _finish_reading(readers)
                return RunResult("timeout", None, stdout, stderr, time.monotonic() - started, f"{spec.timeout:g} s")
            # Whatever the program left running in its group goes with it, and
            # would otherwise hold the pipes open.
            spawn.kill_group(process.pid)
            await _finish_reading(readers)
        except BaseException:
            # cancelled (the agent went away) or failed: leave no process behind
            spawn.kill_group(process.pid)
            readers.cancel()
            raise
        finally:
            self.reaper.forget(process.pid)
        status: Status = "ok" if process.returncode == 0 else "failed"
        return RunResult(status, process.returncode, stdout, stderr, time.monotonic() - started)


async def _drain(stream: asyncio.StreamReader | None, buffer: OutputBuffer) -> None:
    if stream is None:
        return
    while chunk := await stream.read(READ_CHUNK):
        buffer.feed(chunk)


async def _feed_and_wait(process: spawn.Child, stdin: bytes | None) -> None:
    if stdin is not None:
        await _feed_stdin(process, stdin)
    await process.wait()


def why_not_started(exc: OSError, program: str, workdir: Path) -> str:
    """Why a program could not start, in words that name the fix (the OS says only "No such file")."""
    path = workdir / program if "/" in program else None
    if exc.errno == errno.ENOENT and path is not None and path.is_file():
        with contextlib.suppress(OSError), path.open("rb") as handle:
            first = handle.readline(256).decode(errors="replace").strip()
            if first.startswith("#!"):
                return f"{program}: its interpreter line names a program that does not exist ({first})"
    if exc.errno == errno.ENOEXEC:
        return f"{program}: not an executable format (a script needs a #! line naming its interpreter)"
    if exc.errno == errno.EACCES:
        return f"{program}: permission denied (is it executable?)"
    return f"{program}: {exc.strerror or exc}"


async def _feed_stdin(process: spawn.Child, data: bytes) -> None:
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
