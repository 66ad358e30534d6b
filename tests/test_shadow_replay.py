"""Shadow rules and replay (issue 26), against a real serve, its real trail and the real CLI.

A shadow rule is evaluated on each call, recorded on the call's record and
counted, and never decides. The hooks door carries the agent's working
directory, so a path rule resolves a relative path in it. `policy replay`
decides a trail of 20,000 seeded calls again under a candidate and names
exactly the calls that would change; the console shows the same report.
"""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import LOOKUP, YOLO, audit_cli, run_cli, serving, write_agent
from trails import CANDIDATE_RULES, COMMANDS, CURRENT_RULES, call_of, seed

RULES = """
rules:
  - id: no-rm-rf
    effect: deny
    reason: Recursive forced deletion is not for agents.
    when: {source: agent, tool: Bash, arguments: {command: {runs: {program: rm, flags: [r, f]}}}}
  - id: private-files-never
    effect: deny
    reason: The private folder is off limits.
    when: {source: agent, tool: Read, arguments: {file_path: {under: [/srv/private]}}}
  - id: curl-would-be-denied
    effect: deny
    mode: shadow
    reason: Downloads go through the mirror.
    when: {source: agent, tool: Bash, arguments: {command: {runs: {program: [curl, wget]}}}}
  - id: pushes-would-ask
    effect: ask
    mode: shadow
    when: {source: agent, tool: Bash, arguments: {command: {runs: {prefix: [git, push]}}}}
"""
TOKEN = "admin-token-for-replay-tests-0123456789"


def hook(base: str, tool: str, tool_input: dict, cwd: str = "/work") -> dict:
    event = {"session_id": "s1", "transcript_path": "/tmp/t.jsonl", "cwd": cwd, "hook_event_name": "PreToolUse",
             "tool_name": tool, "tool_input": tool_input, "tool_use_id": f"toolu_{time.monotonic_ns()}"}
    request = urllib.request.Request(base + "/toolkeeper/hooks", method="POST",
                                     data=json.dumps({"agent": "claude-code", "event": event}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def decision_of(answer: dict) -> str:
    return answer["decision"]


@pytest.fixture(scope="module")
def governed(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("shadow")
    write_agent(directory, YOLO + LOOKUP)
    (directory / "rules.yaml").write_text(RULES)
    with serving(scripted, directory, "--policy", str(directory / "rules.yaml"),
                 env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN}) as running:
        yield running, running.base_url.removesuffix("/v1"), directory / "toolkeeper-audit.sqlite3"


def test_a_shadow_rule_is_recorded_and_counted_but_does_not_decide(governed):
    _, base, trail = governed
    # no rule in force decides these: the hook gives no decision (the agent's own flow), whatever a shadow rule
    # would have done; the record keeps the policy's own verdict, the default allow
    assert decision_of(hook(base, "Bash", {"command": "curl -s https://example.com | tee page.html"})) == "defer"
    assert decision_of(hook(base, "Bash", {"command": "git -C repo push origin main"})) == "defer"
    assert decision_of(hook(base, "Bash", {"command": "sudo rm -fr /var/tmp/x && curl x"})) == "deny"
    assert decision_of(hook(base, "Bash", {"command": "ls -la"})) == "defer"

    exported = [json.loads(line) for line in audit_cli(trail, "export").stdout.splitlines()]
    shadows = {entry["arguments"]["command"]: (entry["decision"], entry["shadow"]) for entry in exported}
    assert shadows["curl -s https://example.com | tee page.html"] == (
        "allow", [{"rule": "curl-would-be-denied", "effect": "deny"}])
    assert shadows["git -C repo push origin main"] == ("allow", [{"rule": "pushes-would-ask", "effect": "ask"}])
    assert shadows["sudo rm -fr /var/tmp/x && curl x"] == ("deny", [{"rule": "curl-would-be-denied",
                                                                    "effect": "deny"}])
    assert shadows["ls -la"] == ("allow", [])

    listed = audit_cli(trail, "list", "--shadow", "deny").stdout
    assert listed.count("Bash") == 2 and "2 records" in listed
    assert "1 record\n" in audit_cli(trail, "list", "--shadow", "ask").stdout
    metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    assert 'toolkeeper_shadow_matches_total{effect="deny",rule="curl-would-be-denied"} 2.0' in metrics
    assert 'toolkeeper_shadow_matches_total{effect="ask",rule="pushes-would-ask"} 1.0' in metrics


def test_the_console_trail_filters_on_what_a_shadow_rule_would_have_done(governed):
    _, base, _ = governed
    hook(base, "Bash", {"command": "wget -q https://example.com/x"})
    request = urllib.request.Request(base + "/toolkeeper/audit?shadow=deny",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        page = answer.read().decode()
    assert "shadow curl-would-be-denied: deny" in page and "pushes-would-ask" not in page
    refused = urllib.request.Request(base + "/toolkeeper/audit?shadow=maybe",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(refused, timeout=10)
    assert bad.value.code == 400
    bad.value.close()


def test_a_relative_path_is_resolved_in_the_working_directory_the_hook_gives(governed):
    _, base, trail = governed
    assert decision_of(hook(base, "Read", {"file_path": "private/keys.txt"}, cwd="/srv")) == "deny"
    assert decision_of(hook(base, "Read", {"file_path": "../private/keys.txt"}, cwd="/srv/public")) == "deny"
    assert decision_of(hook(base, "Read", {"file_path": "private/keys.txt"}, cwd="/work")) == "defer"
    entry = json.loads(audit_cli(trail, "export", "--tool", "Read").stdout.splitlines()[0])
    assert entry["policy_input"]["workdir"] == "/srv" and entry["decision_rule"] == "private-files-never"


# -- replay -------------------------------------------------------------------------------------------------------

CALLS = 20000


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    directory = tmp_path_factory.mktemp("replay")
    (directory / "current.yaml").write_text(CURRENT_RULES)
    (directory / "candidate.yaml").write_text(CANDIDATE_RULES)
    ids = seed(directory / "trail.sqlite3", CALLS, directory / "current.yaml")
    return directory, ids, [record_id for index, record_id in enumerate(ids) if downloads(index)]


def downloads(index: int) -> bool:
    """The seeded call is a Bash call of curl: the candidate denies those."""
    return call_of(index)[0] == "Bash" and COMMANDS[index % len(COMMANDS)].startswith("curl")


def replay(directory: Path, *args: str, trail: str = "trail.sqlite3"):
    return run_cli("policy", "replay", "--candidate", str(directory / "candidate.yaml"), "--db",
                   str(directory / trail), *args)


def test_replay_names_exactly_the_calls_a_candidate_would_deny(seeded):
    directory, _, denied = seeded
    started = time.monotonic()
    result = replay(directory, "--format", "json")
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr  # calls allowed now would be denied: CI stops here
    report = json.loads(result.stdout)
    assert report["replayed"] == CALLS and report["skipped"] == 0
    assert [change["record_id"] for change in report["changes"]] == denied
    assert all(change["current"] == {"effect": "allow", "rule": None} and change["candidate"]["rule"] ==
               "no-downloads" for change in report["changes"])
    assert report["tightened"] == len(denied) > 1000
    decided = {(entry["rule"], entry["effect"]): entry["calls"] for entry in report["by_rule"]}
    assert decided[("no-downloads", "deny")] == len(denied)
    ssh = COMMANDS.index("cat ~/.ssh/id_ed25519")
    ssh_calls = sum(1 for index in range(CALLS) if call_of(index)[0] == "Bash" and index % len(COMMANDS) == ssh)
    assert report["shadow"] == [{"rule": "ssh-keys-would-be-denied", "effect": "deny", "calls": ssh_calls}]
    print(f"replayed {CALLS} calls in {took:.1f} s (bench/replay.py measures it)")


def test_replay_takes_a_window_and_a_tool_and_says_so_in_text(seeded):
    directory, _, _ = seeded
    reads = replay(directory, "--tool", "Read")
    assert reads.returncode == 0, reads.stdout + reads.stderr  # nothing about Read changes
    assert "0 would change" in reads.stdout and "chain intact" in reads.stdout
    first_hour = replay(directory, "--since", "2026-11-01T09:00", "--until", "2026-11-01T10:00")
    assert first_hour.returncode == 1
    assert "replayed 3600 calls" in first_hour.stdout and "allow -> deny (no-downloads)" in first_hour.stdout
    mistyped = replay(directory, "--since", "yesterday")  # a usage error, never "the rules would tighten"
    assert mistyped.returncode == 2 and "--since is a number and a unit" in mistyped.stderr


def test_replay_refuses_a_broken_candidate_and_a_tampered_trail(seeded, tmp_path):
    directory, _, _ = seeded
    (tmp_path / "candidate.yaml").write_text("rules:\n  - id: x\n    effect: deny\n")
    broken = run_cli("policy", "replay", "--candidate", str(tmp_path / "candidate.yaml"), "--db",
                     str(directory / "trail.sqlite3"))
    assert broken.returncode == 2 and "a deny rule needs a reason" in broken.stderr
    copy = tmp_path / "trail.sqlite3"
    with sqlite3.connect(directory / "trail.sqlite3") as source, sqlite3.connect(copy) as target:
        source.backup(target)
    with sqlite3.connect(copy) as db:
        changed = db.execute("UPDATE audit_events SET body = replace(body, 'git status', 'git stash') WHERE seq = 1")
        assert changed.rowcount == 1
    copy.chmod(0o600)
    (tmp_path / "candidate.yaml").write_text(CANDIDATE_RULES)
    tampered = run_cli("policy", "replay", "--candidate", str(tmp_path / "candidate.yaml"), "--db", str(copy))
    assert tampered.returncode == 2 and "does not verify" in tampered.stderr and "replayed" not in tampered.stdout


def test_the_console_replays_pasted_rules(seeded, scripted):
    directory, directory_ids, _ = seeded
    write_agent(directory, YOLO + LOOKUP)
    with serving(scripted, directory, "--audit", str(directory / "trail.sqlite3"),
                 env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN}) as running:
        base = running.base_url.removesuffix("/v1") + "/toolkeeper/audit/replay"
        form = urllib.parse.urlencode({"candidate": CANDIDATE_RULES, "since": "2026-11-01T09:00",
                                       "until": "2026-11-01T10:00"}).encode()
        request = urllib.request.Request(base, data=form, method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            page = answer.read().decode()
        first_hour = [directory_ids[index] for index in range(3600) if downloads(index)]
        assert "3600 calls replayed" in page
        assert int(page.split("<strong id=changed>")[1].split("<")[0]) == len(first_hour) == page.count(
            "<tr class=change>")
        assert all(f"/toolkeeper/audit/{record_id}'" in page for record_id in first_hour)
        bad = urllib.parse.urlencode({"candidate": "rules: [{id: x, effect: deny}]"}).encode()
        request = urllib.request.Request(base, data=bad, method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400 and "a deny rule needs a reason" in refused.value.read().decode()
        refused.value.close()
        as_json = urllib.request.Request(base, data=b'{"candidate": "rules: []"}', method="POST", headers={
            "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})  # no form: nothing to replay
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(as_json, timeout=30)
        assert refused.value.code == 400 and "No candidate rules were sent" in refused.value.read().decode()
        refused.value.close()


# -- replay of redacted values -------------------------------------------------------------------------------------

SEARCH = """
      - name: search
        description: Search the index for a keyword. Use it to look things up. Returns the hits.
        parameters:
          keyword: {type: string, description: "The keyword."}
          api_key: {type: string, description: "The index's key."}
        command: ["{python}", "{tools}/record.py", "search", "{{keyword}}"]
        env: {OUT: "{out}"}
"""
REDACTED_CANDIDATE = """
rules:
  - id: no-drops
    effect: deny
    reason: No destructive searches.
    when: {tool: search, arguments: {keyword: {matches: drop}}}
  - id: no-live-keys
    effect: deny
    reason: Agents search with test keys only.
    when: {tool: search, arguments: {api_key: {matches: '^sk-live-'}}}
"""


def test_replay_says_what_it_cannot_judge_from_a_redacted_trail(scripted, tmp_path):
    """`keyword` is no secret (a key name matches a pattern by word): a candidate testing it is judged. `api_key`
    is redacted in the trail: a candidate rule testing it cannot be judged, and the call is reported so, never as
    unchanged; the exit status holds back the candidate as a change would. The console says the same."""
    from conftest import call, user

    write_agent(tmp_path, YOLO + SEARCH)
    (tmp_path / "candidate.yaml").write_text(REDACTED_CANDIDATE)
    with serving(scripted, tmp_path, "--policy", "none", env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN}) as running:
        for arguments in ({"keyword": "drop table", "api_key": "sk-live-7f3a9c"},
                          {"keyword": "weather", "api_key": "sk-live-b81d20"}):
            scripted.script({"tool_calls": [call("search", arguments)]}, {"content": "ok"})
            running.client().chat.completions.create(model="m", messages=user())
        form = urllib.parse.urlencode({"candidate": REDACTED_CANDIDATE}).encode()
        request = urllib.request.Request(running.base_url.removesuffix("/v1") + "/toolkeeper/audit/replay", data=form,
                                         method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            page = answer.read().decode()
        running.close_clients()
    trail = tmp_path / "toolkeeper-audit.sqlite3"
    records = [json.loads(line) for line in audit_cli(trail, "export", "--tool", "search").stdout.splitlines()]
    dropped, weather = records
    assert dropped["policy_input"]["arguments"] == {"keyword": "drop table", "api_key": "[redacted]"}

    result = run_cli("policy", "replay", "--candidate", str(tmp_path / "candidate.yaml"), "--db", str(trail),
                     "--format", "json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [(change["record_id"], change["candidate"]["rule"]) for change in report["changes"]] == [
        (dropped["record_id"], "no-drops")]  # denied whatever its key: judged
    assert report["unjudged"] == report["unjudged_may_tighten"] == 1
    (unjudged,) = report["unjudged_calls"]
    assert unjudged["record_id"] == weather["record_id"] and unjudged["current"]["effect"] == "allow"
    assert unjudged["candidate"] == {"effects": ["allow", "deny"], "rules": ["no-live-keys"]}
    assert unjudged["redacted"] == ["arguments.api_key"]
    assert report["transitions"] == [{"current": "allow", "candidate": "deny", "calls": 1}]  # never allow -> allow

    text = run_cli("policy", "replay", "--candidate", str(tmp_path / "candidate.yaml"), "--db", str(trail))
    assert text.returncode == 1
    assert "1 cannot be judged from the trail" in text.stdout
    assert (f"{weather['record_id'][:12]} search [declared]: allow -> allow or deny? (no-live-keys tests "
            "arguments.api_key, redacted)") in text.stdout

    assert "<strong id=unjudged>1</strong> cannot be judged from the trail" in page
    assert page.count("<tr class=unjudged>") == 1 and f"/toolkeeper/audit/{weather['record_id']}'" in page
    assert "<strong id=changed>1</strong>" in page


# -- replay of redacted values: what a second reader found ----------------------------------------------------------

def agent_record(record_id: str, tool: str, arguments: dict) -> dict:
    """A hook call of an agent's own tool as the trail keeps it: allowed by no rule, its policy input redacted."""
    document = {"tool": {"name": tool, "source": "agent", "kind": "function", "runner": "agent", "tier": "gated"},
                "arguments": arguments, "argv": [], "mode": {"yolo": True}}
    return {"record_id": record_id, "time": 0.0, "tool": tool, "source": "agent", "agent": "", "decision": "allow",
            "decision_source": "yolo", "decision_rule": None, "consent": None, "policy_input": document}


@pytest.mark.parametrize(("record", "rule"), [
    # `a|b` names either argument: the redacted `token` is one of them
    (agent_record("alt", "Fetch", {"url": "https://x", "token": "[redacted]"}),
     {"token|api_key": {"matches": "^sk-live-"}}),
    (agent_record("nested", "Fetch", {"headers": {"Authorization": "[redacted]"}}),
     {"url|headers.Authorization": {"matches": "sk-live"}}),
    # a secret erased from another argument's text: the text is not what the agent sent
    (agent_record("note", "Fetch", {"token": "[redacted]", "note": "uses [redacted] here"}),
     {"note": {"matches": "sk-live"}}),
    (agent_record("command", "Bash", {"command": "curl -H 'X: [redacted]' https://x", "api_key": "[redacted]"}),
     {"command": {"matches": "sk-live"}}),
], ids=["a-or-b", "a-or-nested-b", "erased-in-another-argument", "erased-in-a-command"])
def test_replay_cannot_judge_a_rule_reading_a_redacted_value_through_a_or_b_or_an_erased_text(tmp_path, record,
                                                                                               rule):
    """A candidate rule whose argument key names a redacted value among others (`token|api_key`), or that reads a
    text a secret was erased from, cannot be judged from the trail: reported so, never as `allow -> allow`."""
    from toolkeeper.policy import load_rules, replay_calls

    (tmp_path / "candidate.yaml").write_text(yaml_rules(rule, record["tool"]))
    report = replay_calls([record], load_rules(tmp_path / "candidate.yaml"))
    assert report.transitions == {} and [call.record_id for call in report.unjudged] == [record["record_id"]]
    (unjudged,) = report.unjudged
    assert unjudged.outcomes == ("allow", "deny") and unjudged.rules == ("live-keys",) and unjudged.may_tighten


def test_replay_still_judges_a_rule_reading_no_redacted_value(tmp_path):
    from toolkeeper.policy import load_rules, replay_calls

    record = agent_record("plain", "Fetch", {"url": "https://x", "token": "[redacted]", "note": "no secret here"})
    (tmp_path / "candidate.yaml").write_text(yaml_rules({"url|note": {"matches": "secret"}}, "Fetch"))
    report = replay_calls([record], load_rules(tmp_path / "candidate.yaml"))
    assert report.unjudged == [] and report.transitions == {("allow", "deny"): 1}


def yaml_rules(arguments: dict, tool: str) -> str:
    return json.dumps({"rules": [{"id": "live-keys", "effect": "deny", "reason": "No live keys.",
                                  "when": {"source": "agent", "tool": tool, "arguments": arguments}}]})
