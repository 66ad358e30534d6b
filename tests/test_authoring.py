"""Writing good tools: `check` (each finding code), `schema` (what the model really receives), `eval` (success
rates on the scripted model, with the script the eval how-to ships), `model` (the scripted model as a command), and
every option's help."""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, Process, Toolkeeper, run_cli, start_toolkeeper, write_agent

EXAMPLE = ROOT / "declared" / "example"


def test_every_option_of_every_command_has_help_and_there_is_a_version():
    from toolkeeper.cli import MODULES, command_modules

    parser = argparse.ArgumentParser(prog="toolkeeper")
    commands = parser.add_subparsers(dest="command")
    for command in command_modules():
        before = set(commands.choices)
        command.add_parser(commands)  # the commands it adds are the ones its entry in MODULES names
        assert set(commands.choices) - before == set(MODULES[command.__name__.rsplit(".", 1)[1]])
    silent = []

    def walk(node: argparse.ArgumentParser, path: list[str]) -> None:
        for action in node._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            elif action.dest != "help" and not action.help:
                silent.append(f"{' '.join(path)} {action.option_strings or action.dest}")

    walk(parser, [])
    assert not silent
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("toolkeeper 0.")


# -- check ------------------------------------------------------------------------------------

BAD = """
    upstream: http://127.0.0.1:9/v1
    tools:
      - name: do_stuff
        description: Do it.
        command: [/bin/true]
      - name: service_status
        description: Report the status of one service. Use it when the user asks about a service. Returns a line.
        parameters:
          service: {type: string, enum: [a, b], description: "Which."}
        command: [/bin/echo, "{{service}}"]
      - name: service_statuses
        description: Report the status of one service. Use it when the user asks about a service. Returns a line.
        command: [/bin/true]
      - name: deploy_version
        description: Deploy a version of the product. Use it when the user asks to deploy. Returns the log.
        parameters:
          version: {type: string, description: "The version to deploy."}
          target: {type: string, enum: [prod, staging], default: staging}
          options: {type: object, description: "More."}
          a: {type: string, description: "A."}
          b: {type: string, description: "B."}
          c: {type: string, description: "C."}
          d: {type: string, description: "D."}
        command: [/bin/cat]
        stdin: json
        max_output: 1048576
      - name: evaluate_code
        description: {long}
        parameters:
          code: {type: string, description: "The code to evaluate."}
        command: [{python}, "-c", "{{code}}"]
        visibility: discoverable
"""
RULES = """
rules:
  - id: unknown-tool
    effect: deny
    reason: "never"
    when: {tool: no_such_tool}
  - id: unknown-argument
    effect: ask
    reason: "perhaps"
    when: {tool: deploy_version, arguments: {colour: {equals: red}}}
"""
CODES = {"N001", "N002", "N003", "D001", "D002", "D003", "D004", "D005", "P001", "P002", "P003", "P004",
         "S002", "C001", "C002", "R001", "R002"}


def bad_agent(tmp_path: Path) -> Path:
    long = "Evaluate a piece of code and say what it gives. Use it when the user asks to compute. Returns the value." \
           + " It is careful." * 60
    write_agent(tmp_path, BAD.replace("{long}", json.dumps(long)))
    (tmp_path / "rules.yaml").write_text(RULES)
    return tmp_path / "agent.yaml"


def test_check_finds_every_code_once_at_least_with_the_tool_the_key_the_why_and_the_fix(tmp_path):
    agent = bad_agent(tmp_path)
    done = run_cli("check", str(agent), "--policy", str(tmp_path / "rules.yaml"), "--format", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert {finding["code"] for finding in report["findings"]} == CODES
    for finding in report["findings"]:
        assert finding["why"] and finding["fix"] and finding["severity"] in ("error", "warning")
    by_code = {finding["code"]: finding for finding in report["findings"]}
    assert {"code": "P003", "tool": "service_status", "key": "parameters.service"}.items() <= next(
        f for f in report["findings"] if f["code"] == "P003" and f["tool"] == "service_status").items()
    assert by_code["C002"]["severity"] == "error" and by_code["N001"]["tool"] == "do_stuff"
    text = run_cli("check", str(agent)).stdout
    assert f"{agent}: error N001 tool 'do_stuff' key 'name': " in text and text.rstrip().endswith("warnings")


WARNED = """
    upstream: http://127.0.0.1:9/v1
    tools:
      - name: count_words
        description: Count the words of a text.
        parameters:
          text: {type: string, description: "The text."}
        command: [/usr/bin/wc, "-w", "{{text}}"]
"""  # one warning (D002): no error


def test_check_is_silent_on_the_example_and_strict_fails_on_warnings(tmp_path):
    done = run_cli("check", str(EXAMPLE / "agent.yaml"), "--policy", str(ROOT / "policies" / "default.yaml"))
    assert done.returncode == 0 and "0 errors, 0 warnings" in done.stdout, done.stdout
    write_agent(tmp_path, WARNED)
    assert run_cli("check", str(tmp_path / "agent.yaml")).returncode == 0  # warnings only
    assert run_cli("check", str(tmp_path / "agent.yaml"), "--strict").returncode == 1


def test_check_and_schema_need_no_secret(tmp_path):
    """A lint in CI has no upstream key: the variable `api_key_env` names need not be set to read the file."""
    write_agent(tmp_path, WARNED.replace("upstream: http://127.0.0.1:9/v1",
                                         "upstream: http://127.0.0.1:9/v1\n    api_key_env: TK_UNSET_KEY_FOR_TEST"))
    assert "E000" not in run_cli("check", str(tmp_path / "agent.yaml")).stdout
    assert run_cli("schema", str(tmp_path / "agent.yaml")).returncode == 0


@pytest.mark.parametrize(("text", "said"), [
    ("tools: [this is not\n", "not valid YAML"),
    ("tools:\n  - {name: pick_target, description: Pick. Returns it., command: [/bin/echo, '{{t}}'],\n"
     "     parameters: {t: {type: string, enum: [a, b], default: c, description: The target.}}}\n",
     "the default 'c' is not one of the enum's values"),
])
def test_check_reports_a_file_that_does_not_load(tmp_path, text, said):
    (tmp_path / "agent.yaml").write_text(text)
    done = run_cli("check", str(tmp_path / "agent.yaml"), "--format", "json")
    assert done.returncode == 1
    (finding,) = json.loads(done.stdout)["findings"]
    assert finding["code"] == "E000" and said in finding["why"]


def test_serve_refuses_the_errors_and_logs_the_warnings_once(scripted, tmp_path):
    agent = bad_agent(tmp_path)
    done = run_cli("serve", str(agent), "--port", "0", "--upstream", scripted.base_url)
    assert done.returncode == 2 and "error N001 tool 'do_stuff'" in done.stderr and "toolkeeper check" in done.stderr
    write_agent(tmp_path, WARNED)
    process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url)
    said = process.stop()
    assert said.count("warning D002 tool 'count_words'") == 1


# -- schema -----------------------------------------------------------------------------------

SCHEMA_AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
      - name: release_version
        description: Publish a release. Use it when the user asks to ship. Returns the log.
        parameters:
          version: {type: string, pattern: '^\\d+\\.\\d+\\.\\d+$', description: "The version, like 1.4.2."}
        command: [/bin/echo, "{{version}}"]
      - name: rotate_logs
        description: Rotate the logs of a service. Use it when the user asks to rotate logs. Returns a line.
        command: [/bin/true]
        visibility: discoverable
        keywords: [logs, rotate]
"""
REQUESTS = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hello"}]}),
    "responses": ("/v1/responses", {"model": "m", "input": "hello"}),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}),
}


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_schema_is_exactly_what_the_model_receives(scripted, tmp_path, api):
    write_agent(tmp_path, SCHEMA_AGENT)
    printed = run_cli("schema", str(tmp_path / "agent.yaml"), "--api", api)
    assert printed.returncode == 0, printed.stderr
    process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url)
    try:
        scripted.script({"content": "hi"})
        path, body = REQUESTS[api]
        request = urllib.request.Request(process.url.removesuffix("/v1") + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "x-api-key": "k",
                                                  "anthropic-version": "2023-06-01", "Authorization": "Bearer k"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        received = scripted.bodies()[-1]["tools"]
    finally:
        process.stop()
    assert json.loads(printed.stdout) == received
    names = [entry.get("name") or entry["function"]["name"] for entry in received]
    assert names == ["release_version", "search_tools"]  # the discoverable tool is found through the search


def test_schema_style_overrides_the_files_own(tmp_path):
    write_agent(tmp_path, SCHEMA_AGENT)
    plain = json.loads(run_cli("schema", str(tmp_path / "agent.yaml")).stdout)
    standard = json.loads(run_cli("schema", str(tmp_path / "agent.yaml"), "--style", "standard").stdout)
    assert plain != standard
    assert standard[0]["function"]["parameters"]["properties"]["version"].get("pattern")


# -- model and eval ---------------------------------------------------------------------------

EVAL_MODEL = EXAMPLE / "eval-model.yaml"  # the script docs/how-to/measure-your-tools-with-eval.md runs


def model(script: Path) -> Process:
    return Process([sys.executable, "-m", "toolkeeper", "model", "--script", str(script), "--port", "0"],
                   "scripted model listening on")


def test_eval_on_the_scripted_model_gives_the_table_and_the_json(tmp_path):
    server = model(EVAL_MODEL)
    try:
        done = run_cli("eval", str(EXAMPLE / "eval.yaml"), "--base-url", server.url, "--model", "scripted",
                          "--runs", "2", "--json", str(tmp_path / "report.json"), cwd=tmp_path, timeout=300)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: re.findall(r"\d+/\d+", line) for line in done.stdout.splitlines()[3:10]}
    assert rows["release-en"] == ["2/2", "2/2"]  # declared, skill
    assert rows["release-fr"] == ["0/2", "0/2"]  # a packed argument: an invalid call, which never runs
    assert rows["status-fr"] == ["2/2", "0/2"]
    assert rows["total"] == ["10/12", "2/12"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["model"] == "scripted" and report["stopped"] is None and len(report["runs"]) == 24
    french = next(run for run in report["runs"] if run["case"] == "release-fr" and run["mode"] == "declared")
    assert french["argv"] is None and french["ok"] is False


def test_eval_against_a_model_that_fails_every_call_gives_zero_and_an_unreachable_one_stops(tmp_path):
    (tmp_path / "script.yaml").write_text(json.dumps([{"repeat": True, "content": "no tools today"}]))
    server = model(tmp_path / "script.yaml")
    try:
        done = run_cli("eval", str(EXAMPLE / "eval.yaml"), "--base-url", server.url, "--model", "m", "--runs",
                          "1", "--mode", "declared", "--json", str(tmp_path / "r.json"), timeout=300)
    finally:
        server.stop()
    assert done.returncode == 0 and "0/6" in done.stdout.splitlines()[-3]
    done = run_cli("eval", str(EXAMPLE / "eval.yaml"), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                      "--json", str(tmp_path / "r2.json"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "the eval stopped" in done.stderr and "release-en" in done.stdout  # the partial table
    assert json.loads((tmp_path / "r2.json").read_text())["stopped"]


@pytest.mark.parametrize(("case", "said"), [
    ("{name: a, prompt: p, tool: nope, argv: [x]}", "case 'a': key 'tool': 'nope' is not declared"),
    ("{name: a, prompt: p, tool: release, argv: [x], colour: red}", "case 'a': key 'colour': unknown key"),
    ("{name: a, prompt: p, tool: release}", "case 'a': key 'argv'"),
    ("{name: a, prompt: p, tool: release, argv: [x]}\n  - {name: a, prompt: q, tool: release, argv: [y]}",
     "case 'a': key 'name': used by two cases"),
])
def test_a_broken_cases_file_is_refused_with_the_file_the_case_and_the_key(tmp_path, case, said):
    cases = EXAMPLE / f"broken-{tmp_path.name}.yaml"
    cases.write_text(f"agent: agent.yaml\ncases:\n  - {case}\n")
    try:
        done = run_cli("eval", str(cases), "--base-url", "http://127.0.0.1:9/v1", "--model", "m")
    finally:
        cases.unlink()
    assert done.returncode == 2 and f"{cases}: {said}" in done.stderr, done.stderr


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_the_scripted_model_answers_a_steps_content_in_every_api(tmp_path, api):
    (tmp_path / "script.json").write_text(json.dumps([{"content": "Hello from the script."}]))
    server = model(tmp_path / "script.json")
    try:
        path, body = REQUESTS[api]
        request = urllib.request.Request(server.url.removesuffix("/v1") + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read().decode()
    finally:
        server.stop()
    assert "Hello from the script." in text


def ask_chat(base_url: str, messages: list[dict]) -> tuple[int, dict]:
    """One Chat Completions request: the status and the JSON body, an error's included."""
    request = urllib.request.Request(base_url + "/chat/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "m", "messages": messages}).encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_script_whose_steps_repeat_answers_every_client_and_a_used_up_one_says_how_to_keep_it(tmp_path):
    """The tutorial's script: the second client is answered as the first was (issue 28: it once got a 500)."""
    (tmp_path / "keeps.yaml").write_text(textwrap.dedent("""
        - {answering: false, repeat: true, tool_calls: [{name: greet, arguments: {who: Ada}}]}
        - {answering: true, repeat: true, content: "The tool said: {tool_result}"}
    """))
    (tmp_path / "once.yaml").write_text("- {content: once}\n")
    question = {"role": "user", "content": "Say hello to Ada."}
    keeps, once = model(tmp_path / "keeps.yaml"), model(tmp_path / "once.yaml")
    try:
        for _client in range(3):
            status, called = ask_chat(keeps.url, [question])
            call = called["choices"][0]["message"]["tool_calls"][0]
            result = {"role": "tool", "tool_call_id": call["id"], "content": "Hello, Ada!"}
            status, answered = ask_chat(keeps.url, [question, called["choices"][0]["message"], result])
            assert status == 200 and answered["choices"][0]["message"]["content"] == "The tool said: Hello, Ada!"
        assert ask_chat(once.url, [question])[0] == 200
        status, used_up = ask_chat(once.url, [question])
    finally:
        keeps.stop()
        once.stop()
    assert status == 500 and "`repeat: true`" in used_up["error"]["message"]


def test_the_scripted_model_refuses_a_script_that_is_not_a_list_of_steps(tmp_path):
    (tmp_path / "script.yaml").write_text("content: not a list\n")
    done = run_cli("model", "--script", str(tmp_path / "script.yaml"))
    assert done.returncode == 2 and "a script is a list of steps" in done.stderr


def test_toolkeeper_in_front_of_the_scripted_model_needs_no_model_at_all(tmp_path):
    """The offline first run: `toolkeeper model` as the upstream of `toolkeeper serve`."""
    server = model(EVAL_MODEL)
    tk = Toolkeeper(start_toolkeeper(EXAMPLE / "agent.yaml", server.url, "--consent", "none",
                                     "--store", str(tmp_path / "s.db"), "--audit", str(tmp_path / "a.db")), tmp_path)
    try:
        said = tk.client().chat.completions.create(model="m", messages=[
            {"role": "user", "content": "What is the status of the billing service?"}]).choices[0].message.content
    finally:
        tk.close_clients()
        tk.process.stop()
        server.stop()
    assert said == "Done."
