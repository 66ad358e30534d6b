"""The OpenAI built-in tools an agent runs itself, under the same rules as its function tools.

A Responses answer may hold a `shell_call`, a `local_shell_call`, an `apply_patch_call` or a `computer_call`:
the OpenAI Agents SDK runs them (`ShellTool`, `LocalShellTool`, `ApplyPatchTool`, `ComputerTool`). Each reaches
the rules as `shell`, `local_shell`, `apply_patch` or `computer`, with `tool.kind` its item type. A denied one
never reaches its executor, and the model reads why in the output item its type expects; an allowed one runs
and its output completes the record; an ask waits for `toolkeeper approve`.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.request

import pytest
from agents.computer import Computer
from conftest import STANDARD_AGENT, Toolkeeper, start_toolkeeper, write_agent
from test_agent_tools import by_call
from test_approvals import TOKEN, cli, waiting

RULES = """
rules:
  - id: no-recursive-deletes
    effect: deny
    reason: Recursive deletes are not allowed here.
    when: {source: agent, kind: shell_call, arguments: {action.commands: {matches: 'rm\\s+-rf'}}}
  - id: no-local-rm
    effect: deny
    reason: rm is not run here.
    when: {source: agent, tool: local_shell, arguments: {action.command: {matches: '^rm$'}}}
  - id: etc-is-read-only
    effect: deny
    reason: Files under /etc are not to be edited.
    when: {source: agent, tool: apply_patch, arguments: {operation.path: {matches: '^/etc/'}}}
  - id: screens-ask
    effect: ask
    reason: A person watches what the model does with the screen.
    when: {source: agent, kind: computer_call}
"""


@pytest.fixture(scope="module")
def tkb(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("builtins")
    write_agent(directory, STANDARD_AGENT, pids=str(directory / "pids"))
    (directory / "rules.yaml").write_text(RULES)
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--policy", str(directory / "rules.yaml"),
                               "--audit", str(directory / "audit.sqlite3"), "--store", str(directory / "store.sqlite3"),
                               "--consent", "approvals", "--keepalive", "0.2", env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    yield Toolkeeper(process, directory)
    process.stop()


def run_agent(tk: Toolkeeper, tools: list, prompt: str, *, streamed: bool = False) -> str:
    from agents import Agent, Runner, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def run() -> str:
        async with AsyncOpenAI(base_url=tk.base_url, api_key="sk-builtins", max_retries=0) as client:
            set_default_openai_client(client, use_for_tracing=False)
            agent = Agent(name="operator", instructions="Do what is asked.", tools=tools)
            if not streamed:
                return (await Runner.run(agent, prompt)).final_output
            result = Runner.run_streamed(agent, prompt)
            async for _ in result.stream_events():
                pass
            return result.final_output

    return asyncio.run(run())


def shell_tool(ran: list):
    from agents import ShellTool

    def execute(request) -> str:
        ran.append(list(request.data.action.commands))
        return "a.txt\nb.txt"

    return ShellTool(executor=execute)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_denied_shell_call_never_reaches_the_executor_and_the_model_reads_why(scripted, tkb, streamed):
    ran: list = []
    call_id = f"sh_rm_{streamed}"
    scripted.script({"items": [{"type": "shell_call", "call_id": call_id,
                                "action": {"commands": ["ls", "rm -rf /srv/data"], "timeout_ms": 1000}}]},
                    {"content": "I may not: {tool_result}"})
    answer = run_agent(tkb, [shell_tool(ran)], "Clean /srv/data.", streamed=streamed)
    assert ran == []
    assert "Recursive deletes are not allowed here" in answer
    record = by_call(tkb.directory, call_id)
    assert (record["tool"], record["status"], record["decision_rule"]) == ("shell", "denied", "no-recursive-deletes")
    assert record["policy_input"]["tool"]["kind"] == "shell_call"
    answered = [item for item in scripted.bodies()[1]["input"] if item.get("type") == "shell_call_output"]
    assert answered[0]["call_id"] == call_id and answered[0]["output"][0]["outcome"]["exit_code"] == 1


def test_an_allowed_shell_call_runs_and_its_output_completes_the_record(scripted, tkb):
    ran: list = []
    scripted.script({"items": [{"type": "shell_call", "call_id": "sh_ls", "action": {"commands": ["ls"]}}]},
                    {"content": "Listed: {tool_result}"})
    answer = run_agent(tkb, [shell_tool(ran)], "List the files.")
    assert ran == [["ls"]] and "a.txt" in answer
    record = by_call(tkb.directory, "sh_ls")
    assert (record["tool"], record["status"], record["source"]) == ("shell", "ok", "agent")
    assert record["output_bytes"] > 0


def test_a_local_shell_call_is_governed_as_its_argv(scripted, tkb):
    from agents import LocalShellTool

    ran: list = []

    def execute(request) -> str:
        ran.append(list(request.data.action.command))
        return "done"

    scripted.script({"items": [{"type": "local_shell_call", "call_id": "ls_rm", "id": "lsh_1",
                                "action": {"type": "exec", "command": ["rm", "-r", "/tmp/x"], "env": {}}}]},
                    {"content": "Refused: {tool_result}"})
    answer = run_agent(tkb, [LocalShellTool(executor=execute)], "Remove /tmp/x.")
    assert ran == [] and "rm is not run here" in answer
    assert by_call(tkb.directory, "ls_rm")["status"] == "denied"


class Editor:
    def __init__(self):
        self.done: list[tuple[str, str]] = []

    def create_file(self, operation):
        self.done.append(("create", operation.path))
        return "created"

    def update_file(self, operation):
        self.done.append(("update", operation.path))
        return "updated"

    def delete_file(self, operation):
        self.done.append(("delete", operation.path))
        return "deleted"


def test_an_apply_patch_call_on_a_path_the_rules_deny_is_answered_failed(scripted, tkb):
    from agents import ApplyPatchTool

    editor = Editor()
    scripted.script({"items": [{"type": "apply_patch_call", "call_id": "ap_etc",
                                "operation": {"type": "update_file", "path": "/etc/passwd", "diff": "+x"}},
                               {"type": "apply_patch_call", "call_id": "ap_ok",
                                "operation": {"type": "create_file", "path": "notes.md", "diff": "+hello"}}]},
                    {"content": "Done what I could."})
    assert run_agent(tkb, [ApplyPatchTool(editor=editor)], "Edit the files.") == "Done what I could."
    assert editor.done == [("create", "notes.md")]  # the allowed one ran, the denied one never reached it
    second = scripted.bodies()[1]["input"]
    refused = next(item for item in second if item.get("type") == "apply_patch_call_output"
                   and item["call_id"] == "ap_etc")
    assert refused["status"] == "failed" and "/etc" in refused["output"]
    assert by_call(tkb.directory, "ap_etc")["decision_rule"] == "etc-is-read-only"
    assert by_call(tkb.directory, "ap_ok")["status"] == "ok"


class Screen(Computer):
    """The agent's own computer: it only counts what it was asked to do."""

    def __init__(self):
        self.actions: list[str] = []

    @property
    def environment(self):
        return "linux"

    @property
    def dimensions(self):
        return (640, 480)

    def screenshot(self) -> str:
        return "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="

    def click(self, x, y, button):
        self.actions.append(f"click {x},{y}")

    def double_click(self, x, y):
        self.actions.append("double_click")

    def scroll(self, x, y, scroll_x, scroll_y):
        self.actions.append("scroll")

    def type(self, text):
        self.actions.append(f"type {text}")

    def wait(self):
        self.actions.append("wait")

    def move(self, x, y):
        self.actions.append("move")

    def keypress(self, keys):
        self.actions.append("keypress")

    def drag(self, path):
        self.actions.append("drag")


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_a_computer_call_asks_and_runs_only_once_approved(scripted, tkb, answer):
    from agents import ComputerTool

    screen = Screen()
    call_id = f"cu_{answer}"
    scripted.script({"items": [{"type": "computer_call", "call_id": call_id, "pending_safety_checks": [],
                                "action": {"type": "click", "x": 10, "y": 20, "button": "left"}}]},
                    {"content": "Finished."})
    answering = threading.Thread(target=lambda: _answer(tkb, answer))
    answering.start()
    assert run_agent(tkb, [ComputerTool(computer=screen)], "Click the button.") == "Finished."
    answering.join(30)
    assert screen.actions == (["click 10,20"] if answer == "approve" else [])
    record = by_call(tkb.directory, call_id)
    assert record["status"] == ("ok" if answer == "approve" else "denied")
    if answer == "deny":
        second = scripted.bodies()[1]["input"]
        assert any(item.get("type") == "computer_call_output" and item["call_id"] == call_id for item in second)


def _answer(tk: Toolkeeper, verb: str) -> None:
    [approval] = waiting(tk)
    assert cli(tk, verb, approval).returncode == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_kind_of_call_toolkeeper_does_not_know_is_denied_counted_and_never_relayed(scripted, tkb, stream):
    call_id = f"tp_{stream}"
    scripted.script({"content": "Going. ", "items": [{"type": "teleport_call", "call_id": call_id,
                                                      "destination": "mars"}]},
                    {"content": "I could not go."})
    client = tkb.client()
    if stream:
        with client.responses.stream(model="m", input="Go to Mars.") as events:
            answer = events.get_final_response()
    else:
        answer = client.responses.create(model="m", input="Go to Mars.")
    assert "teleport" not in answer.model_dump_json() and answer.output_text == "Going. I could not go."
    record = by_call(tkb.directory, call_id)
    assert (record["tool"], record["status"], record["decision_source"]) == ("teleport_call", "denied", "toolkeeper")
    told = [item for item in scripted.bodies()[1]["input"] if item.get("role") == "developer"]
    assert "does not know this kind of call (teleport_call)" in told[0]["content"]
    metrics = urllib.request.urlopen(tkb.base_url[:-3] + "/metrics", timeout=10).read().decode()
    assert 'toolkeeper_unknown_calls_total{kind="teleport_call"}' in metrics
