"""The reaper: a tool's process group never outlives toolkeeper, even a toolkeeper killed with SIGKILL.

A tool runs in its own process group, so a timeout or a cancelled request
kills it whole; but a killed toolkeeper kills nothing. So a small helper
process, in a session of its own, reads on its stdin the groups toolkeeper
starts (`+PGID`) and ends (`-PGID`). When its stdin closes, which happens
however toolkeeper stopped, it kills every group still listed, and exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading


class Reaper:
    """toolkeeper's side: the helper starts on first use."""

    def __init__(self) -> None:
        self._helper: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def watch(self, pgid: int) -> None:
        self._tell(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        self._tell(f"-{pgid}\n")

    def close(self) -> None:
        """Let the helper go (it kills what is still listed): for a process that runs tools only for a while."""
        with self._lock:
            if self._helper is not None:
                self._helper.stdin.close()  # type: ignore[union-attr]
                self._helper.wait()
                self._helper = None

    def _tell(self, line: str) -> None:
        with self._lock:
            if self._helper is None or self._helper.poll() is not None:
                # this file run as a script: the helper needs nothing of toolkeeper, and starts in milliseconds
                self._helper = subprocess.Popen([sys.executable, "-I", __file__], stdin=subprocess.PIPE,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                start_new_session=True)
            with contextlib.suppress(OSError):
                self._helper.stdin.write(line.encode())  # type: ignore[union-attr]
                self._helper.stdin.flush()  # type: ignore[union-attr]


def main() -> None:
    # toolkeeper's terminal or process group may be signalled as a whole: stay until its pipe closes
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        text = line.decode(errors="replace").strip()
        if text[:1] in "+-" and text[1:].isdigit():
            (groups.add if text[0] == "+" else groups.discard)(int(text[1:]))
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


if __name__ == "__main__":
    main()
