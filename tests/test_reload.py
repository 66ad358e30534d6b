"""SIGHUP: the agent file and the rules read again without dropping a connection; a broken one is not taken."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import LOOKUP, ROOT, YOLO, Toolkeeper, call, start_toolkeeper, user, write_agent

AGENT = YOLO + LOOKUP
RULES = """
rules:
  - id: {rule}
    effect: {effect}
    reason: "the rules say {effect}"
    when: {{tool: lookup}}
"""


def records(audit) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "export", "--format", "jsonl", "--db",
                           str(audit)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    return [json.loads(line) for line in done.stdout.splitlines()]


def offered(scripted) -> list[str]:
    return [tool["function"]["name"] for tool in scripted.bodies()[-1].get("tools") or []]


def reloaded(process, scripted, tk, expect) -> None:
    """SIGHUP, then ask until the model is offered what `expect` says (the reload is done)."""
    process.popen.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while True:
        scripted.script({"content": "hello"})
        tk.client().chat.completions.create(model="m", messages=user())
        if expect(offered(scripted)):
            return
        assert time.monotonic() < deadline, offered(scripted)
        time.sleep(0.1)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sighup_takes_a_new_agent_file_and_rules_and_keeps_the_old_ones_when_broken(scripted, tmp_path, workers):
    """With workers, the supervisor passes the signal on to each."""
    write_agent(tmp_path, AGENT)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(rule="allow-lookup", effect="allow"))
    process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--policy", str(rules), "--log-level",
                               "INFO", "--workers", workers, "--consent", "none")
    tk = Toolkeeper(process, tmp_path)
    try:
        scripted.script({"tool_calls": [call("lookup", {"word": "one"})]}, {"content": "{tool_result}"})
        assert tk.client().chat.completions.create(model="m", messages=user()).choices[0].message.content
        first = records(tmp_path / "toolkeeper-audit.sqlite3")[-1]

        # a slow answer streams across the reload: its connection is not dropped
        scripted.script({"content": "a slow answer, streamed across the reload", "chunk_size": 3,
                         "chunk_delay": 0.05})
        streamed: list[str] = []
        slow = threading.Thread(target=lambda: streamed.extend(
            c.choices[0].delta.content or "" for c in tk.client().chat.completions.create(
                model="m", messages=user(), stream=True) if c.choices))
        slow.start()
        time.sleep(0.2)
        write_agent(tmp_path, AGENT + LOOKUP.replace("lookup", "define").replace("Look a word up.", "Define it."))
        rules.write_text(RULES.format(rule="deny-lookup", effect="deny"))
        slow.join(20)
        reloaded(process, scripted, tk, lambda names: "define" in names)
        assert "".join(streamed) == "a slow answer, streamed across the reload"

        scripted.script({"tool_calls": [call("lookup", {"word": "two"})]}, {"content": "{tool_result}"})
        said = tk.client().chat.completions.create(model="m", messages=user()).choices[0].message.content
        assert said.startswith("Not run: lookup was not allowed (the rules say deny)")
        second = records(tmp_path / "toolkeeper-audit.sqlite3")[-1]
        assert second["decision_rule"] == "deny-lookup"
        assert second["agent_revision"] and second["agent_revision"] != first["agent_revision"]
        assert second["policy_revision"] != first["policy_revision"]

        (tmp_path / "agent.yaml").write_text("tools: [this is not an agent file")
        process.popen.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert "reload failed, the agent file and the rules in force are kept" in process.stderr()
        scripted.script({"content": "still here"})
        assert tk.client().chat.completions.create(model="m", messages=user()).choices[0].message.content == \
            "still here"
        assert {"lookup", "define"} <= set(offered(scripted))
    finally:
        tk.close_clients()
        process.stop()


def test_sigterm_to_the_supervisor_stops_every_worker(scripted, tmp_path):
    write_agent(tmp_path, AGENT)
    process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--workers", "2", "--consent", "none")
    children = [int(pid) for pid in Path(f"/proc/{process.popen.pid}/task/{process.popen.pid}/children")
                .read_text().split()]
    assert len(children) == 2
    process.popen.send_signal(signal.SIGTERM)  # the supervisor alone, not its process group
    assert process.popen.wait(15) == 0
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    process.stop()
