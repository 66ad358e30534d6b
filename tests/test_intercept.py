"""`toolkeeper intercept`: agents whose base URL stays at their vendor's host, reached through a real mitmproxy.

The scripted model stands behind `--map api.model.test=...`, a made-up host that is never resolved. Each client
runs in a process of its own, configured only with the variables `intercept` printed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import LOOKUP, ROOT, call, free_port, write_agent

os.environ.setdefault("TOOLKEEPER_MITMPROXY_ENV", str(ROOT / ".mitmproxy-env"))  # scripts/test makes it
NPM = ROOT / ".npm"
AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
""" + LOOKUP + """
      - name: slow_lookup
        description: Look a word up, slowly.
        parameters:
          word: {type: string, description: "The word."}
        command: ["{python}", "{tools}/record.py", "slow_lookup", "{{word}}"]
        env: {OUT: "{out}", SLEEP: "1.5"}
"""


class Intercept:
    """`toolkeeper intercept` running: the variables it printed, and the pids it named."""

    def __init__(self, directory: Path, *args: str, agent_argument: bool = True):
        self.port = free_port()
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()
        agent = [str(directory / "agent.yaml")] if agent_argument else []
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "toolkeeper", "intercept", *agent, "--port", str(self.port),
             "--confdir", str(directory / "mitmproxy"), *args], stdout=subprocess.PIPE, stderr=self.log, text=True,
            cwd=ROOT, start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(self.popen.stdout.readline() for _ in range(4)))
        reader.start()
        reader.join(120)
        assert len(lines) == 4 and all("=" in line for line in lines), (lines, self.stderr())
        self.variables = dict(line.strip().split("=", 1) for line in lines)
        self.toolkeeper, self.toolkeeper_pid, self.proxy_pid = self._started()

    def _started(self) -> tuple[str, int, int]:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = re.search(r"pid (\d+)\); toolkeeper on (http://127\.0\.0\.1:\d+) \(pid (\d+)\)", self.stderr())
            if found:
                return found.group(2), int(found.group(3)), int(found.group(1))
            time.sleep(0.05)
        raise AssertionError(self.stderr())

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def env(self, **extra: str) -> dict[str, str]:
        """A client's environment: this machine's, without its own proxy settings, plus the printed variables."""
        base = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k not in self.variables}
        return {**base, **self.variables, **extra}

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        self.popen.wait(30)
        self.popen.stdout.close()
        self.log.close()


def python_client(intercept: Intercept, code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=intercept.env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr + intercept.stderr()
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def intercepted(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("intercept")
    write_agent(directory, AGENT)
    running = Intercept(directory, "--map", f"api.model.test={scripted.base_url}", "--route", "localhost=chat")
    running.directory = directory
    yield running
    running.stop()


def ran(directory: Path) -> list[list[str]]:
    path = directory / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def lookup_then_answer(scripted, word: str) -> None:
    scripted.script({"tool_calls": [call("lookup", {"word": word})]}, {"content": "Found: {tool_result}"})


CHAT = """
import json
from openai import OpenAI
client = OpenAI(base_url="https://api.model.test/v1", api_key="sk-agent-own")
reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "look up fjord"}])
print(json.dumps({"content": reply.choices[0].message.content, "calls": reply.choices[0].message.tool_calls}))
"""


def test_the_openai_client_at_its_vendor_url_gets_a_declared_tool_run_hidden(scripted, intercepted):
    lookup_then_answer(scripted, "fjord")
    answer = python_client(intercepted, CHAT)
    assert answer["content"].strip() == 'Found: ran ["lookup", "fjord"]' and answer["calls"] is None
    assert ["lookup", "fjord"] in ran(intercepted.directory)
    first, second = scripted.requests()[-2:]
    assert any(t["function"]["name"] == "lookup" for t in first["body"]["tools"])  # declared tools were offered
    assert {k.lower(): v for k, v in second["headers"].items()}["authorization"] == "Bearer sk-agent-own"
    assert not any(name.lower().startswith("x-toolkeeper") for r in (first, second) for name in r["headers"])


def test_the_responses_api_and_the_anthropic_client_too(scripted, intercepted):
    lookup_then_answer(scripted, "ria")
    answer = python_client(intercepted, """
import json
from openai import OpenAI
client = OpenAI(base_url="https://api.model.test/v1", api_key="sk-agent-own")
print(json.dumps({"text": client.responses.create(model="m", input="look up ria").output_text}))
""")
    assert answer["text"].strip() == 'Found: ran ["lookup", "ria"]'
    lookup_then_answer(scripted, "tor")
    answer = python_client(intercepted, """
import json, anthropic
client = anthropic.Anthropic(base_url="https://api.model.test", api_key="sk-ant-own")
message = client.messages.create(model="c", max_tokens=100, messages=[{"role": "user", "content": "look up tor"}])
print(json.dumps({"text": "".join(b.text for b in message.content), "types": [b.type for b in message.content]}))
""")
    assert answer["types"] == ["text"] and 'ran ["lookup", "tor"]' in answer["text"]


def test_streamed_text_before_the_call_arrives_before_the_call_ends(scripted, intercepted):
    scripted.script({"content": "Checking the dictionary. ", "tool_calls": [call("slow_lookup", {"word": "scree"})]},
                    {"content": "Done: {tool_result}"})
    answer = python_client(intercepted, """
import json, time
from openai import OpenAI
client = OpenAI(base_url="https://api.model.test/v1", api_key="sk-agent-own")
stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "scree"}], stream=True)
first, text = None, ""
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        first = first or time.time()
        text += chunk.choices[0].delta.content
print(json.dumps({"first": first, "ended": time.time(), "text": text}))
""")
    assert answer["text"].strip() == 'Checking the dictionary. Done: ran ["slow_lookup", "scree"]'
    assert answer["ended"] - answer["first"] > 1.0  # the first words came while the 1.5 s tool still ran


def test_streamed_responses_and_messages_through_the_proxy(scripted, intercepted):
    lookup_then_answer(scripted, "tarn")
    answer = python_client(intercepted, """
import json
from openai import OpenAI
client = OpenAI(base_url="https://api.model.test/v1", api_key="sk-agent-own")
events = list(client.responses.create(model="m", input="look up tarn", stream=True))
done = [e for e in events if e.type == "response.completed"][0].response
print(json.dumps({"text": done.output_text, "types": sorted({e.type for e in events}),
                  "numbers": [e.sequence_number for e in events]}))
""")
    assert answer["text"].strip() == 'Found: ran ["lookup", "tarn"]'
    assert not any("function_call" in kind for kind in answer["types"]) and answer["numbers"] == sorted(answer["numbers"])
    lookup_then_answer(scripted, "cirque")
    answer = python_client(intercepted, """
import json, anthropic
client = anthropic.Anthropic(base_url="https://api.model.test", api_key="sk-ant-own")
with client.messages.stream(model="c", max_tokens=100, messages=[{"role": "user", "content": "cirque"}]) as stream:
    message = stream.get_final_message()
print(json.dumps({"text": "".join(b.text for b in message.content if b.type == "text"),
                  "types": [b.type for b in message.content]}))
""")
    assert 'ran ["lookup", "cirque"]' in answer["text"] and "tool_use" not in answer["types"]


def test_a_node_agent_with_the_preload_goes_through_the_proxy(scripted, intercepted):
    preload = NPM / "toolkeeper-proxy.mjs"  # beside .npm/node_modules/undici, as the how-to says
    shutil.copy(ROOT / "tests" / "clients" / "proxy_preload.mjs", preload)
    lookup_then_answer(scripted, "karst")
    done = subprocess.run(["node", str(ROOT / "tests" / "clients" / "intercepted_fetch.mjs"), "look up karst"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=intercepted.env(NODE_OPTIONS=f"--import {preload}"))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == 200 and answer["content"].strip() == 'Found: ran ["lookup", "karst"]'


def test_codex_at_its_vendor_url_through_the_proxy(scripted, intercepted, tmp_path):
    """Codex (Rust) honours HTTPS_PROXY and SSL_CERT_FILE: the printed variables are all it needs."""
    from test_codex import CODEX, CONFIG

    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(CONFIG.format(base_url="https://api.model.test/v1"))
    scripted.script({"content": "Let me look it up.", "tool_calls": [call("lookup", {"word": "sound"})]},
                    {"content": "Found: {tool_result}"})
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex"),
           "TOOLKEEPER_TEST_KEY": "sk-codex-own", "NO_COLOR": "1", **intercepted.variables}
    run = subprocess.run([str(CODEX), "exec", "--skip-git-repo-check", "--json", "What is a sound?"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    messages = [e["item"]["text"] for e in map(json.loads, filter(lambda line: line.startswith("{"),
                                                                 run.stdout.splitlines()))
                if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]
    assert messages[-1].strip() == 'Found: ran ["lookup", "sound"]' and "lookup" not in messages[0]
    assert ["lookup", "sound"] in ran(intercepted.directory)


CODEX_RULES = """
rules:
  - id: codex-no-rm-rf
    effect: deny
    reason: Recursive deletes are not allowed here.
    when: {source: agent, tool: exec_command, arguments: {cmd: {matches: 'rm\\s+-rf'}}}
"""
BUILT_IN_PROVIDER = """
model = "gpt-5.5"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[features]
plugins = false

[analytics]
enabled = false
"""


def test_codex_with_its_built_in_provider_falls_back_from_websockets_through_the_proxy(scripted, tmp_path):
    """Codex's own OpenAI provider tries the Responses API's WebSocket mode at api.openai.com first: on a routed
    host toolkeeper refuses it (it would escape every rule), Codex falls back to HTTPS, and toolkeeper governs."""
    from test_codex import CODEX

    write_agent(tmp_path, AGENT)
    (tmp_path / "rules.yaml").write_text(CODEX_RULES)
    victim = tmp_path / "keep"
    victim.mkdir()
    running = Intercept(tmp_path, "--map", f"api.openai.com={scripted.base_url}", "--", "--policy",
                        str(tmp_path / "rules.yaml"))
    try:
        home = tmp_path / "home"
        (home / ".codex").mkdir(parents=True)
        (home / ".codex" / "config.toml").write_text(BUILT_IN_PROVIDER)
        scripted.script({"content": "Let me look it up.", "tool_calls": [call("lookup", {"word": "wave"})]},
                        {"tool_calls": [call("exec_command", {"cmd": f"rm -rf {victim}"}, "codex_rm")]},
                        {"content": "Found: a wave; and I was not allowed to delete it."})
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex"),
               "OPENAI_API_KEY": "sk-codex-own", "NO_COLOR": "1", **running.variables}
        run = subprocess.run([str(CODEX), "exec", "--skip-git-repo-check", "--json", "What is a wave?"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    finally:
        running.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Falling back from WebSockets to HTTPS" in run.stdout, run.stdout
    messages = [e["item"]["text"] for e in map(json.loads, filter(lambda line: line.startswith("{"),
                                                                 run.stdout.splitlines()))
                if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]
    assert messages[-1] == "Found: a wave; and I was not allowed to delete it."
    assert ran(tmp_path) == [["lookup", "wave"]] and victim.exists() and "rm -rf" not in run.stdout


def test_claude_code_at_its_vendor_url_through_the_proxy(scripted, intercepted, tmp_path):
    """Claude Code (Node) reads HTTPS_PROXY itself: HTTPS_PROXY and NODE_EXTRA_CA_CERTS are all it needs."""
    from test_claude_code import CLAUDE

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    scripted.script({"content": "Let me look it up.", "tool_calls": [call("lookup", {"word": "moraine"})]},
                    {"content": "Found: {tool_result}"})
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TERM": "dumb", "ANTHROPIC_BASE_URL": "https://api.model.test",
           "ANTHROPIC_API_KEY": "sk-ant-own", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
           "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "HTTPS_PROXY": intercepted.variables["HTTPS_PROXY"],
           "NODE_EXTRA_CA_CERTS": intercepted.variables["NODE_EXTRA_CA_CERTS"]}
    run = subprocess.run([str(CLAUDE), "-p", "What is a moraine?", "--output-format", "json"], capture_output=True,
                         text=True, timeout=120, cwd=work, env=env, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout + run.stderr
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["result"].strip() == 'Found: ran ["lookup", "moraine"]' and not answer["is_error"]
    assert ["lookup", "moraine"] in ran(intercepted.directory)


class Listener:
    """A server on 127.0.0.1 in a thread of its own: `accepted` gets each connection."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.accepted(connection)

    def accepted(self, connection: socket.socket) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.listener.close()


class RawTLSServer(Listener):
    """An HTTPS server on 127.0.0.1 with its own certificate, keeping the bytes of each request it receives."""

    def __init__(self, directory: Path):
        self.cert, self.key = directory / "server.pem", directory / "server.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(self.key),
                        "-out", str(self.cert)], check=True, capture_output=True)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        self.received: list[bytes] = []
        super().__init__(context.wrap_socket(socket.create_server(("127.0.0.1", 0)), server_side=True))
        self.port = self.listener.getsockname()[1]

    def accepted(self, connection: socket.socket) -> None:
        with connection:
            data = b""
            while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + 11:
                data += connection.recv(65536)
            self.received.append(data)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")


def test_a_host_not_routed_is_received_exactly_as_sent(intercepted, tmp_path):
    with RawTLSServer(tmp_path) as server:
        _compare_direct_and_through(intercepted, server)


def _compare_direct_and_through(intercepted: Intercept, server: RawTLSServer) -> None:
    sent = (f"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer k\r\n"
            "X-Toolkeeper-Upstream: left as it is\r\nContent-Length: 11\r\n\r\nhello world").encode()
    trust = ssl.create_default_context(cafile=str(server.cert))  # this server's own certificate, not mitmproxy's

    def send(through_proxy: bool) -> bytes:
        raw = socket.create_connection(("127.0.0.1", intercepted.port if through_proxy else server.port))
        if through_proxy:
            raw.sendall(f"CONNECT 127.0.0.1:{server.port} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        with trust.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(sent)
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
            return answer

    assert send(False) == send(True)
    assert server.received == [sent, sent]  # not intercepted: its certificate checked by the client, bytes untouched


def test_a_routed_hosts_other_requests_go_only_where_interception_routes(intercepted, tmp_path):
    """localhost is routed (so decrypted): its other requests go through toolkeeper too, which forwards only to
    the origins interception routes (https://localhost, on 443): a server on another port gets nothing."""
    with RawTLSServer(tmp_path) as server:
        trust = ssl.create_default_context(cafile=intercepted.variables["SSL_CERT_FILE"])
        connection = http.client.HTTPSConnection("127.0.0.1", intercepted.port, context=trust, timeout=30)
        connection.set_tunnel("localhost", server.port)
        connection.request("GET", "/v1/models")
        answer = connection.getresponse()
        assert answer.status == 400 and b"interception does not route" in answer.read()
        connection.close()
        assert server.received == []


@pytest.mark.parametrize(("method", "path", "headers"), [
    ("GET", "/v1/chat/completions", {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                                     "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}),
    ("POST", "/v1/realtime/client_secrets", {"Content-Type": "application/json"}),
    ("POST", "/v1/threads/t1/runs", {"Content-Type": "application/json"}),
], ids=["websocket", "realtime", "assistants-run"])
def test_an_ungoverned_endpoint_on_a_routed_host_is_refused_not_tunnelled(scripted, intercepted, method, path,
                                                                          headers):
    scripted.script()
    trust = ssl.create_default_context(cafile=intercepted.variables["SSL_CERT_FILE"])
    connection = http.client.HTTPSConnection("127.0.0.1", intercepted.port, context=trust, timeout=30)
    connection.set_tunnel("api.model.test", 443)
    connection.request(method, path, body=b"{}" if method == "POST" else None,
                       headers={"Authorization": "Bearer sk-agent-own", **headers})
    answer = connection.getresponse()
    body = json.loads(answer.read())
    connection.close()
    assert answer.status == 403 and body["error"]["code"] == "ungoverned_endpoint"
    assert "--pass-ungoverned" in body["error"]["message"]
    assert scripted.requests() == []  # nothing reached the model server


class Recorder(Listener):
    """A plain HTTP server that should never be reached: it counts what reaches it."""

    def __init__(self):
        self.hits = 0
        super().__init__(socket.create_server(("127.0.0.1", 0)))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def accepted(self, connection: socket.socket) -> None:
        self.hits += 1
        connection.close()


def post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())


def test_a_forged_upstream_header_redirects_nothing(scripted, intercepted):
    with Recorder() as evil:
        _forge(scripted, intercepted, evil)


def _forge(scripted, intercepted: Intercept, evil: Recorder) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    now = int(time.time())
    for forged in (f"{evil.url} {now} {'0' * 64}", evil.url, f"{scripted.base_url} {now} {'ab' * 32}"):
        status, answer = post(intercepted.toolkeeper + "/v1/chat/completions", body, {"X-Toolkeeper-Upstream": forged})
        assert status == 400 and "X-Toolkeeper-Upstream" in answer["error"]["message"], answer
    status, answer = post(intercepted.toolkeeper + "/v1/messages", {**body, "max_tokens": 5},
                          {"X-Toolkeeper-Upstream": evil.url})
    assert status == 400 and answer["type"] == "error"  # in the Messages API's own shape
    scripted.script({"content": "the real model"})
    answer = python_client(intercepted, f"""
import json
from openai import OpenAI
client = OpenAI(base_url="https://api.model.test/v1", api_key="sk-agent-own",
                default_headers={{"X-Toolkeeper-Upstream": "{evil.url} {now} {'0' * 64}"}})
reply = client.chat.completions.create(model="m", messages=[{{"role": "user", "content": "hi"}}])
print(json.dumps({{"content": reply.choices[0].message.content}}))
""")
    assert answer == {"content": "the real model"}
    assert evil.hits == 0


def test_with_toolkeeper_down_the_agent_gets_a_502_in_its_api_shape(scripted, intercepted):
    """Last in this file: it kills the toolkeeper behind the proxy (intercept starts it again)."""
    code = """
import json, anthropic
from openai import OpenAI
out = {}
input()  # imports done: toolkeeper is killed now, and these run before it can be started again
try:
    OpenAI(base_url="https://api.model.test/v1", api_key="k", max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}])
except Exception as exc:
    out["chat"] = [exc.status_code, exc.body]
try:
    anthropic.Anthropic(base_url="https://api.model.test", api_key="k", max_retries=0).messages.create(
        model="c", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
except Exception as exc:
    out["messages"] = [exc.status_code, exc.body]
print(json.dumps(out))
"""
    client = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=intercepted.env(), cwd=ROOT)
    time.sleep(2)  # the client's imports
    os.kill(intercepted.toolkeeper_pid, signal.SIGKILL)
    time.sleep(0.1)
    port = int(intercepted.toolkeeper.rsplit(":", 1)[1])
    with pytest.raises(OSError):  # held meanwhile: no other process takes the port and receives the agents' keys
        socket.create_server(("127.0.0.1", port)).close()
    out, _ = client.communicate("go\n", timeout=60)
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer["chat"][0] == 502 and "toolkeeper is not running" in answer["chat"][1]["message"]
    assert answer["messages"][0] == 502 and answer["messages"][1]["type"] == "error"
    deadline = time.monotonic() + 30
    while "starting it again" not in intercepted.stderr() and time.monotonic() < deadline:
        time.sleep(0.1)
    scripted.script({"content": "back"})
    for _ in range(100):  # started again, on the same port
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", int(intercepted.toolkeeper.rsplit(":", 1)[1])), 1).close()
            break
        time.sleep(0.1)
    assert python_client(intercepted, CHAT)["content"] == "back"


def test_sigterm_stops_mitmdump_and_toolkeeper_started_on_the_agent_file_its_config_names(scripted, tmp_path):
    write_agent(tmp_path, AGENT)
    (tmp_path / "toolkeeper.yaml").write_text(f"agent_file: {tmp_path / 'agent.yaml'}\n")
    running = Intercept(tmp_path, "--map", f"api.model.test={scripted.base_url}", "--",
                        "--config", str(tmp_path / "toolkeeper.yaml"), agent_argument=False)
    os.killpg(running.popen.pid, signal.SIGTERM)
    assert running.popen.wait(30) == 0
    for pid in (running.toolkeeper_pid, running.proxy_pid):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    running.popen.stdout.close()
    running.log.close()


@pytest.mark.parametrize("args, says", [
    (["--route", "api.example.com=completions"], "API one of chat, responses, messages"),
    (["--route", "api.example.com/v1/generate=chat"], "a chat path ends with /chat/completions"),
    (["--map", "api.example.com=ftp://x"], "give HOST=URL"),
    (["--confdir", "/etc/hostname/ca"], "cannot write mitmproxy's CA"),
    (["--port", "{busy}"], "cannot listen on 127.0.0.1:"),
])
def test_what_cannot_work_is_refused_at_start(tmp_path, args, says):
    write_agent(tmp_path, AGENT)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        args = [a.replace("{busy}", str(busy.getsockname()[1])) for a in args]
        done = subprocess.run([sys.executable, "-m", "toolkeeper", "intercept", str(tmp_path / "agent.yaml"),
                               "--confdir", str(tmp_path / "ca"), *args], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_no_mitmproxy_environment_and_no_way_to_make_one_says_what_to_install(tmp_path):
    write_agent(tmp_path, AGENT)
    done = subprocess.run([sys.executable, "-m", "toolkeeper", "intercept", str(tmp_path / "agent.yaml"), "--confdir",
                           str(tmp_path / "ca"), "--port", str(free_port())], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "TOOLKEEPER_MITMPROXY_ENV": "/etc/hostname/env"})
    assert done.returncode == 2 and "pip install mitmproxy==" in done.stderr, done.stderr


ROUTING = """
import json, os, sys
from mitmproxy.test import tflow, tutils
sys.path.insert(0, os.environ["ADDON_DIR"])
import addon as intercept_addon

addon = intercept_addon.Interception()
out = []
for method, host, path in json.loads(sys.argv[1]):
    flow = tflow.tflow(req=tutils.treq(method=method.encode(), host=host, port=443, scheme=b"https",
                                      authority=host.encode(), path=path.encode(), headers=[]))
    flow.request.headers["X-Toolkeeper-Upstream"] = "forged"
    addon.requestheaders(flow)
    signed = flow.request.headers.get("X-Toolkeeper-Upstream", "")
    out.append([flow.request.url, signed.split(" ")[0] if signed else None])
print(json.dumps(out))
"""


def test_the_addon_routes_each_api_path_keeps_the_query_and_signs_only_plain_hosts(tmp_path):
    """The addon's routing table, in mitmproxy's own environment, on mitmproxy's test flows."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"toolkeeper": "http://127.0.0.1:7000", "maps": {"api.model.test":
                                                                                  "http://127.0.0.1:8700/v1"},
                                  "routes": [["api.openai.com", None, "chat"], ["api.openai.com", None, "responses"],
                                             ["api.anthropic.com", None, "messages"],
                                             ["*.openai.azure.com", None, "chat"],
                                             ["chatgpt.com", "/backend-api/codex/responses", "responses"],
                                             ["api.model.test", None, "chat"]]}))
    cases = [("POST", "api.openai.com", "/v1/chat/completions"), ("GET", "api.openai.com", "/v1/responses/resp_1"),
             ("POST", "api.anthropic.com", "/v1/messages/count_tokens"),
             ("POST", "x.openai.azure.com", "/openai/deployments/d/chat/completions?api-version=2024-10-21"),
             ("POST", "chatgpt.com", "/backend-api/codex/responses"), ("POST", "chatgpt.com", "/other/responses"),
             ("GET", "api.openai.com", "/v1/models"), ("GET", "api.model.test", "/v1/models?x=1"),
             ("POST", "API.OpenAI.com", "/v1/chat/completions"), ("POST", "a@api.openai.com", "/v1/chat/completions")]
    python = Path(os.environ["TOOLKEEPER_MITMPROXY_ENV"]) / "bin" / "python"
    done = subprocess.run([str(python), "-c", ROUTING, json.dumps(cases)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TOOLKEEPER_INTERCEPT_CONFIG": str(config),
                               "TOOLKEEPER_INTERCEPT_SECRET": "s",
                               "ADDON_DIR": str(ROOT / "proxy" / "toolkeeper" / "wire" / "intercept")})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        ["http://127.0.0.1:7000/v1/chat/completions", "https://api.openai.com/v1"],
        ["http://127.0.0.1:7000/v1/responses/resp_1", "https://api.openai.com/v1"],
        ["http://127.0.0.1:7000/v1/messages/count_tokens", "https://api.anthropic.com/v1"],
        ["http://127.0.0.1:7000/v1/chat/completions?api-version=2024-10-21",
         "https://x.openai.azure.com/openai/deployments/d"],
        ["http://127.0.0.1:7000/v1/responses", "https://chatgpt.com/backend-api/codex"],
        # every other request on a routed host goes through toolkeeper, which passes data on and refuses the rest
        ["http://127.0.0.1:7000/other/responses", "https://chatgpt.com"],
        ["http://127.0.0.1:7000/v1/models", "https://api.openai.com/v1"],
        ["http://127.0.0.1:7000/v1/models?x=1", "http://127.0.0.1:8700/v1"],  # a mapped host's, under its URL
        ["http://127.0.0.1:7000/v1/chat/completions", "https://api.openai.com/v1"],  # the host's case does not matter
        ["https://a@api.openai.com/v1/chat/completions", None],  # not a plain host name: never signed
    ]
