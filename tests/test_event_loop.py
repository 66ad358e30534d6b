"""serve's event loop: uvloop where it is installed (the default, `auto`), asyncio's when asked (`--event-loop`),
said in the start line.

The same turn, streamed with a declared call, is answered the same on both
loops; asking for uvloop where it is not installed would be refused (it is
a dependency wherever it installs).
"""

from __future__ import annotations

import pytest
from conftest import LOOKUP, YOLO, call, serving, start_toolkeeper, user, write_agent


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_streamed_turn_with_a_declared_call_is_the_same_on_either_loop(scripted, tmp_path, loop):
    write_agent(tmp_path, YOLO + LOOKUP)
    steps = ({"content": "Looking. ", "tool_calls": [call("lookup", {"word": "kiwi"})]},
             {"content": "Found: {tool_result}"})
    with serving(scripted, tmp_path, "--event-loop", loop) as tk:
        scripted.script(*steps)
        stream = tk.client().chat.completions.create(model="m", messages=user(), stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        tk.close_clients()
        said = tk.process.stderr()
    assert text == 'Looking. Found: ran ["lookup", "kiwi"]'
    assert tk.calls() == [["lookup", "kiwi"]]
    assert "Traceback" not in said


def test_the_start_line_names_the_loop(scripted, tmp_path):
    write_agent(tmp_path, YOLO + LOOKUP)
    for wanted, shown in (([], "event loop uvloop "), (["--event-loop", "asyncio"], "event loop asyncio")):
        process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, *wanted)
        try:
            assert shown in process.first_line
        finally:
            process.stop()
