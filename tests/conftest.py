"""Fixtures: a scripted model server and toolkeeper servers, as real processes.

Tests talk to toolkeeper the way agents do, through the real `openai` client;
the scripted model server is the only stand-in (no model runs here).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(__file__).resolve().parent / "tools"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`toolkeeper ARGS...` as a user runs it: its exit status, stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "toolkeeper", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})


def audit_cli(trail: str | Path, *args: str) -> subprocess.CompletedProcess:
    """`toolkeeper audit COMMAND ...` on a trail named by $TOOLKEEPER_AUDIT, as an auditor would set it."""
    return run_cli("audit", *args, timeout=60, env={"TOOLKEEPER_AUDIT": str(trail)})


class Process:
    """A server process started for a test; its first stdout line says where it listens."""

    def __init__(self, args: list[str], marker: str, env: dict[str, str] | None = None, cwd: Path | None = None):
        # stderr to a file: a pipe nobody reads would block the server once full
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=cwd or ROOT,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
        deadline = time.monotonic() + 20
        line = ""
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if marker in line or not line:
                break
        if marker not in line:
            said = self.stderr()
            self.stop()
            raise RuntimeError(f"{args} did not start: {line!r} {said}")
        self.first_line = line  # what it said when it began listening
        self.url = line.split("http://", 1)[1].split()[0].rstrip("/")
        self.url = "http://" + self.url

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> str:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self.popen.stdout.close()
        text = self.stderr()
        self.log.close()
        return text


class Scripted:
    """Client of the scripted model server's control endpoints."""

    def __init__(self, process: Process):
        self.process = process
        self.base_url = process.url  # ends with /v1

    @property
    def root(self) -> str:
        return self.base_url[: -len("/v1")]

    def script(self, *steps: dict) -> None:
        _post(self.root + "/_script", {"steps": list(steps)})

    def add(self, *steps: dict) -> None:
        """More steps, for another conversation running beside the scripted ones."""
        _post(self.root + "/_script", {"steps": list(steps), "append": True})

    def requests(self) -> list[dict]:
        with urllib.request.urlopen(self.root + "/_requests", timeout=10) as answer:
            return json.loads(answer.read())

    def bodies(self) -> list[dict]:
        """The bodies of the model requests (not those to a path the scripted model does not serve)."""
        return [r["body"] for r in self.requests() if "path" not in r]


def _post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


@pytest.fixture(scope="module")
def scripted():
    process = Process([sys.executable, "-m", "toolkeeper.scripted", "--port", "0"], "listening on")
    yield Scripted(process)
    process.stop()


def write_agent(directory: Path, body: str, **values: str) -> Path:
    """An agent file in `directory`; {python}, {tools} and {out} are filled in."""
    values = {"python": sys.executable, "tools": str(TOOLS), "out": str(directory / "calls.jsonl"), **values}
    text = textwrap.dedent(body)
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    path = directory / "agent.yaml"
    path.write_text(text)
    return path


def recording_tool(name: str, parameter: str, description: str, parameter_description: str) -> str:
    """An agent file's entry for a declared tool that records its argv (tools/record.py): the entries several
    suites' agent files share."""
    return f"""
      - name: {name}
        description: {description}
        parameters:
          {parameter}: {{type: string, description: "{parameter_description}"}}
        command: ["{{python}}", "{{tools}}/record.py", "{name}", "{{{{{parameter}}}}}"]
        env: {{OUT: "{{out}}"}}
"""


LOOKUP = recording_tool("lookup", "word", "Look a word up.", "The word.")
RELEASE = recording_tool("release", "version", "Publish a release.", "The version.")
# The head of an agent file whose gated tools ask (yolo: false); the tools follow.
GATED = """
    upstream: http://127.0.0.1:9/v1
    yolo: false
    tools:
"""

# The head of an agent file whose tools run without asking (yolo: true); the tools follow.
YOLO = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
"""

# One agent file with a tool for each behaviour the suites exercise.
STANDARD_AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
      - name: release
        description: Publish a release of the product to a channel. Returns the release log.
        parameters:
          version: {type: string, description: "The version to release, like 1.4.2."}
          channel: {type: string, enum: [stable, beta], description: "Where to publish it."}
          notes: {type: string, required: false, description: "Release notes."}
        command: ["{python}", "{tools}/record.py", "release", "{{version}}", "--channel={{channel}}", "--notes={{notes}}"]
        env: {OUT: "{out}"}
      - name: count
        description: Count things. Returns what it was given.
        parameters:
          n: {type: integer, description: "How many."}
          ratio: {type: number, required: false, description: "A ratio."}
          flag: {type: boolean, required: false, description: "A flag."}
          items: {type: array, items: string, required: false, description: "Some items."}
        command: ["{python}", "{tools}/record.py", "count", "{{n}}", "--ratio={{ratio}}", "--flag={{flag}}", "{{items}}"]
        env: {OUT: "{out}"}
      - name: lookup
        description: Look a word up. Returns its definition.
        parameters:
          word: {type: string, description: "The word."}
        command: ["{python}", "{tools}/record.py", "lookup", "{{word}}"]
        env: {OUT: "{out}"}
        tier: silent
      - name: hang
        description: Start a child and hang forever.
        parameters:
          tag: {type: string, description: "A tag written in the pid file."}
        command: ["{python}", "{tools}/hang.py", "{{tag}}"]
        env: {PIDS: "{pids}"}
        timeout: 1
      - name: slow
        description: Take a long time.
        parameters:
          tag: {type: string, description: "A tag written in the pid file."}
        command: ["{python}", "{tools}/hang.py", "{{tag}}"]
        env: {PIDS: "{pids}"}
        timeout: 60
      - name: flood
        description: Print a lot.
        parameters:
          megabytes: {type: integer, description: "How much."}
        command: ["{python}", "{tools}/flood.py", "{{megabytes}}"]
        max_output: 4096
      - name: fail
        description: Fail with exit status 3.
        parameters:
          why: {type: string, description: "The reason."}
        command: ["{python}", "{tools}/fail.py", "{{why}}"]
      - name: nap
        description: Sleep a while.
        parameters:
          seconds: {type: number, description: "How long."}
        command: ["{python}", "{tools}/nap.py", "{{seconds}}"]
      - name: feed
        description: Read a JSON document on stdin.
        parameters:
          doc: {type: object, description: "The document."}
          label: {type: string, description: "A label."}
        command: ["{python}", "{tools}/stdin_echo.py"]
        stdin: json
"""


@pytest.fixture(scope="module")
def agent_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("agent")
    write_agent(directory, STANDARD_AGENT, pids=str(directory / "pids"))
    return directory


class Toolkeeper:
    def __init__(self, process: Process, directory: Path):
        self.process = process
        self.base_url = process.url
        self.directory = directory
        self._clients: list = []

    def calls(self) -> list[list[str]]:
        """The argv of every declared call that ran, as the tool itself recorded it."""
        path = self.directory / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def reset(self) -> None:
        for name in ("calls.jsonl", "pids"):
            (self.directory / name).unlink(missing_ok=True)

    def client(self, **kwargs):
        from openai import OpenAI

        kwargs = {"api_key": "sk-test-agent", "max_retries": 0, **kwargs}
        client = OpenAI(base_url=self.base_url, **kwargs)
        self._clients.append(client)
        return client

    def close_clients(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()

    def async_client(self, **kwargs):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key="sk-test-agent", max_retries=0, **kwargs)


def start_toolkeeper(agent_file: Path, upstream: str, *extra: str, env: dict[str, str] | None = None) -> Process:
    return Process([sys.executable, "-m", "toolkeeper", "serve", str(agent_file), "--port", "0", "--upstream", upstream,
                    "--log-level", "WARNING", *extra], "toolkeeper listening on", env=env)


@contextlib.contextmanager
def serving(scripted, directory: Path, *args: str, env: dict[str, str] | None = None):
    """A toolkeeper process on directory/agent.yaml, in front of the scripted model."""
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, *args, env=env)
    try:
        yield Toolkeeper(process, directory)
    finally:
        process.stop()


def fresh(toolkeeper: Toolkeeper):
    """A module's toolkeeper for one test: earlier calls cleared before, clients closed after."""
    toolkeeper.reset()
    yield toolkeeper
    toolkeeper.close_clients()


@pytest.fixture(scope="module")
def toolkeeper(scripted, agent_dir):
    with serving(scripted, agent_dir, "--read-timeout", "2", "--keepalive", "0.2") as running:
        yield running


@pytest.fixture
def tk(toolkeeper):
    """The module's toolkeeper, with the record of earlier calls cleared."""
    yield from fresh(toolkeeper)


def call(name: str, arguments, call_id: str | None = None) -> dict:
    entry = {"name": name, "arguments": arguments}
    if call_id:
        entry["id"] = call_id
    return entry


POSTGRES = "postgresql://127.0.0.1:5432/test"


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    """A store's location: an SQLite file, then a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield str(tmp_path / "store.sqlite3")
    else:
        with postgres_schema() as url:
            yield url


@pytest.fixture(scope="module")
def opa():
    """The tests' OPA stand-in (tests/opa_server.py: regorus), serving the shipped policies/*.rego."""
    process = Process([sys.executable, str(ROOT / "tests" / "opa_server.py"), "--policies", str(ROOT / "policies")],
                      "listening on")
    yield process
    process.stop()


@contextlib.contextmanager
def postgres_schema():
    """A fresh schema in the local PostgreSQL (.ci/run starts it), dropped afterwards: its URL."""
    import psycopg

    schema = f"tk_{os.getpid()}_{next(_schemas)}"
    with psycopg.connect(POSTGRES, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            yield f"{POSTGRES}?options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


_schemas = itertools.count(1)
_asked = itertools.count(1)


def user() -> list[dict]:
    """A new question each time: identical requests within a minute are retries, and replay their calls."""
    return [{"role": "user", "content": f"Please do the thing (request {next(_asked)})."}]


def check_every_call_answered(messages: list[dict]) -> None:
    """A strict server's rule: each tool_call_id answered once, before the next non-tool message."""
    pending: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in pending, f"a result for no pending call: {m}"
            pending.remove(m["tool_call_id"])
            continue
        assert not pending, f"calls left unanswered before a {m['role']} message: {pending}"
        pending = {c["id"] for c in m.get("tool_calls") or []}
    assert not pending, f"calls left unanswered at the end: {pending}"


# --- The OpenID provider: panva's oidc-provider, run by tests/idp/provider.mjs (the client: tests/idp/__init__.py) ---


@pytest.fixture(scope="session")
def oidc_provider():
    """One provider for a test process. Setting a client's redirect URIs on it is fine (each test sets those
    it uses); rotating keys or changing a user's groups is not: use fresh_oidc_provider for those."""
    from idp import TestProvider

    with TestProvider() as provider:
        yield provider


@pytest.fixture
def fresh_oidc_provider():
    """A provider of the test's own, to mutate at will (rotate_keys, set_groups)."""
    from idp import TestProvider

    with TestProvider() as provider:
        yield provider


# --- Debian's Chromium, driven by Playwright (its own browser download is not used) ---

CHROMIUM = "/usr/bin/chromium"  # Debian's; scripts/test installs it
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()
