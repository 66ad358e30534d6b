"""Limits in the offline tools (issue 42): `policy test` scenarios that set counts, `policy explain --limit`, and
`policy replay` saying how many calls a candidate limit would have stopped over a real trail.

The scenarios run through the real CLI against a real policy file. The trail
is written through toolkeeper's own audit trail, as tests/trails.py writes
the shadow-replay trail: each call's policy input built by `policy_input`,
decided by the rules in force, recorded as ran or refused. The replay's
sliding windows are checked against the store's own counts (`take`,
`add_to_counts`) on the same calls at the same times.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import LOOKUP, YOLO, run_cli, serving, write_agent

from toolkeeper.audit import ExecutionRecord, open_audit
from toolkeeper.policy import Policy, load_rules, policy_input, replay_calls
from toolkeeper.policy.replay_limits import Window
from toolkeeper.store import Count, SQLiteStore

AGENT = """
upstream: http://127.0.0.1:9/v1
yolo: true
tools:
  - name: delete_ticket
    description: Delete a ticket. Returns what was deleted.
    parameters:
      ticket: {type: string, description: "The ticket to delete, like T-12."}
    command: ["/bin/echo", "deleted", "{{ticket}}"]
  - name: deploy
    description: Deploy a service. Returns the deploy log.
    parameters:
      service: {type: string, description: "The service to deploy."}
    command: ["/bin/echo", "deployed", "{{service}}"]
"""
POLICY = """
limits:
  - id: ticket-deletes
    when: {tool: delete_ticket}
    max: 20
    per: 1h
    scope: user
    reason: At most 20 ticket deletions an hour per person.
  - id: team-deploys
    when: {tool: deploy}
    max: 10
    per: 1d
    scope: group
    effect: ask
    reason: A team deploys at most 10 times a day without a person confirming.
  - id: deploy-time
    counts: run_time
    when: {tool: deploy}
    max: 60
    per: 1h
    reason: At most a minute of deploys an hour.
  - id: model-budget
    counts: tokens
    max: 100000
    per: 1d
rules:
  - id: deletes-ask-past-fifteen
    effect: ask
    reason: Past 15 ticket deletions this hour, a person confirms each.
    when: {tool: delete_ticket, limits: {ticket-deletes.used: {above: 14}}}
  - id: deploys-of-a-busy-team
    effect: ask
    reason: The busiest of your teams deployed 9 times today.
    when: {tool: deploy, limits: {team-deploys.used: {above: 8, below: 10}}}
"""
ADA = "principal: {user: ada@example.com, groups: [sre, platform]}"


def scenario(name: str, call: str, expect: str, *lines: str) -> str:
    said = "".join(f"\n    {line}" for line in lines)
    return f"""
  - name: {name}
    {ADA}
    call: {call}
    expect: {expect}{said}"""


DELETE = "{tool: delete_ticket, arguments: {ticket: T-7}}"
DEPLOY = "{tool: deploy, arguments: {service: billing}}"
BASH = "{tool: Bash, source: agent, arguments: {command: ls}}"
PASSING = [
    scenario("the first deletion of the hour runs", DELETE, "allow"),
    scenario("the fourteenth runs", DELETE, "allow", "limits: {ticket-deletes: 13}"),
    scenario("a rule asks from the sixteenth, reading limits.ticket-deletes.used", DELETE, "ask",
             "rule: deletes-ask-past-fifteen", "limits: {ticket-deletes: 15}"),
    scenario("the twentieth is still asked", DELETE, "ask", "rule: deletes-ask-past-fifteen",
             "limits: {ticket-deletes: 19}"),
    scenario("the twenty-first is denied by the limit", DELETE, "deny", "rule: ticket-deletes",
             "limits: {ticket-deletes: 20}"),
    scenario("a limit that does not select the call leaves it alone", BASH, "allow",
             "limits: {ticket-deletes: 500, deploy-time: 900}"),
    scenario("one group of the user's past its limit asks", DEPLOY, "ask", "rule: team-deploys",
             "limits: {team-deploys: {group=sre: 3, group=platform: 10}}"),
    scenario("the rules read the most used of the user's groups", DEPLOY, "ask", "rule: deploys-of-a-busy-team",
             "limits: {team-deploys: {group=sre: 9}}"),
    scenario("both groups under their limit are allowed", DEPLOY, "allow",
             "limits: {team-deploys: {group=sre: 3, group=platform: 8}}"),
    scenario("after 59.5 seconds of deploys the next runs", DEPLOY, "allow", "limits: {deploy-time: 59.5}"),
    scenario("with a minute of deploys spent the next is denied", DEPLOY, "deny", "rule: deploy-time",
             "limits: {deploy-time: 60}"),
    scenario("a limit's deny wins over a rule's ask", DEPLOY, "deny", "rule: deploy-time",
             "limits: {deploy-time: 61, team-deploys: 9}"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("limits_offline")
    (directory / "agent.yaml").write_text(AGENT)
    (directory / "rules.yaml").write_text(POLICY)
    return directory


def scenarios(folder: Path, *bodies: str, name: str = "scenarios.yaml") -> Path:
    path = folder / name
    path.write_text("agent_file: agent.yaml\npolicy: rules.yaml\nscenarios:" + "".join(bodies) + "\n")
    return path


def test_scenarios_set_the_limits_counts_and_a_limit_decides_beside_the_rules(folder):
    run = run_cli("policy", "test", str(scenarios(folder, *PASSING)))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"scenarios: {len(PASSING)} passed, 0 failed" in run.stdout
    assert ("PASS [rules rules.yaml] the twenty-first is denied by the limit: deny (limit ticket-deletes: At most 20 "
            "ticket deletions an hour per person.)") in run.stdout
    assert ("PASS [rules rules.yaml] one group of the user's past its limit asks: ask (limit team-deploys: A team "
            "deploys at most 10 times a day") in run.stdout
    assert "with a minute of deploys spent the next is denied: deny (limit deploy-time: At most a minute" in run.stdout


def test_a_scenario_whose_count_says_otherwise_fails(folder):
    wrong = [scenario("expected to run, but the limit is reached", DELETE, "allow", "limits: {ticket-deletes: 20}"),
             scenario("expected the limit, but a rule asks first", DELETE, "deny", "rule: ticket-deletes",
                      "limits: {ticket-deletes: 16}"),
             scenario("a group the call is not counted under", DEPLOY, "allow",
                      "limits: {team-deploys: {group=ops: 3}}")]
    run = run_cli("policy", "test", str(scenarios(folder, *wrong, PASSING[0], name="wrong.yaml")))
    assert run.returncode == 1, run.stdout + run.stderr
    assert ("FAIL [rules rules.yaml] expected to run, but the limit is reached: expected allow, got deny (limit "
            "ticket-deletes: At most 20") in run.stdout
    assert ("FAIL [rules rules.yaml] expected the limit, but a rule asks first: expected deny by rule ticket-deletes, "
            "got ask (rule deletes-ask-past-fifteen") in run.stdout
    assert ("FAIL [rules rules.yaml] a group the call is not counted under: limits: 'team-deploys': the call is not "
            "counted under group=ops (it is under group=sre, group=platform)") in run.stdout
    assert "scenarios: 1 passed, 3 failed" in run.stdout


@pytest.mark.parametrize(("limits", "said"), [
    ("{ticket-deletes: 3, ticket-delete: 4}", "scenario 'named': limits: no limit 'ticket-delete' in the policy "
                                              "(its limits: ticket-deletes, team-deploys, deploy-time, model-budget)"),
    ("{model-budget: 500}", "scenario 'named': limits: 'model-budget' counts model tokens, checked before each "
                            "model round, not each call"),
    ("{ticket-deletes: 2.5}", "scenario 'named': limits: 'ticket-deletes' counts calls, a whole number"),
])
def test_a_scenario_naming_a_limit_the_policy_lacks_is_an_error_naming_it(folder, limits, said):
    path = scenarios(folder, PASSING[0], scenario("named", DELETE, "allow", f"limits: {limits}"), name="bad.yaml")
    run = run_cli("policy", "test", str(path))
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"toolkeeper: {path}: {said}" in run.stdout
    assert "PASS" not in run.stdout  # nothing is run from a file that names a limit wrongly


def test_explain_takes_the_counts_and_shows_what_each_limit_reads(folder):
    run = run_cli("policy", "explain", "agent.yaml", "deploy", "service=billing", "--policy", "rules.yaml",
                  "--user", "ada@example.com", "--group", "sre", "--group", "platform",
                  "--limit", "team-deploys=9", "--limit", "deploy-time=12.5", cwd=folder)
    assert run.returncode == 0, run.stdout + run.stderr
    document = json.loads(run.stdout.split("policy input:\n")[1].split("\n\nrules ")[0])
    assert document["limits"] == {
        "team-deploys": {"used": 9, "max": 10, "remaining": 1, "per": "1d", "scope": "group=sre", "counts": "calls"},
        "deploy-time": {"used": 12.5, "max": 60, "remaining": 47.5, "per": "1h", "scope": "global",
                        "counts": "run_time"}}
    assert "  MATCH deploys-of-a-busy-team: ask" in run.stdout
    assert "  COUNT team-deploys: 9 of 10 calls in the last 1d for group=sre" in run.stdout
    assert "        ticket-deletes: does not select this call" in run.stdout
    assert "        model-budget: model tokens, counted by round" in run.stdout
    assert "decision: ask (rule deploys-of-a-busy-team: The busiest of your teams" in run.stdout

    past = run_cli("policy", "explain", "agent.yaml", "deploy", "service=billing", "--policy", "rules.yaml",
                   "--limit", "deploy-time=60", cwd=folder)
    assert "  PAST  deploy-time: 60 of 60 seconds of run time in the last 1h for global: this call is denied" in \
        past.stdout
    assert "decision: deny (limit deploy-time: At most a minute of deploys an hour.)" in past.stdout
    for wrong, said in (("nope=3", "no limit 'nope' in the policy"), ("team-deploys", "--limit is ID=USED"),
                        ("team-deploys=-1", "--limit is ID=USED")):
        refused = run_cli("policy", "explain", "agent.yaml", "deploy", "service=billing", "--policy", "rules.yaml",
                          "--limit", wrong, cwd=folder)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr


# -- replay --------------------------------------------------------------------------------------------------------

START = datetime(2026, 11, 2, 9, 0).astimezone()
CALLS = 300  # one every 10 s: 50 minutes, inside every window below
CURRENT = """
rules:
  - id: no-locked-tickets
    effect: deny
    reason: Locked tickets stay.
    when: {tool: delete_ticket, arguments: {ticket: {matches: "^LOCKED-"}}}
"""
CANDIDATE = CURRENT + """
limits:
  - id: ticket-deletes
    when: {tool: delete_ticket}
    max: 20
    per: 1h
    scope: user
    reason: At most 20 ticket deletions an hour per person.
  - id: build-time
    counts: run_time
    when: {tool: build}
    max: 120
    per: 1h
  - id: model-budget
    counts: tokens
    max: 100000
    per: 1d
"""
EVE = "<b>eve\x1b[31m</b>"  # a user name a terminal or a page must not obey


def call_of(index: int) -> tuple[str, dict, str]:
    """(tool, arguments, user): ada and eve delete tickets (every fourth of eve's is a locked one, denied now);
    bob builds, 25 s a run, every 30 s."""
    if index % 3 == 0:
        return "delete_ticket", {"ticket": f"T-{index}"}, "ada@example.com"
    if index % 3 == 1:
        return "delete_ticket", {"ticket": f"LOCKED-{index}" if index % 12 == 1 else f"T-{index}"}, EVE
    return "build", {"target": "all"}, "bob@example.com"


def seed(trail: Path, rules: Path) -> None:
    audit = open_audit(trail)
    policy = Policy(True, load_rules(rules))
    loop = asyncio.new_event_loop()
    try:
        for index in range(CALLS):
            tool, arguments, user = call_of(index)
            now = START + timedelta(seconds=10 * index)
            document = policy_input(tool, arguments, ["/bin/echo", *arguments.values()], agent_id="ops-bot",
                                    request_id=f"req{index}", now=now, source="declared", tier="gated", yolo=True,
                                    principal={"user": user, "groups": ["ops"]})
            decision = loop.run_until_complete(policy.decide(document))
            record = ExecutionRecord(time=now.timestamp(), request_id=f"req{index}", agent="ops-bot", tool=tool,
                                     arguments_sent=arguments, arguments=arguments, policy_input=document,
                                     runner="argv")
            record.decided_by(decision)
            if decision.effect != "allow":
                record.status, record.answer = "denied", f"Not allowed by toolkeeper: {decision.reason}"
                audit.refused(record)
                continue
            audit.decided(record)
            record.status, record.exit_code = "ok", 0
            record.duration_ms = 25000.0 if tool == "build" else 40.0
            audit.completed(record)
    finally:
        loop.close()
        audit.close()


def expected_stops() -> dict[str, list[int]]:
    """The calls each user's count stops, by index, worked out without buckets (every window is longer than the
    trail): ticket deletions run until 20 have run (eve's locked ones never ran, so never counted), a build until
    120 s of builds have run (the 5th starts with 100 s used, the 6th with 125 s)."""
    used: dict[str, float] = {}
    stopped: dict[str, list[int]] = {}
    for index in range(CALLS):
        tool, arguments, user = call_of(index)
        most, amount = (20, 1) if tool == "delete_ticket" else (120, 25)
        if used.get(user, 0) + (amount if tool == "delete_ticket" else 0) > most or (
                tool == "build" and used.get(user, 0) >= most):
            stopped.setdefault(user, []).append(index)
        elif not arguments.get("ticket", "").startswith("LOCKED-"):
            used[user] = used.get(user, 0) + amount
    return stopped


@pytest.fixture(scope="module")
def trail(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("limits_replay")
    (directory / "current.yaml").write_text(CURRENT)
    (directory / "candidate.yaml").write_text(CANDIDATE)
    (directory / "unlimited.yaml").write_text(CURRENT)
    seed(directory / "trail.sqlite3", directory / "current.yaml")
    return directory


def replay(directory: Path, candidate: str, *args: str):
    return run_cli("policy", "replay", "--candidate", str(directory / candidate), "--db",
                   str(directory / "trail.sqlite3"), *args)


def test_replay_says_how_many_calls_each_candidate_limit_would_have_stopped(trail):
    stops = expected_stops()
    assert len(stops["ada@example.com"]) == 80 and len(stops["bob@example.com"]) == 95  # 100 calls each
    result = replay(trail, "candidate.yaml", "--format", "json")
    assert result.returncode == 1, result.stderr  # calls allowed now would be denied: CI stops here
    report = json.loads(result.stdout)
    limits = {limit["id"]: limit for limit in report["limits"]}
    deletes = limits["ticket-deletes"]
    assert deletes["selected"] == 200 and deletes["asked"] == 0
    assert deletes["stopped"] == len(stops["ada@example.com"]) + len(stops[EVE])
    assert deletes["first"] == (START + timedelta(seconds=10 * stops["ada@example.com"][0])).timestamp()
    assert deletes["scopes"] == sorted([{"scope": "user=ada@example.com", "calls": 80},
                                        {"scope": f"user={EVE}", "calls": len(stops[EVE])}],
                                       key=lambda scope: -scope["calls"])
    assert limits["build-time"]["selected"] == 100 and limits["build-time"]["stopped"] == 95
    assert limits["build-time"]["scopes"] == [{"scope": "global", "calls": 95}]
    assert limits["model-budget"] == {"id": "model-budget", "counts": "tokens", "max": 100000, "per": "1d",
                                      "scope": ["global"], "effect": "deny", "replayed": False,
                                      "why": "not replayed: the trail records no model round's usage"}
    # each call the limits stop that ran now is a change, named by the limit; eve's locked ones stay denied
    locked = {index for index in stops[EVE] if index % 12 == 1}
    assert report["tightened"] == 80 + 95 + len(stops[EVE]) - len(locked)
    assert {change["candidate"]["rule"] for change in report["changes"]} == {"ticket-deletes", "build-time"}
    # the limits' calls are in their own report, not among the rules that decided
    assert [(entry["rule"], entry["calls"]) for entry in report["by_rule"]] == [("no-locked-tickets", 25)]


def test_replay_text_shows_the_limit_lines_escaped(trail):
    stops = expected_stops()
    result = replay(trail, "candidate.yaml")
    assert result.returncode == 1
    first = (START + timedelta(seconds=10 * stops["ada@example.com"][0])).strftime("%Y-%m-%d %H:%M:%S")
    assert (f"  ticket-deletes (20 calls per 1h by user, deny): 200 calls selected, "
            f"{80 + len(stops[EVE])} would have been denied, the first at {first}") in result.stdout
    assert "    reached by user=ada@example.com (80), user=<b>eve\\x1b[31m</b> (" in result.stdout
    assert "\x1b" not in result.stdout
    assert "  build-time (120 seconds of run time per 1h by global, deny): 100 calls selected, 95 would" in \
        result.stdout
    assert "  model-budget (model tokens): not replayed: the trail records no model round's usage" in result.stdout


def test_a_window_of_the_trail_is_counted_from_the_calls_before_it(trail):
    """--since and --tool report fewer calls; the calls before the window, and of other tools, still count."""
    since = START + timedelta(minutes=25)
    result = replay(trail, "candidate.yaml", "--since", since.isoformat(), "--tool", "delete_ticket",
                    "--format", "json")
    report = json.loads(result.stdout)
    shown = [index for index in range(150, CALLS) if call_of(index)[0] == "delete_ticket"]
    assert report["replayed"] == len(shown) == 100
    stops = expected_stops()
    limits = {limit["id"]: limit for limit in report["limits"]}
    assert limits["ticket-deletes"]["stopped"] == sum(1 for user in ("ada@example.com", EVE)
                                                     for index in stops[user] if index >= 150) == 100
    assert limits["build-time"]["selected"] == 0


def test_a_candidate_without_limits_reports_nothing_new(trail):
    result = replay(trail, "unlimited.yaml", "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "limits" not in json.loads(result.stdout)
    text = replay(trail, "unlimited.yaml")
    assert "limit" not in text.stdout.lower() and "0 would change" in text.stdout


def test_the_console_replay_page_shows_the_limits_escaped(trail, scripted):
    write_agent(trail, YOLO + LOOKUP)
    token = "admin-token-for-limit-replay-0123456789"
    with serving(scripted, trail, "--audit", str(trail / "trail.sqlite3"),
                 env={"TOOLKEEPER_ADMIN_TOKEN": token}) as running:
        form = urllib.parse.urlencode({"candidate": CANDIDATE}).encode()
        request = urllib.request.Request(running.base_url.removesuffix("/v1") + "/toolkeeper/audit/replay",
                                         data=form, method="POST", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            page = answer.read().decode()
    stops = expected_stops()
    assert page.count("<tr class=limit>") == 3
    assert (f"<tr class=limit><td>ticket-deletes</td><td>20 calls per 1h by user</td><td>200</td>"
            f"<td>{80 + len(stops[EVE])}</td><td>0</td>") in page
    assert "user=&lt;b&gt;eve\\x1b[31m&lt;/b&gt;" in page and "<b>eve" not in page and "\x1b" not in page
    assert "<td>model-budget</td><td>model tokens</td><td colspan=5>not replayed" in page


# -- the windows, as the store keeps them ----------------------------------------------------------------------------

class Clocked(SQLiteStore):
    """The real SQLite store, its clock set by the test: the same calls at the same times as replay reads them."""

    at = 0.0

    def now(self) -> float:
        return self.at


@pytest.mark.parametrize("seconds", [90, 600, 3600])
def test_replay_windows_slide_exactly_as_the_store_counts(tmp_path, seconds):
    """Random calls over three windows' time: at each, the store's `take` (a call) or its sum (run time) and the
    replay's window read the same count, and the same calls are let through."""
    store, window, runs = Clocked(tmp_path / "store.sqlite3"), Window(seconds), Window(seconds)
    calls, timed = Count("calls", "global", seconds, 12), Count("runs", "global", seconds, 40_000)
    chance = random.Random(seconds)
    now, pending = 1_790_000_000.0, []  # pending: (when a run ends, its milliseconds)
    let_through = refused = 0
    loop = asyncio.new_event_loop()
    try:
        for _ in range(400):
            now += chance.uniform(0, seconds / 40)
            for ended, amount in sorted(one for one in pending if one[0] <= now):  # runs that ended meanwhile
                store.at = ended
                loop.run_until_complete(store.add_to_counts([timed], amount))
                runs.add(ended, amount)
                pending.remove((ended, amount))
            store.at = now
            (taken,) = loop.run_until_complete(store.take([calls]))
            assert taken.used == window.used(now) and taken.taken == (window.used(now) + 1 <= 12)
            if taken.taken:
                window.add(now, 1)
            let_through, refused = let_through + taken.taken, refused + (not taken.taken)
            (used,) = loop.run_until_complete(store.used([timed]))
            assert used == runs.used(now)
            if chance.random() < 0.5:
                amount = chance.randrange(1, 5000)
                pending.append((now + amount / 1000, amount))
        # the limit was reached, and calls left the window: more were let through than it holds
        assert refused > 0 and let_through > 12 + window.total
    finally:
        loop.run_until_complete(store.close())
        loop.close()


def test_replay_calls_reads_the_candidates_counts_into_the_policy_input(tmp_path):
    """A candidate rule reading `limits.<id>.used` sees the replayed count, not the one recorded then."""
    (tmp_path / "candidate.yaml").write_text("""
limits:
  - {id: ticket-deletes, when: {tool: delete_ticket}, max: 5, per: 1h, scope: user}
rules:
  - id: ask-past-two
    effect: ask
    when: {tool: delete_ticket, limits: {ticket-deletes.used: {above: 1}}}
""")
    records = []
    for index in range(7):
        document = policy_input("delete_ticket", {"ticket": f"T-{index}"}, None, source="declared", tier="gated",
                                yolo=True, principal={"user": "ada"}, now=START + timedelta(seconds=index))
        document["limits"] = {"ticket-deletes": {"used": 999}}  # what the policy then read: not the candidate's
        records.append({"record_id": f"r{index}", "time": START.timestamp() + index, "tool": "delete_ticket",
                        "source": "declared", "agent": "", "decision": "allow", "decision_source": "yolo",
                        "decision_rule": None, "consent": None, "status": "ok", "duration_ms": 5.0,
                        "policy_input": document})
    report = replay_calls(records, load_rules(tmp_path / "candidate.yaml"))
    effects = [(change.record_id, change.candidate, change.candidate_rule) for change in report.changes]
    # used 0, 1: allowed; 2..4: asked (and run, approved then); 5, 6: denied
    assert effects == [*((f"r{i}", "ask", "ask-past-two") for i in range(2, 5)),
                       *((f"r{i}", "deny", "ticket-deletes") for i in range(5, 7))]
