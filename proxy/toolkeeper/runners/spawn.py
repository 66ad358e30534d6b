"""Starting a program with Python's own `subprocess`, on whichever event loop serve runs.

uvloop starts a process with libuv's fork(): in a serving process of a few
hundred megabytes that takes 10 ms, against 0.8 ms for `subprocess.Popen`
(vfork). So a declared call's program is started by Popen, its pipes read by
the loop (`connect_read_pipe`), and its exit seen on a pidfd (Linux 5.3 and
later): no thread, no SIGCHLD handler, the same cost on asyncio's loop and on
uvloop. Where there is no pidfd (macOS), the loop's own
`create_subprocess_exec` starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
from pathlib import Path
from typing import Any


@functools.cache
def has_pidfd() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        return False
    return True


class Child:
    """A started program as the argv runner reads it (what it uses of `asyncio.subprocess.Process`)."""

    def __init__(self, popen: subprocess.Popen, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader,
                 stdin: asyncio.StreamWriter | None, exited: asyncio.Future[int]):
        self._popen = popen
        self.pid = popen.pid
        self.stdout, self.stderr, self.stdin = stdout, stderr, stdin
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)  # a cancelled wait leaves the exit watched


async def start(argv: list[str], *, cwd: Path, env: dict[str, str], with_stdin: bool) -> Any:
    """The program running in its own session (its own process group), its output piped; OSError if it cannot
    start."""
    how = {"cwd": cwd, "env": env, "stdin": subprocess.PIPE if with_stdin else subprocess.DEVNULL,
           "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "start_new_session": True}
    if not has_pidfd():
        return await asyncio.create_subprocess_exec(*argv, **how)
    popen = subprocess.Popen(argv, **how)
    loop = asyncio.get_running_loop()
    exited = _watch_exit(loop, popen)
    try:
        stdout, stderr = await _reader(loop, popen.stdout), await _reader(loop, popen.stderr)
        stdin = None
        if popen.stdin is not None:
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, popen.stdin)
            stdin = asyncio.StreamWriter(transport, protocol, None, loop)
    except BaseException:
        kill_group(popen.pid)
        raise
    return Child(popen, stdout, stderr, stdin, exited)


def kill_group(pid: int) -> None:
    """The program and everything it started (its session's process group), if still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _PipeProtocol(asyncio.StreamReaderProtocol):
    def eof_received(self) -> bool:
        super().eof_received()
        return False  # a pipe has no half-close: its transport closes (uvloop's stays open on True)


async def _reader(loop: asyncio.AbstractEventLoop, pipe: Any) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: _PipeProtocol(reader), pipe)
    return reader


def _watch_exit(loop: asyncio.AbstractEventLoop, popen: subprocess.Popen) -> asyncio.Future[int]:
    """A future of the exit status, set when the pidfd turns readable (the process ended; reaped then)."""
    exited: asyncio.Future[int] = loop.create_future()
    pidfd = os.pidfd_open(popen.pid)

    def ended() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(popen.pid, 0)  # it has ended: this does not block
            popen.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped by someone else: its status is lost
            popen.returncode = 255
        if not exited.done():
            exited.set_result(popen.returncode)

    loop.add_reader(pidfd, ended)
    return exited
