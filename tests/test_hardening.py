"""What a hostile model, a web page, a broken network and a careless operator could do: each is refused here,
through the real server, with an answer in the API's own shape and nothing run that should not be."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import openai
import pytest
from conftest import LOOKUP, ROOT, Toolkeeper, call, fresh, serving, start_toolkeeper, user, write_agent
from test_failures import alive, pids, wait_for

AGENT_KEY = "sk-ci-bot-4411"
AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
""" + LOOKUP + """      - name: save
        description: Save a file.
        parameters:
          name: {type: string, description: "The file's name."}
          a: {type: string, required: false, description: "A prefix."}
          b: {type: string, required: false, description: "A suffix."}
        command: ["{python}", "{tools}/record.py", "save", "{{name}}.txt", "{{a}}{{b}}"]
        env: {OUT: "{out}"}
      - name: count
        description: Count.
        parameters:
          n: {type: integer, description: "How many."}
          rate: {type: number, required: false, description: "A rate."}
        command: ["{python}", "{tools}/record.py", "count", "{{n}}", "--rate={{rate}}"]
        env: {OUT: "{out}"}
      - name: feed
        description: Read a document on stdin.
        parameters:
          doc: {type: object, description: "The document."}
        command: ["{python}", "{tools}/stdin_echo.py"]
        stdin: json
      - name: deaf
        description: Never read stdin.
        parameters:
          doc: {type: object, description: "The document."}
        command: ["{python}", "-c", "import time; time.sleep(30)"]
        stdin: json
        timeout: 1
      - name: broken
        description: A script whose interpreter does not exist.
        command: ["./broken.sh"]
      - name: hang
        description: Start a child and hang.
        parameters:
          tag: {type: string, description: "A tag."}
        command: ["{python}", "{tools}/hang.py", "{{tag}}"]
        env: {PIDS: "{pids}"}
        timeout: 60
"""


@pytest.fixture(scope="module")
def hard_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hardening")
    write_agent(directory, AGENT, pids=str(directory / "pids"))
    script = directory / "broken.sh"
    script.write_text("#!/nonexistent/interpreter\necho never\n")
    script.chmod(0o755)
    return directory


@pytest.fixture(scope="module")
def hard_server(scripted, hard_dir):
    with serving(scripted, hard_dir, "--allow-origin", "http://app.example", "--idle-timeout", "1",
                 "--log-level", "INFO") as running:
        yield running


@pytest.fixture
def tkh(hard_server):
    yield from fresh(hard_server)


def post(tk: Toolkeeper, path: str, body: bytes, headers: dict[str, str], method: str = "POST"):
    url = urllib.parse.urlsplit(tk.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.request(method, path, body, headers)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response, data


CHAT = "/v1/chat/completions"
A_CALL = json.dumps({"model": "m", "messages": [{"role": "user", "content": "run it"}]}).encode()


def script_a_lookup(scripted, word="from-a-page"):
    scripted.script({"tool_calls": [call("lookup", {"word": word})]}, {"content": "done"})


# -- web pages ----------------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["text/plain", "application/json"])
def test_a_cross_site_post_runs_nothing(scripted, tkh, content_type):
    script_a_lookup(scripted)
    response, data = post(tkh, CHAT, A_CALL, {"Content-Type": content_type, "Origin": "http://evil.example"})
    assert response.status == 403
    assert json.loads(data)["error"]["code"] == "origin_not_allowed"
    assert response.getheader("Access-Control-Allow-Origin") is None
    assert tkh.calls() == [] and scripted.requests() == []


def test_a_chat_request_that_is_not_json_is_refused(scripted, tkh):
    script_a_lookup(scripted)
    response, data = post(tkh, CHAT, A_CALL, {"Content-Type": "text/plain"})
    assert response.status == 415
    assert json.loads(data)["error"]["code"] == "unsupported_content_type"
    assert tkh.calls() == []


def test_a_preflight_gets_no_permission_unless_allowed(tkh):
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    refused, _ = post(tkh, CHAT, b"", {**ask, "Origin": "http://evil.example"}, method="OPTIONS")
    assert refused.status == 403 and refused.getheader("Access-Control-Allow-Origin") is None
    allowed, _ = post(tkh, CHAT, b"", {**ask, "Origin": "http://app.example"}, method="OPTIONS")
    assert allowed.status == 204 and allowed.getheader("Access-Control-Allow-Origin") == "http://app.example"


def test_an_allowed_origin_is_served(scripted, tkh):
    script_a_lookup(scripted, "allowed")
    response, data = post(tkh, CHAT, A_CALL, {"Content-Type": "application/json", "Origin": "http://app.example"})
    assert response.status == 200, data
    assert response.getheader("Access-Control-Allow-Origin") == "http://app.example"
    assert tkh.calls() == [["lookup", "allowed"]]


def test_a_page_in_chromium_cannot_run_a_tool(scripted, tkh, tmp_path):
    """fetch(..., {mode: "no-cors"}) from a page of another origin: Chromium sends it; toolkeeper refuses it."""
    from conftest import CHROMIUM, FLAGS
    from playwright.sync_api import sync_playwright

    script_a_lookup(scripted, "from-chromium")
    page_server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
                                   cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = int(page_server.stdout.readline().split("port ")[1].split()[0])
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/")
            page.evaluate("""url => fetch(url, {method: "POST", mode: "no-cors", body: JSON.stringify(
                {model: "m", messages: [{role: "user", content: "run it"}]}), headers: {"Content-Type": "text/plain"}}
                ).catch(() => null)""", tkh.base_url + "/chat/completions")
            page.wait_for_timeout(500)
            browser.close()
    finally:
        page_server.terminate()
        page_server.wait(10)
        page_server.stdout.close()
    assert tkh.calls() == [] and scripted.requests() == []


# -- agent keys -----------------------------------------------------------------------

KEYS_AGENT = """
    upstream: http://127.0.0.1:9/v1
    api_key_env: TK_UPSTREAM_KEY
    yolo: true
    {agents}
    tools:
""" + LOOKUP


def test_with_the_upstream_key_only_known_agents_get_in(scripted, tmp_path):
    digest = hashlib.sha256(AGENT_KEY.encode()).hexdigest()
    write_agent(tmp_path, KEYS_AGENT, agents=f'agents: [{{name: ci-bot, key_sha256: "{digest}"}}]')
    process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--audit", str(tmp_path / "a.sqlite3"),
                               env={"TK_UPSTREAM_KEY": "sk-upstream"})
    tk = Toolkeeper(process, tmp_path)
    try:
        script_a_lookup(scripted, "known")
        for key in ("sk-someone-else", ""):
            with pytest.raises(openai.AuthenticationError) as refused:
                tk.client(api_key=key or "x").chat.completions.create(model="m", messages=user())
            assert refused.value.body["code"] == "invalid_api_key"
        assert scripted.requests() == []
        tk.client(api_key=AGENT_KEY).chat.completions.create(model="m", messages=user())
        assert tk.calls() == [["lookup", "known"]]
    finally:
        tk.close_clients()
        process.stop()
    exported = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "--db", str(tmp_path / "a.sqlite3"),
                               "export"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert json.loads(exported.splitlines()[-1])["agent"] == "ci-bot"


def test_a_keys_file_and_no_keys_at_all(scripted, tmp_path):
    write_agent(tmp_path, KEYS_AGENT, agents="")
    keys = tmp_path / "keys.yaml"
    keys.write_text(f'agents:\n  - {{name: nightly, key_sha256: "{hashlib.sha256(b"sk-nightly").hexdigest()}"}}\n')
    env = {"TK_UPSTREAM_KEY": "sk-upstream"}
    without = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, env=env)
    try:
        with pytest.raises(openai.AuthenticationError):
            Toolkeeper(without, tmp_path).client().chat.completions.create(model="m", messages=user())
    finally:
        log = without.stop()
    assert "no agent keys are listed" in log
    with_file = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--agent-keys", str(keys), env=env)
    try:
        scripted.script({"content": "hello"})
        answer = Toolkeeper(with_file, tmp_path).client(api_key="sk-nightly").chat.completions.create(
            model="m", messages=user())
        assert answer.choices[0].message.content == "hello"
    finally:
        with_file.stop()


# -- /toolkeeper/ stays here; its cookie never leaves ------------------------------------

def test_toolkeeper_paths_are_answered_locally(scripted, tkh):
    """No admin token configured: nothing under /toolkeeper/ reaches the model server, headers included."""
    scripted.script({"content": "never"})
    for method, path in (("GET", "/toolkeeper/approvals"), ("POST", "/toolkeeper/approvals/ap_X/approve"),
                         ("DELETE", "/toolkeeper/anything"), ("GET", "/toolkeeper/audit")):
        response, data = post(tkh, path, b"{}", {"Authorization": "Bearer admin-token-123",
                                                 "Content-Type": "application/json"}, method=method)
        assert response.status == 404 and b"admin API is off" in data, (method, path)
    assert scripted.requests() == []


def test_the_audit_cookie_is_not_forwarded(tkh):
    response, _ = post(tkh, "/v1/models", b"", {"Cookie": "toolkeeper_audit=abc123; theme=dark"}, method="GET")
    assert response.status == 200
    assert response.getheader("X-Seen-Cookie") == "theme=dark"


# -- connections and streams that never end ----------------------------------------------

def test_half_open_connections_are_closed(tkh):
    url = urllib.parse.urlsplit(tkh.base_url)
    sockets = []
    for n in range(100):
        sock = socket.create_connection((url.hostname, url.port))
        if n % 2:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        sockets.append(sock)
    with urllib.request.urlopen(tkh.base_url[:-3] + "/healthz", timeout=5) as answer:
        assert answer.status == 200
    time.sleep(2.5)  # --idle-timeout 1
    for sock in sockets:
        sock.settimeout(2)
        assert sock.recv(1024) == b"", "a half-open connection was kept"
        sock.close()


def test_a_stream_event_without_end_is_cut_off(scripted, tkh):
    huge = "data: " + "x" * (12 * 2**20)  # 12 MiB, no blank line
    scripted.script({"raw": huge, "content_type": "text/event-stream"})
    started = time.process_time(), time.monotonic()
    response, data = post(tkh, CHAT, json.dumps({"model": "m", "messages": user(), "stream": True}).encode(),
                          {"Content-Type": "application/json"})
    assert response.status == 502 and json.loads(data)["error"]["code"] == "upstream_too_large"
    assert time.monotonic() - started[1] < 10


# -- what the model sends -----------------------------------------------------------------

def tool_answer(scripted, tk, tool: str, arguments, *, raw_arguments: str | None = None) -> str:
    entry = call(tool, raw_arguments if raw_arguments is not None else arguments)
    scripted.script({"tool_calls": [entry]}, {"content": "{tool_result}"})
    answer = tk.client().chat.completions.create(model="m", messages=user())
    return answer.choices[0].message.content


@pytest.mark.parametrize(("arguments", "problem"), [
    ({"name": "--output=pwned"}, "name starts with '-'"),
    ({"name": "notes", "a": "", "b": "-rf"}, "b starts with '-'"),
    ({"name": "notes", "a": "-r", "b": "f"}, "a starts with '-'"),
])
def test_a_value_cannot_pose_as_an_option_from_inside_an_entry(scripted, tkh, arguments, problem):
    answer = tool_answer(scripted, tkh, "save", arguments)
    assert answer.startswith("Error: the call to save was not run") and problem in answer
    assert tkh.calls() == []


@pytest.mark.parametrize(("arguments", "raw", "outcome"), [
    ({"n": "99999999999999999999999"}, None, ["count", "99999999999999999999999"]),
    (None, '{"n": 99999999999999999999999}', ["count", "99999999999999999999999"]),
    ({"n": 1e300}, None, "too large to be exact"),
    ({"n": 1, "rate": "1e400"}, None, "rate must be a number"),
    (None, '{"n": 1, "rate": NaN}', "not valid JSON"),
    (None, '{"n": 1, "rate": 1e400}', "rate must be a number"),
])
def test_numbers_never_crash_a_turn(scripted, tkh, arguments, raw, outcome):
    answer = tool_answer(scripted, tkh, "count", arguments, raw_arguments=raw)
    if isinstance(outcome, list):
        assert tkh.calls() == [outcome], answer
    else:
        assert answer.startswith("Error: the call to count was not run") and outcome in answer
        assert tkh.calls() == []


def test_arguments_nested_300_deep_are_answered(scripted, tkh):
    deep = "[" * 300 + "]" * 300
    answer = tool_answer(scripted, tkh, "feed", None, raw_arguments='{"doc": {"x": ' + deep + "}}")
    assert "nested more than 32 levels deep" in answer


@pytest.mark.parametrize("body", [
    {"choices": [None]},
    {"choices": [{"message": {"role": "assistant", "tool_calls": [None]}, "finish_reason": "tool_calls"}]},
    {"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                                    "function": "lookup"}]}}]},
    {"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                                    "function": {"name": ["lookup"]}}]}}]},
    {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], "usage": 5},
    # a custom tool's call, and a call with no name: no rule could decide on either
    {"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c1", "type": "custom", "custom": {
        "name": "danger", "input": "rm -rf /"}}]}, "finish_reason": "tool_calls"}]},
    {"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]},
])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_malformed_model_response_is_a_502(scripted, tkh, body, stream):
    scripted.script({"raw": json.dumps(body)})
    response, data = post(tkh, CHAT, json.dumps({"model": "m", "messages": user(), "stream": stream}).encode(),
                          {"Content-Type": "application/json"})
    assert response.status == 502, data
    assert json.loads(data)["error"]["code"] == "upstream_malformed"


def test_a_malformed_chunk_mid_stream_is_an_sse_error(scripted, tkh):
    good = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}]}
    bad = {**good, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]}
    scripted.script({"raw": f"data: {json.dumps(good)}\n\ndata: {json.dumps(bad)}\n\n",
                     "content_type": "text/event-stream"})
    response, data = post(tkh, CHAT, json.dumps({"model": "m", "messages": user(), "stream": True}).encode(),
                          {"Content-Type": "application/json"})
    assert response.status == 200
    events = [json.loads(e[6:]) for e in data.decode().split("\n\n") if e.startswith("data: {")]
    assert events[0]["choices"][0]["delta"]["content"] == "Hi"
    assert events[-1]["error"]["code"] == "upstream_malformed"


@pytest.mark.parametrize("change", [
    {"stream_options": "yes"},
    {"messages": [{"role": "assistant", "tool_calls": 5}]},
    {"tools": [{"type": "function", "function": "lookup"}]},
    {"tools": [{"type": "function", "function": {"name": ["a"]}}]},
    {"n": 2.0},
    {"stream": "yes"},
])
def test_a_malformed_agent_request_is_a_400(scripted, tkh, change):
    body = {"model": "m", "messages": user(), **change}
    response, data = post(tkh, CHAT, json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert response.status == 400, data
    assert json.loads(data)["error"]["type"] == "invalid_request_error"


# -- tools that misbehave, and the operator's log ------------------------------------------

def test_a_stdin_tool_timeout_includes_writing_its_input(scripted, tkh):
    started = time.monotonic()
    answer = tool_answer(scripted, tkh, "deaf", {"doc": {"blob": "z" * 300_000}})
    assert answer.startswith("The command timed out after 1 s")
    assert time.monotonic() - started < 6


def test_the_log_says_why_a_tool_could_not_start(scripted, tkh, hard_server):
    answer = tool_answer(scripted, tkh, "broken", {})
    assert "interpreter line names a program that does not exist (#!/nonexistent/interpreter)" in answer
    assert wait_for(lambda: "#!/nonexistent/interpreter" in hard_server.process.stderr(), 5)


def test_a_tool_never_outlives_a_killed_toolkeeper(scripted, hard_dir):
    process = start_toolkeeper(hard_dir / "agent.yaml", scripted.base_url, "--audit",
                               str(hard_dir / "killed.sqlite3"))
    tk = Toolkeeper(process, hard_dir)
    scripted.script({"tool_calls": [call("hang", {"tag": "orphan"})]}, {"content": "never"})
    client = tk.async_client()

    import asyncio
    import threading

    threading.Thread(target=lambda: asyncio.run(_ask(client)), daemon=True).start()
    assert wait_for(lambda: len(pids(tk, "orphan")) == 2), "the tool did not start"
    os.kill(process.popen.pid, signal.SIGKILL)
    process.popen.wait(10)
    assert wait_for(lambda: not any(alive(pid) for pid in pids(tk, "orphan")), 10)
    process.stop()
    # the next start closes the call the killed one left running
    again = start_toolkeeper(hard_dir / "agent.yaml", scripted.base_url, "--audit", str(hard_dir / "killed.sqlite3"))
    again.stop()
    exported = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "--db", str(hard_dir / "killed.sqlite3"),
                               "export", "--tool", "hang"], capture_output=True, text=True, cwd=ROOT).stdout
    assert json.loads(exported.splitlines()[-1])["status"] == "interrupted"


async def _ask(client) -> None:
    with contextlib.suppress(Exception):  # the server was killed under it
        await client.chat.completions.create(model="m", messages=user())


# -- the agent file, at load -----------------------------------------------------------------

@pytest.mark.parametrize(("entry", "expected"), [
    ('name: "bash\\n"', "a tool name is 1 to 64 letters"),
    ("name: ok\n    parameters:\n      c: {type: string, enum: [a, b], default: z, description: d}",
     "is not one of the enum's values"),
])
def test_names_are_matched_whole_and_defaults_fit_their_enum(tmp_path, entry, expected):
    path = tmp_path / "agent.yaml"
    path.write_text(f"tools:\n  - {entry}\n    description: A tool.\n    command: [/bin/true]\n")
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "serve", str(path), "--port", "0"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert run.returncode == 2 and expected in run.stderr


def test_an_upstream_password_is_refused_and_never_printed(tmp_path):
    path = write_agent(tmp_path, "upstream: https://user:hunter2-secret@models.example/v1\ntools: []\n")
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "serve", str(path), "--port", "0"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert run.returncode == 2 and "must not carry user:password@" in run.stderr
    assert "hunter2" not in run.stderr + run.stdout


@pytest.mark.parametrize("call_delta", [
    {"index": 0, "id": "c1", "type": "custom", "custom": {"name": "danger", "input": "rm -rf /"}},
    {"index": 0, "id": "c1", "type": "function", "function": {"arguments": "{}"}},
], ids=["custom", "nameless"])
def test_a_streamed_call_no_rule_could_decide_on_is_a_502_not_passed_on(scripted, tkh, call_delta):
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [{**head, "choices": [{"index": 0, "delta": {"tool_calls": [call_delta]}, "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
    scripted.script({"raw": "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n",
                     "content_type": "text/event-stream"})
    response, data = post(tkh, CHAT, json.dumps({"model": "m", "messages": user(), "stream": True}).encode(),
                          {"Content-Type": "application/json"})
    assert response.status == 502, data
    assert json.loads(data)["error"]["code"] == "upstream_malformed" and b"danger" not in data



def test_a_chat_request_offering_a_custom_tool_is_refused_before_the_model_is_asked(scripted, tkh):
    scripted.script({"content": "never asked"})
    custom = {"type": "custom", "custom": {"name": "danger", "description": "Run anything."}}
    response, data = post(tkh, CHAT, json.dumps({"model": "m", "messages": user(), "tools": [custom]}).encode(),
                          {"Content-Type": "application/json"})
    assert response.status == 400 and json.loads(data)["error"]["code"] == "tool_type_not_governed"
    assert scripted.requests() == []
