"""The audit trail: a record per call, written before it runs, chained, redacted, readable."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import orjson
import pytest
from conftest import LOOKUP, ROOT, audit_cli, call, fresh, postgres_schema, serving, user, write_agent

from toolkeeper.audit import ExecutionRecord, open_audit

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
""" + LOOKUP + """      - name: count
        description: Count.
        parameters:
          n: {type: integer, description: "How many."}
        command: ["{python}", "{tools}/record.py", "count", "{{n}}"]
        env: {OUT: "{out}"}
      - name: fail
        description: Fail.
        parameters:
          why: {type: string, description: "Why."}
        command: ["{python}", "{tools}/fail.py", "{{why}}"]
      - name: hang
        description: Hang.
        parameters:
          tag: {type: string, description: "A tag."}
        command: ["{python}", "{tools}/hang.py", "{{tag}}"]
        env: {PIDS: "{pids}"}
        timeout: 0.5
      - name: slow
        description: Take long.
        parameters:
          tag: {type: string, description: "A tag."}
        command: ["{python}", "{tools}/hang.py", "{{tag}}"]
        env: {PIDS: "{pids}"}
        timeout: 60
      - name: authenticate
        description: Log in to a service.
        parameters:
          user: {type: string, description: "Who."}
          api_token: {type: string, description: "The token."}
          passphrase: {type: string, required: false, description: "A configured pattern."}
        command: ["{python}", "{tools}/record.py", "auth", "{{user}}", "--token={{api_token}}", "--pass={{passphrase}}"]
        env: {OUT: "{out}"}
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def backend(request, tmp_path_factory):
    """Where the trail lives: every test here runs on both stores."""
    if request.param == "sqlite":
        yield request.param, str(tmp_path_factory.mktemp("audit-db") / "audit.sqlite3")
    else:
        with postgres_schema() as url:
            yield request.param, url


@pytest.fixture(scope="module")
def audit_dir(tmp_path_factory, backend):
    directory = tmp_path_factory.mktemp("audit")
    write_agent(directory, AGENT, pids=str(directory / "pids"))
    directory.joinpath("db").write_text(backend[1])
    return directory


def location(audit_dir) -> str:
    return audit_dir.joinpath("db").read_text()


@pytest.fixture(scope="module")
def tk_audit_server(scripted, audit_dir):
    patterns = ("--redact", "token", "--redact", "secret", "--redact", "passphrase")
    with serving(scripted, audit_dir, "--audit", location(audit_dir), *patterns) as running:
        yield running


@pytest.fixture
def tku(tk_audit_server):
    yield from fresh(tk_audit_server)


@contextlib.contextmanager
def audit_locked(audit_dir):
    """Another writer holds the audit database."""
    where = location(audit_dir)
    if where.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(where) as holder:
            holder.execute("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE")
            yield
            holder.rollback()
    else:
        holder = sqlite3.connect(where, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()


def stored_bytes(audit_dir) -> bytes:
    """Everything the trail holds, as bytes: to look for what must never be there."""
    where = location(audit_dir)
    if where.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(where) as db:
            rows = db.execute("SELECT record_id, tool, agent, body, hash FROM audit_events").fetchall()
        return b"\n".join(b"|".join(v if isinstance(v, bytes) else str(v).encode() for v in row) for row in rows)
    data = Path(where).read_bytes()
    wal = Path(where + "-wal")
    return data + (wal.read_bytes() if wal.exists() else b"")


def run_call(scripted, tk, name: str, arguments: dict) -> None:
    scripted.script({"tool_calls": [call(name, arguments)]}, {"content": "ok"})
    tk.client().chat.completions.create(model="m", messages=user())


def last_record(audit_dir, tool: str) -> dict:
    exported = audit_cli(location(audit_dir), "export", "--tool", tool).stdout
    return json.loads(exported.strip().splitlines()[-1])


@pytest.mark.parametrize(("tool", "arguments", "status", "expected"), [
    ("lookup", {"word": "fjord"}, "ok", {"exit_code": 0, "argv_tail": ["lookup", "fjord"], "decision": "allow"}),
    ("fail", {"why": "disk full"}, "failed", {"exit_code": 3, "decision": "allow"}),
    ("count", {"n": "three"}, "invalid", {"decision": ""}),  # never reached a decision
    ("lookup", {"word": "/home/me/.ssh/id_rsa"}, "denied", {"decision": "deny", "decision_rule": "credentials-never"}),
    ("hang", {"tag": "audited"}, "timeout", {"exit_code": None, "decision": "allow"}),
])
def test_a_record_for_every_outcome(scripted, tku, audit_dir, tool, arguments, status, expected):
    run_call(scripted, tku, tool, arguments)
    record = last_record(audit_dir, tool)
    assert record["status"] == status
    assert record["arguments_sent"] == arguments  # parsed, so secret-named fields can be redacted
    assert record["agent"] and "sk-test-agent" not in json.dumps(record)
    assert record["runner"] == "argv" and record["call_id"] and record["request_id"]
    if "argv_tail" in expected:
        assert record["argv"][-2:] == expected["argv_tail"]
        assert record["output_bytes"] > 0 and len(record["output_sha256"]) == 64
    for key in ("exit_code", "decision", "decision_rule"):
        if key in expected:
            assert record.get(key) == expected[key], key
    if status in ("ok", "failed", "timeout"):
        assert record["kind"] == "completed" and record["duration_ms"] > 0
        assert record["policy_input"]["tool"]["name"] == tool
    else:
        assert record["kind"] == "refused"


def test_no_record_no_run(scripted, tku, audit_dir):
    with audit_locked(audit_dir):
        scripted.script({"tool_calls": [call("lookup", {"word": "locked"})]}, {"content": "{tool_result}"})
        answer = tku.client().chat.completions.create(model="m", messages=user()).choices[0].message.content
    assert answer.startswith("Not run: lookup could not be recorded in the audit trail")
    assert tku.calls() == []
    run_call(scripted, tku, "lookup", {"word": "unlocked"})  # and once it is free, calls run and are recorded
    assert tku.calls() == [["lookup", "unlocked"]]
    assert last_record(audit_dir, "lookup")["argv"][-1] == "unlocked"


def test_a_secret_argument_never_reaches_the_record(scripted, tku, audit_dir):
    run_call(scripted, tku, "authenticate", {"user": "ada", "api_token": "tok-9f8e7d6c5b4a", "passphrase": "open-sesame"})
    assert tku.calls() == [["auth", "ada", "--token=tok-9f8e7d6c5b4a", "--pass=open-sesame"]]  # the tool got them
    record = last_record(audit_dir, "authenticate")
    assert record["arguments"]["api_token"] == "[redacted]"
    assert record["argv"][-2:] == ["--token=[redacted]", "--pass=[redacted]"]
    assert record["policy_input"]["arguments"]["api_token"] == "[redacted]"
    assert record["arguments"]["user"] == "ada"  # what matches no pattern stays
    assert record["redacted"] == ["arguments.api_token", "arguments.passphrase", "arguments_sent.api_token",
                                  "arguments_sent.passphrase"]
    database = stored_bytes(audit_dir)
    assert b"lookup" in database  # (the bytes are there to be searched)
    assert b"tok-9f8e7d6c5b4a" not in database and b"open-sesame" not in database
    assert b"sk-test-agent" not in database  # nor the agent's key


def test_list_show_and_filters(scripted, tku, audit_dir):
    run_call(scripted, tku, "lookup", {"word": "/etc/shadow"})  # denied by the default policy
    run_call(scripted, tku, "lookup", {"word": "listed"})
    listing = audit_cli(location(audit_dir), "list", "--since", "1h", "--tool", "lookup")
    assert listing.returncode == 0
    record_id = listing.stdout.strip().splitlines()[-2].split()[0]
    assert "lookup" in listing.stdout and " ok " in listing.stdout
    assert audit_cli(location(audit_dir), "list", "--status", "denied").stdout.count("credentials-never") >= 1
    shown = json.loads(audit_cli(location(audit_dir), "show", record_id).stdout)
    assert shown["record_id"] == record_id and shown["argv"][-1] == "listed"
    assert audit_cli(location(audit_dir), "show", "nope").returncode == 1


def test_export_round_trips(scripted, tku, audit_dir):
    run_call(scripted, tku, "lookup", {"word": "exported"})
    lines = [json.loads(line) for line in audit_cli(location(audit_dir), "export").stdout.splitlines()]
    rows = list(csv.DictReader(io.StringIO(audit_cli(location(audit_dir), "export", "--format", "csv").stdout)))
    assert len(rows) == len(lines) > 0
    for row, record in zip(rows, lines, strict=True):
        assert row["record_id"] == record["record_id"] and row["status"] == record["status"]
        if isinstance(record.get("argv"), list):
            assert json.loads(row["argv"]) == record["argv"]


def test_tail_follows_new_records(scripted, tku, audit_dir):
    tail = subprocess.Popen([sys.executable, "-m", "toolkeeper", "audit", "--db", location(audit_dir), "tail"],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        time.sleep(1.0)
        run_call(scripted, tku, "lookup", {"word": "tailed"})
        seen = ""
        deadline = time.monotonic() + 15
        while "tailed" not in seen and time.monotonic() < deadline:
            line = tail.stdout.readline()
            seen += line
            if "lookup" in line and "completed" in line:
                break
        assert "completed" in seen and "lookup" in seen
    finally:
        tail.kill()
        tail.wait()
        tail.stdout.close()


@contextlib.contextmanager
def fresh_trail(kind: str, tmp_path):
    if kind == "sqlite":
        yield str(tmp_path / "audit.sqlite3")
    else:
        with postgres_schema() as url:
            yield url


def tamper(where: str, sql: str, params=()) -> None:
    if where.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(where, autocommit=True) as db:
            db.execute(sql.replace("?", "%s"), params)
    else:
        db = sqlite3.connect(where)
        db.execute(sql, params)
        db.commit()
        db.close()


STORES = pytest.mark.parametrize("kind", ["sqlite", "postgres"])


@STORES
def test_verify_finds_a_tampered_record(tmp_path, kind):
    with fresh_trail(kind, tmp_path) as where:
        _tampered(where)


def _tampered(path):
    audit = open_audit(path)
    for word in ("a", "b", "c"):
        record = ExecutionRecord(tool="lookup", runner="argv", call_id="c", status="ok", argv=["lookup", word])
        audit.decided(record)
        audit.completed(record)
    intact, found = audit.verify()
    assert intact and found.startswith("6 events, chain intact"), found
    audit.close()
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "--db", str(path), "verify"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 0 and run.stdout.startswith("intact: 6 events")
    reader = open_audit(path)
    events = reader.events()
    reader.close()
    target = events[2]["seq"]
    altered = orjson.dumps({k: v for k, v in events[2].items() if k != "seq"}, option=orjson.OPT_SORT_KEYS)
    tamper(str(path), "UPDATE audit_events SET body = ? WHERE seq = ?", (altered.replace(b'"b"', b'"x"'), target))
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "--db", str(path), "verify"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 1
    assert f"TAMPERED: event {target}" in run.stdout and "was altered" in run.stdout


@STORES
def test_a_deleted_record_breaks_the_chain(tmp_path, kind):
    with fresh_trail(kind, tmp_path) as where:
        audit = open_audit(where)
        for word in ("a", "b", "c"):
            audit.refused(ExecutionRecord(tool="lookup", runner="argv", call_id="c", status="invalid", argv=[word]))
        seqs = [event["seq"] for event in audit.events()]
        tamper(where, "DELETE FROM audit_events WHERE seq = ?", (seqs[1],))
        intact, what = audit.verify()
        audit.close()
        assert not intact and f"event {seqs[2]}" in what and "does not follow" in what


@STORES
def test_concurrent_writers_never_fork_the_chain(tmp_path, kind):
    with fresh_trail(kind, tmp_path) as where:
        _concurrent(where)


def _concurrent(path):
    writers = [open_audit(path) for _ in range(4)]  # like replicas sharing one database

    def write(audit, n: int) -> None:
        for i in range(25):
            audit.refused(ExecutionRecord(tool="t", runner="argv", call_id=f"{n}-{i}", status="invalid"))

    threads = [threading.Thread(target=write, args=(w, n)) for n, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    intact, what = writers[0].verify()
    for writer in writers:
        writer.close()
    assert intact, what
    assert what.startswith("100 events")


def scrape(tk) -> str:
    import urllib.request

    with urllib.request.urlopen(tk.base_url[: -len("/v1")] + "/metrics", timeout=10) as answer:
        return answer.read().decode()


def value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_a_real_run(scripted, tku):
    before = scrape(tku)
    run_call(scripted, tku, "lookup", {"word": "metered"})
    after = scrape(tku)
    ok = 'toolkeeper_declared_calls_total{status="ok",tool="lookup"}'
    assert value(after, ok) == value(before, ok) + 1
    answered = 'toolkeeper_requests_total{api="chat",code="200",stream="false"}'
    assert value(after, answered) == value(before, answered) + 1
    assert value(after, "toolkeeper_model_rounds_total") == value(before, "toolkeeper_model_rounds_total") + 2
    assert value(after, 'toolkeeper_decisions_total{effect="allow",source="yolo"}') >= 1
    assert value(after, 'toolkeeper_tool_seconds_count{tool="lookup"}') >= 1
    assert 'toolkeeper_upstream_seconds_bucket{le="+Inf"}' in after
    assert "# TYPE toolkeeper_tool_seconds histogram" in after


def test_readyz_and_healthz(tku):
    import urllib.request

    root = tku.base_url[: -len("/v1")]
    with urllib.request.urlopen(root + "/readyz", timeout=10) as answer:
        assert json.loads(answer.read()) == {"ready": True, "problems": []}
    with urllib.request.urlopen(root + "/healthz", timeout=10) as answer:
        assert json.loads(answer.read())["status"] == "ok"


# -- redaction never fails open -------------------------------------------------------------

def _script_raw_call(scripted, arguments_text: str, finish_reason: str = "tool_calls") -> None:
    scripted.script({"tool_calls": [call("authenticate", arguments_text)], "finish_reason": finish_reason},
                    {"content": "{tool_result}"})


@pytest.mark.parametrize("finish_reason", ["length", "tool_calls"])
def test_cut_off_arguments_are_redacted(scripted, tku, audit_dir, finish_reason):
    _script_raw_call(scripted, '{"user": "ada", "api_token": "tok-cutoff-31337', finish_reason)
    answer = tku.client().chat.completions.create(model="m", messages=user()).choices[0].message.content
    record = last_record(audit_dir, "authenticate")
    assert record["status"] == "invalid"
    assert "tok-cutoff-31337" not in json.dumps(record) and "tok-cutoff-31337" not in record["answer"]
    assert "[redacted]" in record["arguments_sent"] and '"user": "ada"' in record["arguments_sent"]
    assert "arguments_sent.api_token" in record["redacted"]
    assert answer  # the model still got its answer


def test_nested_and_listed_secrets_are_redacted(scripted, tku, audit_dir):
    sent = {"user": "ada", "api_token": "tok-top-77777", "extra": {"deep": {"password": "pw-deep-88888"}},
            "tokens": ["list-one-1111", "list-two-2222"]}
    run_call(scripted, tku, "authenticate", sent)
    record = last_record(audit_dir, "authenticate")
    text = json.dumps(record)
    for secret in ("tok-top-77777", "pw-deep-88888", "list-one-1111", "list-two-2222"):
        assert secret not in text
    assert record["arguments_sent"]["extra"]["deep"]["password"] == "[redacted]"
    assert record["arguments_sent"]["tokens"] == "[redacted]"


def test_a_short_secret_does_not_redact_unrelated_text(scripted, tku, audit_dir):
    run_call(scripted, tku, "authenticate", {"user": "xavier", "api_token": "x"})
    record = last_record(audit_dir, "authenticate")
    assert record["arguments"]["user"] == "xavier" and record["arguments"]["api_token"] == "[redacted]"
    assert record["argv"][-2:] == ["xavier", "--token=[redacted]"]
    assert "xavier" in record["answer"] and "--token=x" not in record["answer"]


def test_redact_adds_and_redact_only_replaces():
    from toolkeeper.audit import Redactor

    added = Redactor.from_settings(["passphrase"])
    assert added.secret_name("passphrase") and added.secret_name("api_key")
    only = Redactor.from_settings([], ["passphrase"])
    assert only.secret_name("passphrase") and not only.secret_name("api_key")


def test_secret_names_are_read_by_word_not_by_letter():
    from toolkeeper.audit import Redactor

    redactor = Redactor()
    secrets = ("api_key", "apiKey", "APIKey", "x-api-key", "token", "access_token", "accessToken", "password",
               "secret", "client_secret", "authorization", "Authorization", "api_keys", "tokens", "token2", "apikey")
    harmless = ("keyword", "monkey", "keyboard_layout", "turkey", "hotkey", "keystroke", "tokenizer", "secretary")
    assert [name for name in secrets if not redactor.secret_name(name)] == []
    assert [name for name in harmless if redactor.secret_name(name)] == []
    added = Redactor.from_settings(["cred*", "session id"])  # a word's glob; words that stand together
    assert added.secret_name("credentials") and added.secret_name("sessionId") and not added.secret_name("session")


RUN_TOGETHER_SECRETS = ("githubtoken", "refreshtoken", "sessiontoken", "apitoken", "bearertoken", "clientsecret",
                        "dbpassword", "DBPASSWORD", "mypassword", "accesskey", "sshkey", "apikey", "MYAPIKEY",
                        "privatekeys", "gitcredentials", "credentials", "dbpasswd", "proxyauthorization",
                        "signingkey", "authkey", "githubtokens")
NOT_SECRETS = ("keyword", "monkey", "keyboard_layout", "hotkey", "turkey", "keystroke", "tokenizer", "secretary",
               "tokenfile", "publickey", "keyring_backend", "passwordless")


def test_secret_names_run_together_are_read_by_their_last_part():
    """A name run together without a break holds a secret's noun at its end (githubtoken, DBPASSWORD), or `key`
    after a qualifier that makes it a secret's (accesskey, sshkey); monkey, hotkey and keyword stay readable."""
    from toolkeeper.audit import Redactor

    redactor = Redactor()
    assert [name for name in RUN_TOGETHER_SECRETS if not redactor.secret_name(name)] == []
    assert [name for name in NOT_SECRETS if redactor.secret_name(name)] == []


def test_a_secret_is_erased_from_every_other_argument_it_appears_in():
    """A secret-named value is replaced, and its text erased from the other arguments (a note, a command line) in
    `arguments_sent`, `arguments` and the policy input; the record lists those paths too."""
    from toolkeeper.audit import ExecutionRecord, Redactor

    sent = {"token": "sk-live-abc123", "note": "uses sk-live-abc123 here",
            "items": [{"command": "curl -H 'X: sk-live-abc123' https://x"}], "count": 3, "user": "ada"}
    record = Redactor().apply(ExecutionRecord(tool="fetch", arguments_sent=json.dumps(sent), arguments=sent,
                                              policy_input={"tool": {"name": "fetch"}, "arguments": sent}))
    assert "sk-live-abc123" not in json.dumps(record.model_dump())
    for arguments in (record.arguments_sent, record.arguments, record.policy_input["arguments"]):
        assert arguments == {"token": "[redacted]", "note": "uses [redacted] here",
                             "items": [{"command": "curl -H 'X: [redacted]' https://x"}], "count": 3, "user": "ada"}
    assert record.redacted == ["arguments.items[0].command", "arguments.note", "arguments.token",
                               "arguments_sent.items[0].command", "arguments_sent.note", "arguments_sent.token"]
    shown, _ = Redactor().shown(sent, [])
    assert shown["note"] == "uses [redacted] here"


def test_cut_off_arguments_are_redacted_in_the_policy_input_too():
    """An agent's call cut off mid-JSON reaches the policy as text: the stored policy input is redacted as text."""
    from toolkeeper.audit import ExecutionRecord, Redactor

    cut_off = '{"query": "rates", "api_key": "sk-live-5e1f0c2a", "pa'
    record = Redactor().apply(ExecutionRecord(tool="fetch", arguments_sent=cut_off,
                                              policy_input={"tool": {"name": "fetch"}, "arguments": cut_off}))
    assert "sk-live-5e1f0c2a" not in json.dumps(record.model_dump())
    assert record.policy_input["arguments"].startswith('{"query": "rates", "api_key": "[redacted]"')


# -- no call left running ------------------------------------------------------------------

def test_a_call_whose_agent_left_is_closed_as_cancelled(scripted, tku, audit_dir):
    scripted.script({"tool_calls": [call("slow", {"tag": "left"})]}, {"content": "never"})
    with pytest.raises(openai.APITimeoutError):
        tku.client(timeout=1.5).chat.completions.create(model="m", messages=user())

    def closed() -> bool:
        lines = audit_cli(location(audit_dir), "export", "--tool", "slow").stdout.splitlines()
        return bool(lines) and json.loads(lines[-1])["status"] == "cancelled"

    deadline = time.monotonic() + 10
    while not closed():
        assert time.monotonic() < deadline, "the cancelled call was never closed"
        time.sleep(0.2)


def test_every_record_carries_the_policy_revision(scripted, tku, audit_dir):
    run_call(scripted, tku, "lookup", {"word": "revised"})
    record = last_record(audit_dir, "lookup")
    assert record["decision_source"] == "yolo" and len(record["policy_revision"] or "") == 12


# -- verify covers what the filters read -----------------------------------------------------

@STORES
def test_an_edited_column_is_tampering(tmp_path, kind):
    with fresh_trail(kind, tmp_path) as where:
        audit = open_audit(where)
        for word in ("a", "b"):
            record = ExecutionRecord(tool="lookup", runner="argv", call_id="c", status="ok", argv=[word])
            audit.decided(record)
            audit.completed(record)
        seq = audit.events()[1]["seq"]
        audit.close()
        tamper(where, "UPDATE audit_events SET tool = ? WHERE seq = ?", ("other", seq))
        run = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "--db", where, "verify"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert run.returncode == 1 and f"event {seq}" in run.stdout and "its tool column says 'other'" in run.stdout


@STORES
def test_a_cut_off_tail_fails_verify_with_the_expected_head(tmp_path, kind):
    with fresh_trail(kind, tmp_path) as where:
        audit = open_audit(where)
        for word in ("a", "b", "c"):
            audit.refused(ExecutionRecord(tool="lookup", runner="argv", call_id="c", status="invalid", argv=[word]))
        head = audit.verify()[1].rsplit("head ", 1)[1]
        last = audit.events()[-1]["seq"]
        audit.close()
        tamper(where, "DELETE FROM audit_events WHERE seq = ?", (last,))
        verify = [sys.executable, "-m", "toolkeeper", "audit", "--db", where, "verify"]
        run = subprocess.run(verify, capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert run.returncode == 1 and "not in the chain" in run.stdout  # the index of calls still holds it
        tamper(where, "DELETE FROM audit_calls WHERE last_seq = ?", (last,))  # a careful editor cuts both
        assert subprocess.run(verify, capture_output=True, cwd=ROOT, timeout=60).returncode == 0  # looks fine alone
        run = subprocess.run([*verify, "--expect-head", head], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert run.returncode == 1 and "tail was cut off" in run.stdout


def test_a_damaged_trail_is_reported_not_a_traceback(tmp_path):
    where = str(tmp_path / "audit.sqlite3")
    audit = open_audit(where)
    audit.refused(ExecutionRecord(tool="lookup", runner="argv", call_id="c", status="invalid"))
    audit.close()
    tamper(where, "UPDATE audit_events SET body = ?", (b"not json at all",))
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "--db", where, "list"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 1 and "the trail was altered" in run.stderr and "Traceback" not in run.stderr


def _calls(audit, count: int, start: float) -> None:
    for i in range(count):
        record = ExecutionRecord(tool=("lookup", "release")[i % 2], runner="argv", call_id=f"c{i}", time=start + i,
                                 request_id=f"q{i // 2}", arguments={"word": f"w{i}%_"}, status="ok",
                                 approver="ada" if i % 3 == 0 else None, waited_ms=1500.0 if i % 3 == 0 else None,
                                 policy_input={"agent": {"header": "blue" if i % 4 == 0 else None}})
        if i % 5 == 0:
            record.status, record.decision_rule = "denied", "no-friday"
            audit.refused(record)
        else:
            audit.decided(record)
            audit.completed(record)


@STORES
def test_pages_filters_and_charts_read_the_index_of_calls(tmp_path, kind):
    with fresh_trail(kind, tmp_path) as where:
        audit = open_audit(where)
        start = time.time() - 3600
        _calls(audit, 120, start)
        first = audit.page({}, size=50)
        assert [e.call_id for e in first.entries][:2] == ["c119", "c118"] and first.newer is None
        second = audit.page({}, before=first.older, size=50)
        third = audit.page({}, before=second.older, size=50)
        assert len(third.entries) == 20 and third.older is None and third.entries[-1].call_id == "c0"
        back = audit.page({}, after=second.newer, size=50)
        assert [e.call_id for e in back.entries] == [e.call_id for e in first.entries] and back.newer is None
        assert audit.count(approver="ada") == 40 and audit.count(header="blue") == 30
        assert audit.count(rule="no-friday", status="denied") == 24 and audit.count(request_id="q7") == 2
        assert audit.count(search="w11") == 1 + 10 and audit.count(search="w11%_") == 1
        assert audit.count(search="w1_") == 0  # LIKE's own wildcards are taken as text
        assert audit.count(since=start + 100, until=start + 110) == 10
        assert {e.call_id for e in audit.records(approver="ada", header="blue")} == {f"c{i}" for i in range(0, 120, 12)}
        charts = audit.charts(start, start + 120, 12)
        assert sum(n for _, _, n in charts["calls"]) == 120 and {b for b, _, _ in charts["calls"]} == set(range(12))
        assert charts["denials"] == [("no-friday", 24)] and dict(charts["tools"]) == {"lookup": 60, "release": 60}
        assert len(charts["waits"]) == 40
        assert audit.verify()[0]
        audit.close()


@STORES
def test_a_trail_from_before_the_index_is_indexed_when_opened(tmp_path, kind):
    with fresh_trail(kind, tmp_path) as where:
        audit = open_audit(where)
        _calls(audit, 30, time.time())
        audit.close()
        tamper(where, "DROP TABLE audit_calls")  # as an earlier release left it
        audit = open_audit(where)
        assert audit.count() == 30 and audit.count(approver="ada") == 10 and audit.verify()[0]
        audit.close()
        tamper(where, "UPDATE audit_calls SET approver = NULL WHERE approver = 'ada'")  # hide who approved
        audit = open_audit(where)
        intact, what = audit.verify()
        assert not intact and "index of calls" in what and "approver" in what
        audit.close()


@STORES
def test_verify_is_intact_while_calls_are_written_and_with_big_integers(tmp_path, kind):
    """Verify reads the chain and its index as of one moment; an argument past 64 bits reads back the same."""
    with fresh_trail(kind, tmp_path) as where:
        audit = open_audit(where)
        audit.refused(ExecutionRecord(tool="lookup", runner="argv", call_id="big", status="invalid",
                                      arguments_sent={"n": 2**70}, arguments={"n": 2**70}))
        stop = threading.Event()

        def write() -> None:
            writer = open_audit(where)
            while not stop.is_set():
                _calls(writer, 3, time.time())
            writer.close()

        writing = threading.Thread(target=write)
        writing.start()
        try:
            verdicts = [audit.verify() for _ in range(5)]
        finally:
            stop.set()
            writing.join(30)
        assert all(intact for intact, _ in verdicts), verdicts
        audit.close()


@STORES
def test_calls_an_older_release_wrote_in_turns_with_this_one_are_indexed(tmp_path, kind):
    """A rolling upgrade: events without index rows, between indexed ones, are indexed at open or by the readiness
    check; the search matches what was typed, any script, and ASCII letters in either case."""
    with fresh_trail(kind, tmp_path) as where:
        audit = open_audit(where)
        _calls(audit, 12, time.time())
        audit.refused(ExecutionRecord(tool="lookup", runner="argv", call_id="u", status="invalid",
                                      arguments={"word": "Ärger Fjord"}))
        ids = [e.record_id for e in audit.records()]
        tamper(where, "DELETE FROM audit_calls WHERE record_id IN (?, ?)", (ids[3], ids[7]))  # written by the old one
        assert audit.count() == 11
        audit.check()  # the newest event is indexed: the check costs one lookup and changes nothing
        assert audit.count() == 11
        tamper(where, "DELETE FROM audit_calls WHERE record_id = ?", (ids[-1],))
        audit.check()  # the newest is not: everything missing is indexed
        assert audit.count() == 13 and audit.verify()[0]
        assert audit.count(search="Ärger") == 1 and audit.count(search="fjord") == 1
        audit.close()
