"""The agent file: every broken file stops toolkeeper with an error naming the file, tool and key."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import write_agent

from toolkeeper.tools import AgentFileError, load_agent_file, tool_schema

GOOD_TOOL = """
      - name: greet
        description: Greet someone. Returns the greeting.
        parameters:
          who: {type: string, description: "Who to greet."}
        command: ["/bin/echo", "hello", "{{who}}"]
"""


def load(tmp_path, tools: str, head: str = "upstream: http://127.0.0.1:9/v1\n"):
    path = write_agent(tmp_path, head + "tools:\n" + tools)
    return load_agent_file(path)


def error(tmp_path, tools: str, head: str = "upstream: http://127.0.0.1:9/v1\n") -> str:
    with pytest.raises(AgentFileError) as caught:
        load(tmp_path, tools, head)
    return str(caught.value)


def test_a_good_file_loads(tmp_path):
    agent = load(tmp_path, GOOD_TOOL)
    assert list(agent.tools) == ["greet"]
    assert agent.tools["greet"].template.render({"who": "Ada"}) == ["/bin/echo", "hello", "Ada"]


def test_bad_yaml(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("tools: [\n  - name: x\n")
    with pytest.raises(AgentFileError, match=rf"{path}: not valid YAML"):
        load_agent_file(path)


@pytest.mark.parametrize(("tools", "expected"), [
    (GOOD_TOOL + "        colour: blue\n", "tool 'greet': key 'colour': unknown key"),
    (GOOD_TOOL.replace("{{who}}", "{{whom}}"),
     "tool 'greet': key 'command': placeholder {{whom}} names no declared parameter"),
    (GOOD_TOOL.replace('"/bin/echo", "hello", "{{who}}"', '"{{who}}", "hello"'),
     "tool 'greet': key 'command': the program (first entry) cannot come from a placeholder"),
    (GOOD_TOOL.replace('"/bin/echo", "hello", "{{who}}"', '"/bin/bash", "-c", "echo {{who}}"'),
     "tool 'greet': key 'command': a shell running a command line (-c) with placeholders"),
    (GOOD_TOOL.replace('"/bin/echo", "hello", "{{who}}"', '"/usr/bin/env", "sh", "-ec", "echo {{who}}"'),
     "tool 'greet': key 'command': a shell running a command line (-c) with placeholders"),
    (GOOD_TOOL.replace("name: greet", "name: bash"), "tool 'bash': key 'name': 'bash' is a reserved name"),
    (GOOD_TOOL.replace("name: greet", "name: Read_File"), "tool 'Read_File': key 'name': 'Read_File' is a reserved"),
    (GOOD_TOOL.replace("name: greet", "name: \uff42\uff41\uff53\uff48"), "tool '\uff42\uff41\uff53\uff48': key 'name'"),  # full-width look-alike
    (GOOD_TOOL.replace("name: greet", "name: greet me"), "tool 'greet me': key 'name': a tool name is"),
    (GOOD_TOOL.replace("type: string", "type: text"), "tool 'greet': key 'parameters.who.type'"),
    (GOOD_TOOL.replace("/bin/echo", "./missing.sh"), "tool 'greet': key 'command': ./missing.sh is not an executable"),
    (GOOD_TOOL.replace("/bin/echo", "no-such-program"), "tool 'greet': key 'command': no-such-program is not found"),
    (GOOD_TOOL + "        timeout: -1\n", "tool 'greet': key 'timeout'"),
    (GOOD_TOOL.replace("description: Greet someone. Returns the greeting.", "description: ''"),
     "tool 'greet': key 'description'"),
    (GOOD_TOOL + "        workdir: nowhere\n", "tool 'greet': key 'workdir'"),
    (GOOD_TOOL + GOOD_TOOL, "tool 'greet': key 'name': declared twice"),
    (GOOD_TOOL.replace("command:", "wasm: tool.wasm\n        command:"), "key 'wasm': "),
    (GOOD_TOOL.replace('{type: string, description: "Who to greet."}', '{type: array, description: "Who."}')
     .replace('"hello", "{{who}}"', '"hello={{who}}"'), "the array {{who}} must be a whole entry"),
    (GOOD_TOOL.replace('{type: string, description: "Who to greet."}', '{type: object, description: "Who."}'),
     "key 'parameters.who': object parameters need `stdin: json`"),
    (GOOD_TOOL.replace("{{who}}", "{{ who"), "has a malformed placeholder"),
    (GOOD_TOOL.replace('description: "Who to greet."', "pattern: '([', description: x"),
     "key 'parameters.who.pattern'"),
])
def test_broken_tools_name_file_tool_and_key(tmp_path, tools, expected):
    message = error(tmp_path, tools)
    assert message.startswith(str(tmp_path / "agent.yaml"))
    assert expected in message


def test_a_unicode_look_alike_of_a_reserved_name_collides(tmp_path):
    # full-width letters in the file's reserved list fold to the ASCII name of the tool
    message = error(tmp_path, GOOD_TOOL, head="upstream: http://x/v1\nreserved: ['\uff27\uff52\uff45\uff45\uff54']\n")
    assert "key 'name': 'greet' is a reserved name" in message


def test_reserved_list_of_the_file(tmp_path):
    assert "key 'name': 'greet' is a reserved name" in error(tmp_path, GOOD_TOOL,
                                                            head="upstream: http://x/v1\nreserved: [GREET]\n")


def test_unknown_top_level_key_and_bad_upstream(tmp_path):
    assert "key 'upstrem': unknown key" in error(tmp_path, GOOD_TOOL, head="upstrem: http://x/v1\n")
    assert "key 'upstream'" in error(tmp_path, GOOD_TOOL, head="upstream: ftp://x\n")


def test_api_key_env_must_be_set(tmp_path, monkeypatch):
    monkeypatch.delenv("TK_MISSING_KEY", raising=False)
    assert "key 'api_key_env': the variable TK_MISSING_KEY is not set" in error(
        tmp_path, GOOD_TOOL, head="upstream: http://x/v1\napi_key_env: TK_MISSING_KEY\n")


def test_serve_exits_non_zero_on_a_broken_file(tmp_path):
    path = write_agent(tmp_path, "tools:\n" + GOOD_TOOL.replace("{{who}}", "{{nobody}}"))
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "serve", str(path), "--port", "0"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert f"{path}: tool 'greet': key 'command': placeholder {{{{nobody}}}}" in run.stderr
    assert "listening" not in run.stdout


def test_schema_styles(tmp_path):
    agent = load(tmp_path, """
      - name: release
        description: Publish a release.
        parameters:
          version: {type: string, pattern: '^\\d+$', description: "The version."}
          channel: {type: string, enum: [stable, beta], description: "Where."}
          count: {type: integer, minimum: 1, maximum: 9, default: 1, description: "How many."}
          tags: {type: array, items: string, required: false, description: "Tags."}
        command: ["/bin/echo", "{{version}}", "{{channel}}", "{{count}}", "{{tags}}"]
""")
    spec = agent.tools["release"].spec
    plain = tool_schema(spec, "plain")["function"]
    assert plain["description"] == "Publish a release. Give each parameter as its own field."
    assert plain["parameters"] == {"type": "object", "properties": {
        "version": {"type": "string", "description": "The version. Required. Must match the regular expression ^\\d+$."},
        "channel": {"type": "string", "description": "Where. Required. One of: stable, beta."},
        "count": {"type": "integer", "description": "How many. Optional. At least 1. At most 9. Default: 1."},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags. Optional."},
    }}
    standard = tool_schema(spec, "standard")["function"]["parameters"]
    assert standard["required"] == ["version", "channel"]
    assert standard["additionalProperties"] is False
    assert standard["properties"]["channel"] == {"type": "string", "description": "Where.", "enum": ["stable", "beta"]}
    assert standard["properties"]["count"] == {"type": "integer", "description": "How many.", "minimum": 1,
                                               "maximum": 9, "default": 1}


def test_serve_says_when_it_cannot_open_its_databases(tmp_path):
    path = write_agent(tmp_path, "tools:\n" + GOOD_TOOL)
    for flag in ("--store", "--audit"):
        run = subprocess.run([sys.executable, "-m", "toolkeeper", "serve", str(path), "--port", "0", flag,
                              str(tmp_path / "missing" / "db.sqlite3")], capture_output=True, text=True, timeout=30)
        assert run.returncode == 2
        assert "cannot open a database: unable to open database file" in run.stderr
        assert "Traceback" not in run.stderr
