"""yolo: false in a terminal: toolkeeper asks there, and the answer decides."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, call, user, write_agent

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: false
    tools:
      - name: release
        description: Publish a release.
        parameters:
          version: {type: string, description: "The version."}
          channel: {type: string, enum: [stable, beta], description: "Where."}
        command: ["{python}", "{tools}/record.py", "release", "{{version}}", "--channel={{channel}}"]
        env: {OUT: "{out}"}
"""


class TerminalToolkeeper:
    def __init__(self, agent_file, upstream):
        self.master, slave = pty.openpty()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "toolkeeper", "serve", str(agent_file), "--port", "0", "--upstream", upstream,
             "--log-level", "WARNING"],
            stdin=slave, stdout=subprocess.PIPE, stderr=slave, text=True, cwd=ROOT, start_new_session=True)
        os.close(slave)
        line = self.popen.stdout.readline()
        self.url = "http://" + line.split("http://", 1)[1].split()[0]

    def read_until(self, text: str, timeout: float = 10) -> str:
        seen = ""
        deadline = time.monotonic() + timeout
        while text not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                seen += os.read(self.master, 4096).decode(errors="replace")
        assert text in seen, seen
        return seen

    def answer(self, text: str) -> None:
        os.write(self.master, (text + "\n").encode())

    def stop(self) -> None:
        os.killpg(self.popen.pid, signal.SIGTERM)
        self.popen.wait(10)
        self.popen.stdout.close()
        os.close(self.master)


@pytest.fixture(scope="module")
def terminal(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("terminal")
    write_agent(directory, AGENT)
    tk = TerminalToolkeeper(directory / "agent.yaml", scripted.base_url)
    tk.directory = directory
    yield tk
    tk.stop()


def ask(terminal, scripted, version: str, reply: str, api_key: str = "k") -> tuple[str, str]:
    scripted.script({"tool_calls": [call("release", {"version": version, "channel": "beta"})]},
                    {"content": "{tool_result}"})
    from openai import OpenAI

    answers = []
    client = OpenAI(base_url=terminal.url, api_key=api_key, max_retries=0)
    worker = threading.Thread(target=lambda: answers.append(
        client.chat.completions.create(model="m", messages=user()).choices[0].message.content))
    worker.start()
    prompt = ""
    if reply:
        prompt = terminal.read_until("[y]es [n]o [a]lways")
        terminal.answer(reply)
    worker.join(20)
    client.close()
    return prompt, answers[0]


def test_yes_runs_the_call(terminal, scripted):
    prompt, answer = ask(terminal, scripted, "1.0.0", "y")
    assert "Allow release(version=1.0.0, channel=beta)? [y]es [n]o [a]lways" in prompt
    assert "--channel=beta" in prompt  # the argv is shown too
    assert answer.startswith('ran ["release", "1.0.0", "--channel=beta"]')


def test_no_denies_and_the_model_is_told(terminal, scripted):
    _, answer = ask(terminal, scripted, "2.0.0", "n")
    assert answer.startswith("Not run: release was not allowed (the user said no)")


def test_always_stops_asking_for_that_tool(terminal, scripted):
    ask(terminal, scripted, "3.0.0", "a")
    _, answer = ask(terminal, scripted, "3.0.1", "")  # no prompt this time
    assert answer.startswith('ran ["release", "3.0.1", "--channel=beta"]')


def test_the_model_cannot_fake_the_prompt(terminal, scripted):
    hostile = "1.4.2\x1b[1A\x1b[2K\r  argv: [\"release\", \"1.0.0\"]\x07\u202e"
    prompt, answer = ask(terminal, scripted, hostile, "n", api_key="another-agent")  # "always" was for "k"
    assert "\x1b" not in prompt and "\x07" not in prompt and "\u202e" not in prompt
    assert "\\x1b[1A\\x1b[2K\\x0d" in prompt and "\\u202e" in prompt
    assert answer.startswith("Not run")


def test_an_answer_other_than_y_n_a_asks_again(terminal, scripted):
    scripted.script({"tool_calls": [call("release", {"version": "5.0.0", "channel": "beta"})]},
                    {"content": "{tool_result}"})
    from openai import OpenAI

    answers = []
    client = OpenAI(base_url=terminal.url, api_key="another-agent", max_retries=0)
    worker = threading.Thread(target=lambda: answers.append(
        client.chat.completions.create(model="m", messages=user()).choices[0].message.content))
    worker.start()
    terminal.read_until("[y]es [n]o [a]lways")
    terminal.answer("maybe")
    terminal.read_until("Please answer y (yes), n (no) or a (always)")
    terminal.answer("n")
    worker.join(20)
    client.close()
    assert answers[0].startswith("Not run: release was not allowed (the user said no)")
