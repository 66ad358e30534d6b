"""The approvals channel, driven through the real `toolkeeper approvals/approve/deny` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from conftest import GATED, RELEASE, ROOT, Toolkeeper, call, recording_tool, start_toolkeeper, write_agent

TOKEN = "test-admin-token-7f3a"
AGENT = GATED + RELEASE + recording_tool("publish", "page", "Publish a page.", "The page.")


def cli(tk: Toolkeeper, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOOLKEEPER_ADMIN_TOKEN": token or ""}
    root = tk.base_url[: -len("/v1")]
    return subprocess.run([sys.executable, "-m", "toolkeeper", *args, "--url", root], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT)


def serve(scripted, directory, *extra: str) -> Toolkeeper:
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--consent", "approvals",
                               "--store", str(directory / "store.sqlite3"), "--keepalive", "0.2", *extra,
                               env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    return Toolkeeper(process, directory)


@pytest.fixture(scope="module")
def approvals_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("approvals")
    write_agent(directory, AGENT)
    return directory


@pytest.fixture(scope="module")
def tka_server(scripted, approvals_dir):
    tk = serve(scripted, approvals_dir, "--consent-timeout", "20")
    yield tk
    tk.process.stop()


@pytest.fixture
def tka(tka_server):
    tka_server.reset()
    yield tka_server
    tka_server.close_clients()


class Asking:
    """A conversation whose call waits for approval, run in a thread."""

    def __init__(self, tk: Toolkeeper, scripted, tool: str, arguments: dict, *, stream=False, word="go"):
        scripted.add({"when": word, "tool_calls": [call(tool, arguments)]},
                     {"when": word, "content": "{tool_result}"})
        self.answer = None
        self.error = None
        self.chunks = b""
        client = tk.client()

        def run() -> None:
            try:
                ask()
            except Exception as exc:  # the server went away: kept for the test to look at
                self.error = exc

        def ask() -> None:
            if stream:
                with client.chat.completions.with_streaming_response.create(
                        model="m", messages=[{"role": "user", "content": word}], stream=True) as response:
                    self.chunks = response.read()
                events = [json.loads(e[6:]) for e in self.chunks.decode().split("\n\n") if e.startswith("data: {")]
                self.answer = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
            else:
                response = client.chat.completions.create(model="m", messages=[{"role": "user", "content": word}])
                self.answer = response.choices[0].message.content

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def result(self) -> str:
        self.thread.join(30)
        assert not self.thread.is_alive(), "the call never finished"
        return self.answer


def waiting(tk: Toolkeeper, count: int = 1, timeout: float = 15) -> list[str]:
    """The ids `toolkeeper approvals` lists, once `count` calls wait."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = cli(tk, "approvals")
        assert run.returncode == 0, run.stderr
        ids = [line.split()[0] for line in run.stdout.splitlines() if line.startswith("ap_")]
        if len(ids) >= count:
            return ids
        time.sleep(0.2)
    raise AssertionError("no call came to wait for approval")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_approve_lets_the_call_run(scripted, tka, stream):
    asking = Asking(tka, scripted, "release", {"version": f"1.0.{int(stream)}"}, stream=stream, word=f"go{stream}")
    (approval,) = waiting(tka)
    listing = cli(tka, "approvals").stdout
    assert f'release(version=1.0.{int(stream)})' in listing and 'argv ["' in listing and "waiting" in listing
    time.sleep(0.5)  # a person takes longer than the keep-alive interval (0.2 s) to answer; the commands do not
    run = cli(tka, "approve", approval, "--as", "ada")
    assert run.returncode == 0 and f"{approval}: approved by ada" in run.stdout
    assert "ran" in asking.result()
    assert tka.calls() == [["release", f"1.0.{int(stream)}"]]
    if stream:
        assert b": keep-alive" in asking.chunks  # the agent was kept alive while the call waited
    assert cli(tka, "approvals").stdout.strip() == "nothing waits for approval"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_deny_tells_the_model_why(scripted, tka, stream):
    asking = Asking(tka, scripted, "release", {"version": "2.0.0"}, word=f"deny-me-{stream}", stream=stream)
    (approval,) = waiting(tka)
    assert cli(tka, "deny", approval, "--reason", "not during the freeze").returncode == 0
    answer = asking.result()
    assert answer.startswith("Not run: release was not allowed (not during the freeze)")
    assert tka.calls() == []


def test_two_identical_calls_in_one_response_each_need_their_approval(scripted, tka):
    """They run at once and wait on one approval; it runs one of them, and the other asks again."""
    scripted.add({"when": "twice", "tool_calls": [call("release", {"version": "7.7.7"}, "r1"),
                                                  call("release", {"version": "7.7.7"}, "r2")]},
                 {"when": "twice", "content": "{tool_result}"})
    client = tka.client()
    answer: dict = {}
    asking = threading.Thread(target=lambda: answer.update(
        said=client.chat.completions.create(model="m", messages=[{"role": "user", "content": "twice"}])))
    asking.start()
    (first,) = waiting(tka)
    assert cli(tka, "approve", first).returncode == 0
    deadline = time.monotonic() + 15
    while (second := waiting(tka)) == [first]:
        assert time.monotonic() < deadline
    assert tka.calls() == [["release", "7.7.7"]]  # one approval, one run
    assert cli(tka, "approve", second[0]).returncode == 0
    asking.join(30)
    assert tka.calls() == [["release", "7.7.7"], ["release", "7.7.7"]]


def test_an_approval_is_for_its_own_arguments_only(scripted, tka):
    first = Asking(tka, scripted, "release", {"version": "3.0.0"}, word="first")
    waiting(tka, 1)
    second = Asking(tka, scripted, "release", {"version": "3.0.1"}, word="second")
    ids = waiting(tka, 2)
    run = cli(tka, "approve", ids[0])
    assert run.returncode == 0
    assert "ran" in first.result()
    assert tka.calls() == [["release", "3.0.0"]]
    assert waiting(tka, 1) == [ids[1]]  # the other arguments still wait
    # approving the answered one again changes nothing
    again = cli(tka, "approve", ids[0])
    assert again.returncode != 0 and "is used, not waiting" in again.stderr
    cli(tka, "deny", ids[1])
    assert second.result().startswith("Not run")
    assert tka.calls() == [["release", "3.0.0"]]


def test_always_allows_the_tool_from_then_on(scripted, tka):
    asking = Asking(tka, scripted, "publish", {"page": "home"}, word="always-1", stream=True)
    (approval,) = waiting(tka)
    run = cli(tka, "approve", approval, "--always")
    assert "publish is now always allowed" in run.stdout
    assert "ran" in asking.result()
    # other arguments, no question, streamed or not
    assert "ran" in Asking(tka, scripted, "publish", {"page": "about"}, word="always-2").result()
    assert "ran" in Asking(tka, scripted, "publish", {"page": "faq"}, word="always-3", stream=True).result()
    assert tka.calls() == [["publish", "home"], ["publish", "about"], ["publish", "faq"]]


def test_the_admin_api_needs_the_token(tka):
    for token in (None, "wrong"):
        run = cli(tka, "approvals", token=token)
        assert run.returncode != 0
        assert "401" in run.stderr and "a valid token is required" in run.stderr
        assert ("no admin token is set here (TOOLKEEPER_ADMIN_TOKEN" in run.stderr) == (token is None)


def test_no_answer_before_the_timeout_is_a_deny(scripted, tmp_path):
    write_agent(tmp_path, AGENT)
    tk = serve(scripted, tmp_path, "--consent-timeout", "1")
    try:
        whole = Asking(tk, scripted, "release", {"version": "4.0.0"}, word="slow-whole")
        streamed = Asking(tk, scripted, "release", {"version": "4.0.1"}, word="slow-stream", stream=True)
        for asking in (whole, streamed):
            assert asking.result().startswith("Not run: release was not allowed (no one answered within 1 s)")
        assert b": keep-alive" in streamed.chunks
        assert tk.calls() == []
    finally:
        tk.close_clients()
        tk.process.stop()


def test_a_restart_while_a_call_waits_loses_nothing(scripted, tmp_path):
    write_agent(tmp_path, AGENT)
    first = serve(scripted, tmp_path, "--consent-timeout", "30")
    asking = Asking(first, scripted, "release", {"version": "5.0.0"}, word="before-restart")
    (approval,) = waiting(first)
    first.process.stop()  # the agent's request dies with it
    asking.thread.join(30)
    assert asking.error is not None
    second = serve(scripted, tmp_path, "--consent-timeout", "30")
    try:
        assert waiting(second) == [approval]  # still there
        assert cli(second, "approve", approval).returncode == 0
        # the agent asks again: the approval given meanwhile is used, without a new wait
        again = Asking(second, scripted, "release", {"version": "5.0.0"}, word="after-restart")
        assert "ran" in again.result()
        assert second.calls() == [["release", "5.0.0"]]
        assert cli(second, "approvals").stdout.strip() == "nothing waits for approval"
    finally:
        first.close_clients()
        second.close_clients()
        second.process.stop()


# -- what an approver reads, and what "always" may do ------------------------------------

RULES = """
rules:
  - id: ask-admin-pages
    effect: ask
    reason: Admin pages need a person.
    when:
      tool: publish
      arguments: {page: {equals: admin}}
"""
LOGIN = """
      - name: login
        description: Log in.
        parameters:
          user: {type: string, description: "Who."}
          api_token: {type: string, description: "The token."}
        command: ["{python}", "{tools}/record.py", "login", "{{user}}", "--token={{api_token}}"]
        env: {OUT: "{out}"}
"""


@pytest.fixture(scope="module")
def guarded(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("guarded")
    write_agent(directory, AGENT + LOGIN)
    (directory / "rules.yaml").write_text(RULES)
    tk = serve(scripted, directory, "--consent-timeout", "20", "--policy", str(directory / "rules.yaml"),
               "--identity-header", "X-Agent-Name")
    yield tk
    tk.process.stop()


@pytest.fixture
def tkg(guarded):
    guarded.reset()
    yield guarded
    guarded.close_clients()


def as_agent(tk: Toolkeeper, key: str, name: str) -> Toolkeeper:
    """The same server, seen by another agent (its own key, its own identity header)."""
    other = Toolkeeper(tk.process, tk.directory)
    other.client = lambda **kwargs: Toolkeeper.client(other, api_key=key, default_headers={"X-Agent-Name": name},
                                                      **kwargs)
    return other


def audit_export(tk: Toolkeeper, tool: str) -> list[dict]:
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "--db",
                          str(tk.directory / "toolkeeper-audit.sqlite3"), "export", "--tool", tool],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_the_listing_says_why_and_who_and_escapes_what_the_model_wrote(scripted, tkg):
    hostile = "home\x1b[1A\x1b[2K\r  argv: [\"fake\"]\u202e"
    ada = as_agent(tkg, "sk-ada", "ada-bot")
    asking = Asking(ada, scripted, "publish", {"page": hostile}, word="hostile")
    (approval,) = waiting(tkg)
    listing = cli(tkg, "approvals").stdout
    assert "\x1b" not in listing and "\u202e" not in listing and "\r" not in listing
    assert "\\x1b[1A" in listing and "\\u202e" in listing
    assert "why: a gated tool, and yolo: false" in listing and "(ada-bot)" in listing
    raw = urllib.request.urlopen(urllib.request.Request(tkg.base_url[:-3] + "/toolkeeper/approvals",
                                                        headers={"Authorization": f"Bearer {TOKEN}"}), timeout=10)
    assert b"\x1b" not in raw.read()
    cli(tkg, "deny", approval)
    asking.result()
    log = tkg.process.stderr()
    assert "waiting for approval" in log and "\x1b" not in log and "\u202e" not in log


def test_secrets_are_redacted_for_the_approver_and_the_log(scripted, tkg):
    asking = Asking(tkg, scripted, "login", {"user": "ada", "api_token": "tok-9f8e7d6c5b"}, word="secret")
    (approval,) = waiting(tkg)
    listing = cli(tkg, "approvals").stdout
    assert "tok-9f8e7d6c5b" not in listing and "[redacted]" in listing
    cli(tkg, "approve", approval)
    assert "ran" in asking.result()
    assert tkg.calls() == [["login", "ada", "--token=tok-9f8e7d6c5b"]]  # the tool got the real value
    assert "tok-9f8e7d6c5b" not in tkg.process.stderr()


def test_always_never_lifts_a_security_rules_ask(scripted, tkg):
    asking = Asking(tkg, scripted, "publish", {"page": "admin"}, word="admin-1")
    (approval,) = waiting(tkg)
    assert "why: rule ask-admin-pages: Admin pages need a person." in cli(tkg, "approvals").stdout
    run = cli(tkg, "approve", approval, "--always")
    assert "approved once: a security rule asked" in run.stdout
    assert "ran" in asking.result()
    again = Asking(tkg, scripted, "publish", {"page": "admin"}, word="admin-2")
    (second,) = waiting(tkg)  # it asks again
    cli(tkg, "deny", second)
    assert again.result().startswith("Not run")
    assert "no always grant" in cli(tkg, "approvals", "--always").stdout


def test_an_always_grant_is_for_one_agent_recorded_listed_and_revocable(scripted, tkg):
    ada, bob = as_agent(tkg, "sk-ada", "ada-bot"), as_agent(tkg, "sk-bob", "bob-bot")
    first = Asking(ada, scripted, "publish", {"page": "home"}, word="grant-1")
    (approval,) = waiting(tkg)
    assert "now always allowed" in cli(tkg, "approve", approval, "--always", "--as", "carol").stdout
    assert "ran" in first.result()
    assert "ran" in Asking(ada, scripted, "publish", {"page": "blog"}, word="grant-2").result()  # no question
    other = Asking(bob, scripted, "publish", {"page": "blog"}, word="grant-3")  # another agent: asked
    (bobs,) = waiting(tkg)
    cli(tkg, "deny", bobs)
    assert other.result().startswith("Not run")
    grants = cli(tkg, "approvals", "--always").stdout
    assert "publish always allowed for" in grants and "by carol" in grants
    records = audit_export(tkg, "publish")
    assert [r["consent"] for r in records if r["status"] == "ok"][-2:] == ["always", "always"]
    grant_id = grants.split()[0]
    assert cli(tkg, "revoke", grant_id).returncode == 0
    revoked = Asking(ada, scripted, "publish", {"page": "news"}, word="grant-4")
    (asked,) = waiting(tkg)  # asked again once revoked
    cli(tkg, "deny", asked)
    assert revoked.result().startswith("Not run")


def test_an_approval_wait_over_the_responses_api_keeps_the_agent_alive(scripted, tka):
    scripted.add({"when": "responses-wait", "tool_calls": [call("release", {"version": "7.0.0"})]},
                 {"when": "responses-wait", "content": "{tool_result}"})
    client = tka.client()
    chunks: list[bytes] = []

    def ask() -> None:
        with client.responses.with_streaming_response.create(model="m", input="responses-wait", stream=True) as r:
            chunks.append(r.read())

    worker = threading.Thread(target=ask)
    worker.start()
    (approval,) = waiting(tka)
    time.sleep(0.5)  # a few keep-alives while it waits
    assert cli(tka, "approve", approval).returncode == 0
    worker.join(30)
    text = chunks[0].decode()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert ": keep-alive" in text and events[-1]["type"] == "response.completed"
    assert not any((e.get("item") or {}).get("type") == "function_call" for e in events)
    assert tka.calls() == [["release", "7.0.0"]]


def test_an_approval_wait_over_the_messages_api_sends_pings(scripted, tka):
    import anthropic

    scripted.add({"when": "messages-wait", "tool_calls": [call("release", {"version": "8.0.0"})]},
                 {"when": "messages-wait", "content": "{tool_result}"})
    chunks: list[bytes] = []

    def ask() -> None:
        with anthropic.Anthropic(base_url=tka.base_url[:-3], api_key="sk-ant-wait", max_retries=0) as api, \
                api.messages.with_streaming_response.create(
                    model="c", max_tokens=50, stream=True,
                    messages=[{"role": "user", "content": "messages-wait"}]) as response:
            chunks.append(response.read())

    worker = threading.Thread(target=ask)
    worker.start()
    (approval,) = waiting(tka)
    time.sleep(0.5)
    assert cli(tka, "approve", approval).returncode == 0
    worker.join(30)
    text = chunks[0].decode()
    assert 'event: ping\ndata: {"type": "ping"}' in text and text.rstrip().endswith('{"type":"message_stop"}')
    assert tka.calls() == [["release", "8.0.0"]]


def tokens(directory, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkeeper", "tokens", *args, "--store",
                           str(directory / "store.sqlite3")], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_named_tokens_answer_as_themselves_and_each_role_reaches_only_its_part(scripted, tka, approvals_dir):
    added = tokens(approvals_dir, "add", "ada", "--role", "approver")
    assert added.returncode == 0, added.stderr
    ada = added.stdout.split(": ", 1)[1].strip()
    audit_token = tokens(approvals_dir, "add", "eve", "--role", "auditor").stdout.split(": ", 1)[1].strip()
    assert tokens(approvals_dir, "add", "ada", "--role", "admin").returncode == 2  # in force: revoke first
    assert "ada  approver" in tokens(approvals_dir, "list").stdout

    asking = Asking(tka, scripted, "release", {"version": "8.8.8"}, word="named")
    (approval,) = waiting(tka)
    as_eve = cli(tka, "approve", approval, token=audit_token)
    assert as_eve.returncode != 0 and "403" in as_eve.stderr and "admin or approver role" in as_eve.stderr
    assert cli(tka, "approvals", token=audit_token).returncode != 0  # an auditor reads the trail only
    done = cli(tka, "approve", approval, "--as", "mallory", token=ada)
    assert done.returncode == 0 and f"{approval}: approved by ada" in done.stdout  # not the name it claims
    assert "ran" in asking.result()

    bob = tokens(approvals_dir, "add", "bob", "--role", "admin").stdout.split(": ", 1)[1].strip()
    asking = Asking(tka, scripted, "release", {"version": "8.8.9"}, word="named-admin")
    (approval,) = waiting(tka)
    done = cli(tka, "approve", approval, "--as", "alice", token=bob)
    assert f"{approval}: approved by bob" in done.stdout  # an admin-role token is still its own name
    assert "ran" in asking.result()

    assert tokens(approvals_dir, "revoke", "ada").returncode == 0
    refused = cli(tka, "approvals", token=ada)
    assert refused.returncode != 0 and "401" in refused.stderr
    for name in ("", "admin", "ada smith"):
        assert tokens(approvals_dir, "add", name, "--role", "approver").returncode == 2
    missing = subprocess.run([sys.executable, "-m", "toolkeeper", "tokens", "list", "--store",
                              str(approvals_dir / "nowhere.sqlite3")], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and "no store at" in missing.stderr
