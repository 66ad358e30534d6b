"""Beyond one process: two replicas sharing PostgreSQL behind a real HAProxy, and `--workers 2` on SQLite.

Each check runs on both topologies. Which process answers is told by the audit
records (each carries its pid); a check that needs the other process makes
fresh connections until the records show it got there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPConnection, HTTPException
from pathlib import Path

import pytest
from conftest import LOOKUP, ROOT, Process, call, free_port, postgres_schema, start_toolkeeper, write_agent

TOKEN = "replica-admin-token-5c1e"
AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: false
    tools:
""" + LOOKUP + """        tier: silent
      - name: work
        description: Do slow work. Returns what was done.
        parameters:
          job: {type: string, description: "The job."}
        command: ["{python}", "{tools}/record.py", "work", "{{job}}"]
        env: {OUT: "{out}", SLEEP: "2"}
        tier: silent
        timeout: 30
      - name: release
        description: Publish a release. Returns the release log.
        parameters:
          version: {type: string, description: "The version."}
        command: ["{python}", "{tools}/record.py", "release", "{{version}}"]
        env: {OUT: "{out}", STAMPS: "{stamps}"}
"""
HAPROXY = """
global
    maxconn 512
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    option http-server-close
    retries 3
    option redispatch
frontend agents
    bind 127.0.0.1:{port}
    default_backend toolkeepers
backend toolkeepers
    balance roundrobin
    option httpchk GET /healthz
    server a {a} check inter 200 fall 1 rise 2
    server b {b} check inter 200 fall 1 rise 2
"""


class LoadBalancer:
    """A real HAProxy, round robin over the replicas, each request balanced on its own."""

    def __init__(self, directory: Path, backends: list[str]):
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.port = free_port()
        config = directory / "haproxy.cfg"
        config.write_text(HAPROXY.format(port=self.port, a=backends[0].split("//")[1], b=backends[1].split("//")[1]))
        self.popen = subprocess.Popen([haproxy, "-f", str(config), "-db"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/healthz", timeout=1):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("HAProxy did not start")

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)


class Cluster:
    """What a test talks to: one URL in front (the balancer, or the workers' port), the processes behind it."""

    def __init__(self, kind: str, directory: Path, front: str, processes: list[Process], audit: str, store: str):
        self.kind = kind
        self.store = store
        self.directory = directory
        self.front = front.removesuffix("/v1")
        self.processes = processes
        self.audit = audit
        self.replicas = [p.url.removesuffix("/v1") for p in processes] if kind == "replicas" else [self.front]

    def ask(self, messages: list[dict], base: str | None = None, **body) -> dict:
        """One request on a connection of its own (so the balancer or the kernel places it afresh)."""
        request = urllib.request.Request((base or self.front) + "/v1/chat/completions", method="POST",
                                         data=json.dumps({"model": "m", "messages": messages, **body}).encode(),
                                         headers={"Authorization": "Bearer sk-replica-agent",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            if not body.get("stream"):
                return json.loads(answer.read())
            chunks = [json.loads(line[6:]) for line in answer.read().decode().splitlines()
                      if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        return {"choices": [{"message": {"content": text}}]}

    def calls(self) -> list[list[str]]:
        path = self.directory / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def records(self, **filters: str) -> list[dict]:
        args = [item for key, value in filters.items() for item in (f"--{key}", value)]
        done = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "export", "--format", "jsonl",
                               "--db", self.audit, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    def admin(self, base: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "toolkeeper", *args, "--url", base], capture_output=True,
                              text=True, timeout=60, cwd=ROOT, env={**os.environ, "TOOLKEEPER_ADMIN_TOKEN": TOKEN})


def replicas(scripted, directory: Path):
    with postgres_schema() as url:
        processes = [start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--store", url, "--audit", url,
                                      "--consent", "approvals", "--consent-timeout", "30",
                                      env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN}) for _ in range(2)]
        balancer = LoadBalancer(directory, [p.url.removesuffix("/v1") for p in processes])
        try:
            yield Cluster("replicas", directory, balancer.url, processes, url, url)
        finally:
            balancer.stop()
            for process in processes:
                process.stop()


def workers(scripted, directory: Path):
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--workers", "2",
                               "--consent", "approvals", "--consent-timeout", "30",
                               env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    try:
        yield Cluster("workers", directory, process.url, [process],
                      str(directory / "toolkeeper-audit.sqlite3"), str(directory / "toolkeeper.sqlite3"))
    finally:
        process.stop()


@pytest.fixture(scope="module", params=["replicas", "workers"])
def cluster(request, scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    write_agent(directory, AGENT, stamps=str(directory / "stamps"))
    yield from (replicas if request.param == "replicas" else workers)(scripted, directory)


def test_a_mixed_turns_history_is_restored_by_the_other_process(scripted, cluster):
    for _ in range(10):  # until the second turn lands on the other process
        word = f"hist{time.monotonic_ns()}"
        scripted.script({"when": word, "tool_calls": [call("lookup", {"word": word}, "c1"),
                                                      call("Shell", {"cmd": "ls"}, "own1")]},
                        {"when": word, "tool_calls": [call("lookup", {"word": word + "-2"}, "c2")]},
                        {"when": word, "content": "done"})
        first_messages = [{"role": "user", "content": f"Look {word} up and list files."}]
        own_tool = {"type": "function", "function": {"name": "Shell", "parameters": {"type": "object"}}}
        first = cluster.ask(first_messages, tools=[own_tool])
        assistant = first["choices"][0]["message"]
        assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["Shell"]
        second = cluster.ask([*first_messages, assistant,
                              {"role": "tool", "tool_call_id": "own1", "content": "a.txt"}], tools=[own_tool])
        assert second["choices"][0]["message"]["content"] == "done"
        restored = scripted.bodies()[-2]["messages"]  # the second turn's first round, as the model got it
        assert any(m.get("role") == "tool" and m.get("tool_call_id") == "c1" and word in m["content"]
                   for m in restored), restored
        pids = {r["tool"] + r["arguments"]["word"]: r["pid"] for r in cluster.records(tool="lookup")
                if r["arguments"]["word"].startswith(word)}
        if pids[f"lookup{word}"] != pids[f"lookup{word}-2"]:
            return
    pytest.fail("the second turn never landed on the other process")


def test_a_retry_on_the_other_process_waits_for_the_running_call(scripted, cluster):
    word = f"retry{time.monotonic_ns()}"
    scripted.script({"when": word, "answering": False, "repeat": True,
                     "tool_calls": [call("work", {"job": word}, "w1")]},
                    {"when": word, "answering": True, "repeat": True, "content": "{tool_result}"})
    messages = [{"role": "user", "content": f"Do {word}."}]
    answers: list[str] = []
    bases = cluster.replicas * 2 if cluster.kind == "replicas" else [cluster.front] * 4

    def ask(base: str) -> None:
        answers.append(cluster.ask(messages, base)["choices"][0]["message"]["content"])

    threads = [threading.Thread(target=ask, args=(base,)) for base in bases]
    for thread in threads:  # the first attempt starts the 2 s tool; the retries arrive while it runs
        thread.start()
        time.sleep(0.3)
    for thread in threads:
        thread.join(60)
    assert len(answers) == len(bases) and len(set(answers)) == 1 and word in answers[0], answers
    assert cluster.calls().count(["work", word]) == 1  # ran once, whichever process each retry reached
    records = [r for r in cluster.records(tool="work") if r["arguments"]["job"] == word]
    assert sorted(r["decision_source"] for r in records).count("retry") == len(bases) - 1
    if cluster.kind == "replicas":
        assert len({r["pid"] for r in records}) == 2


def test_a_call_waiting_on_one_process_is_approved_through_another(scripted, cluster):
    version = f"9.{time.monotonic_ns() % 100000}"
    scripted.script({"when": version, "tool_calls": [call("release", {"version": version})]},
                    {"when": version, "content": "{tool_result}"})
    waiting_on = cluster.replicas[0]
    answer: dict = {}
    asking = threading.Thread(target=lambda: answer.update(
        cluster.ask([{"role": "user", "content": f"Release {version}."}], waiting_on)))
    asking.start()
    approve_through = cluster.replicas[-1]
    deadline, listed = time.monotonic() + 20, []
    while not listed and time.monotonic() < deadline:
        shown = cluster.admin(approve_through, "approvals")
        listed = [line.split()[0] for line in shown.stdout.splitlines() if version in line]
        time.sleep(0.1)
    assert listed, shown.stdout + shown.stderr
    done = cluster.admin(approve_through, "approve", listed[0])
    approved_at = time.time()
    assert done.returncode == 0, done.stderr
    asking.join(30)
    assert version in answer["choices"][0]["message"]["content"]
    started = float((cluster.directory / "stamps").read_text().split()[-1])
    # released at once (LISTEN/NOTIFY between replicas; the workers' SQLite is looked at every 0.1 s), not at
    # the 1 s poll; the tool's own start (a Python process) is in this figure
    assert started - approved_at < 0.5, started - approved_at
    record = next(r for r in cluster.records(tool="release") if r["arguments"]["version"] == version)
    assert record["consent"] == "approved" and record["status"] == "ok"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_a_console_session_opened_on_one_process_works_on_the_other(scripted, cluster):
    """The session is a signed cookie bound to its token in the shared store: any process accepts it, and the
    trail's pages read the shared trail (PostgreSQL for replicas)."""
    added = subprocess.run([sys.executable, "-m", "toolkeeper", "tokens", "add", f"eve{cluster.kind}", "--role",
                            "auditor", "--store", cluster.store], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert added.returncode == 0, added.stderr
    token = added.stdout.split(": ", 1)[1].strip()
    opener = urllib.request.build_opener(NoRedirect)
    sign_in = urllib.request.Request(cluster.replicas[0] + "/toolkeeper/sign-in", method="POST",
                                     data=urllib.parse.urlencode({"token": token}).encode())
    with pytest.raises(urllib.error.HTTPError) as redirected:
        opener.open(sign_in, timeout=10)
    with redirected.value:
        assert redirected.value.code == 303
        cookie = redirected.value.headers["Set-Cookie"].split(";", 1)[0]
    page = urllib.request.Request(cluster.replicas[-1] + "/toolkeeper/audit?last=24h", headers={"Cookie": cookie})
    with urllib.request.urlopen(page, timeout=10) as answer:
        html = answer.read().decode()
    assert "calls match" in html and "eve" + cluster.kind in html


def test_the_audit_chain_stays_intact_under_both_processes_writing(scripted, cluster):
    word = f"chain{time.monotonic_ns()}"
    scripted.script({"when": word, "answering": False, "repeat": True, "tool_calls": [call("lookup", {"word": word})]},
                    {"when": word, "answering": True, "repeat": True, "content": "ok"})
    threads = [threading.Thread(target=cluster.ask, args=([{"role": "user", "content": f"{word} number {i}"}],))
               for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    records = [r for r in cluster.records(tool="lookup") if r["arguments"]["word"] == word]
    assert len(records) == 16 and {r["status"] for r in records} == {"ok"}
    assert len({r["pid"] for r in records}) == 2  # both processes wrote
    verified = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "verify", "--db", cluster.audit],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert verified.returncode == 0 and "chain intact" in verified.stdout, verified.stdout + verified.stderr


def test_a_process_killed_mid_stream_the_retry_succeeds_elsewhere_and_nothing_runs_twice(scripted, cluster):
    word = f"kill{time.monotonic_ns()}"
    scripted.script({"when": word, "answering": False, "repeat": True,
                     "tool_calls": [call("lookup", {"word": word}, "k1")]},
                    {"when": word, "answering": True, "repeat": True, "chunk_size": 4, "chunk_delay": 0.1,
                     "content": "{tool_result}: and a long answer that takes a while to stream."})
    messages = [{"role": "user", "content": f"Look {word} up."}]
    body = {"model": "m", "messages": messages, "stream": True}
    connection = HTTPConnection(cluster.front.split("//")[1], timeout=60)
    connection.request("POST", "/v1/chat/completions", json.dumps(body),
                       {"Authorization": "Bearer sk-replica-agent", "Content-Type": "application/json"})
    streaming = connection.getresponse()
    while b"ran" not in streaming.readline():  # the tool has run, and the answer is streaming
        pass
    victim = next(r["pid"] for r in cluster.records(tool="lookup") if r["arguments"]["word"] == word)
    os.kill(victim, signal.SIGKILL)
    rest = b""
    with contextlib.suppress(HTTPException, OSError):
        while line := streaming.readline():
            rest += line
    assert b"[DONE]" not in rest  # the stream broke off
    connection.close()
    deadline = time.monotonic() + 20
    while True:  # the agent's retry: the same request, until a live process takes it
        try:
            retried = cluster.ask(messages, stream=True)  # the same request: the same body
            break
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert word in retried["choices"][0]["message"]["content"]
    assert cluster.calls().count(["lookup", word]) == 1
    if cluster.kind == "workers":  # the supervisor starts the killed worker again
        restarted = cluster.processes[0].stderr()
        assert f"(pid {victim}) ended" in restarted
    else:
        survivors = [p for p in cluster.processes if p.popen.poll() is None]
        assert len(survivors) == 1


def test_a_retry_does_not_hang_on_a_call_left_running_by_a_dead_process(scripted, tmp_path):
    """The first attempt's process dies while its tool runs: the retry runs the call once its lease lapses."""
    write_agent(tmp_path, AGENT, stamps=str(tmp_path / "stamps"))
    word = f"lease{time.monotonic_ns()}"
    scripted.script({"when": word, "answering": False, "repeat": True,
                     "tool_calls": [call("work", {"job": word}, "w1")]},
                    {"when": word, "answering": True, "repeat": True, "content": "{tool_result}"})
    with postgres_schema() as url:
        first, second = (start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--store", url, "--audit", url)
                         for _ in range(2))
        try:
            cluster = Cluster("replicas", tmp_path, first.url, [first, second], url, url)
            messages = [{"role": "user", "content": f"Do {word}."}]

            def first_attempt() -> None:
                with contextlib.suppress(OSError):  # its process is killed under it
                    cluster.ask(messages)

            threading.Thread(target=first_attempt, daemon=True).start()
            deadline = time.monotonic() + 10
            while ["work", word] not in cluster.calls():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            os.killpg(first.popen.pid, signal.SIGKILL)  # toolkeeper and its reaper: the tool dies with it
            started = time.monotonic()
            retried = cluster.ask(messages, second.url.removesuffix("/v1"))
            took = time.monotonic() - started
        finally:
            first.stop()
            second.stop()
    assert word in retried["choices"][0]["message"]["content"]
    assert took < 5 + 2 + 3, took  # the lease (5 s), the tool (2 s), and slack: never a hang


def test_terminal_consent_refuses_several_workers(tmp_path):
    write_agent(tmp_path, AGENT, stamps=str(tmp_path / "stamps"))
    done = subprocess.run([sys.executable, "-m", "toolkeeper", "serve", str(tmp_path / "agent.yaml"), "--port", "0",
                           "--workers", "2", "--consent", "terminal"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 2
    assert "terminal consent cannot serve several workers" in done.stderr


def test_two_processes_starting_together_on_a_new_database_both_start(scripted, tmp_path):
    """Schema creation and migration take turns: neither dies on a duplicate key."""
    write_agent(tmp_path, AGENT, stamps=str(tmp_path / "stamps"))
    with postgres_schema() as url, tempfile.TemporaryDirectory():
        starting = [subprocess.Popen([sys.executable, "-m", "toolkeeper", "serve", str(tmp_path / "agent.yaml"),
                                      "--port", "0", "--store", url, "--audit", url, "--upstream",
                                      scripted.base_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=ROOT, start_new_session=True) for _ in range(4)]
        try:
            for process in starting:
                assert "toolkeeper listening on" in process.stdout.readline(), process.stderr.read()
        finally:
            for process in starting:
                os.killpg(process.pid, signal.SIGTERM)
                process.communicate(timeout=10)
