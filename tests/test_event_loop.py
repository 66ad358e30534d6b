"""serve's event loop: uvloop where it is installed (the default, `auto`), asyncio's when asked (`--event-loop`),
said in the start line.

The same turn, streamed with a declared call, is answered the same on both
loops; asking for uvloop where it is not installed would be refused (it is
a dependency wherever it installs).
"""

from __future__ import annotations

import os

import pytest
from conftest import LOOKUP, YOLO, call, serving, start_toolkeeper, user, write_agent


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_streamed_turn_with_a_declared_call_is_the_same_on_either_loop(scripted, tmp_path, loop):
    write_agent(tmp_path, YOLO + LOOKUP)
    steps = ({"content": "Looking. ", "tool_calls": [call("lookup", {"word": "kiwi"})]},
             {"content": "Found: {tool_result}"})
    with serving(scripted, tmp_path, "--event-loop", loop) as tk:
        texts, descriptors = [], []
        for _ in range(12):  # the first turns open the pools; later ones must leave no descriptor behind
            scripted.script(*steps)
            stream = tk.client().chat.completions.create(model="m", messages=user(), stream=True)
            texts.append("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
            descriptors.append(len(os.listdir(f"/proc/{tk.process.popen.pid}/fd")))
        tk.close_clients()
        said = tk.process.stderr()
    assert set(texts) == {'Looking. Found: ran ["lookup", "kiwi"]'}
    assert tk.calls() == [["lookup", "kiwi"]] * 12
    # each call's pipes closed (a pooled connection may come and go: one descriptor either way)
    assert max(descriptors[-3:]) <= max(descriptors[1:4]) + 1, descriptors
    assert "Traceback" not in said


def test_the_start_line_names_the_loop(scripted, tmp_path):
    write_agent(tmp_path, YOLO + LOOKUP)
    for wanted, shown in (([], "event loop uvloop "), (["--event-loop", "asyncio"], "event loop asyncio")):
        process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, *wanted)
        try:
            assert shown in process.first_line
        finally:
            process.stop()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_declared_calls_program_is_fed_read_and_reaped_on_either_loop(loop):
    """A declared call's program is started by Popen and watched on a pidfd (uvloop's own start is a fork, 10 ms
    in a serving process): its input fed, its output read, its status seen, a killed one reaped."""
    import asyncio
    import os
    import sys
    from pathlib import Path

    import uvloop

    from toolkeeper.runners import spawn

    assert spawn.has_pidfd()  # Linux: the path tested is the pidfd one
    shout = "import sys; print(sys.stdin.read().upper()); sys.exit(3)"

    async def run() -> tuple[bytes, int, int, int]:
        child = await spawn.start([sys.executable, "-c", shout], cwd=Path("/"), env={}, with_stdin=True)
        child.stdin.write(b"kiwi")
        await child.stdin.drain()
        child.stdin.close()
        out, _, code = await child.stdout.read(), await child.stderr.read(), await child.wait()
        sleeper = await spawn.start(["/bin/sleep", "30"], cwd=Path("/"), env={}, with_stdin=False)
        os.killpg(sleeper.pid, 9)  # its own process group
        await asyncio.gather(sleeper.stdout.read(), sleeper.stderr.read())  # ended: the pipes close
        return out, code, await sleeper.wait(), sleeper.pid

    out, code, killed, pid = uvloop.run(run()) if loop == "uvloop" else asyncio.run(run())
    assert (out, code, killed) == (b"KIWI\n", 3, -9)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped, no zombie left
