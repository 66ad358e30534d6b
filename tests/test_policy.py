"""Policy: the security team's rules, yolo and tiers, combined so the strictest wins."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from conftest import ROOT, call, fresh, run_cli, serving, start_toolkeeper, user, write_agent

from toolkeeper.policy import Policy, RulesError, load_rules, policy_input


class FakeSpec:
    def __init__(self, tier="gated", runner="argv"):
        self.tier, self.runner, self.visibility = tier, runner, "inline"


class FakeTool:
    """A declaration's shape, for documents built without an agent file."""

    def __init__(self, name="release", tier="gated", runner="argv"):
        self.name, self.spec = name, FakeSpec(tier, runner)


def document(name="release", arguments=None, argv=None, tier="gated", runner="argv", yolo=False,
             agent_id="", header=None, at=None):
    return policy_input(FakeTool(name, tier, runner), arguments or {}, argv or [name], agent_id=agent_id,
                        agent_header=header, yolo=yolo, interactive=True, now=at)


def rules_from(tmp_path, text: str):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return load_rules(path)


RULE = {
    None: "rules: []",
    "allow": "rules: [{id: r, effect: allow, when: {tool: release}}]",
    "ask": "rules: [{id: r, effect: ask, when: {tool: release}}]",
    "deny": "rules: [{id: r, effect: deny, reason: Not this one., when: {tool: release}}]",
}
# (rule, tier, yolo) -> decision: a rule can tighten, never loosen; yolo only lifts the tier's own ask
MATRIX = {
    (None, "gated", False): "ask", (None, "gated", True): "allow",
    (None, "silent", False): "allow", (None, "silent", True): "allow",
    ("allow", "gated", False): "ask", ("allow", "gated", True): "allow",
    ("allow", "silent", False): "allow", ("allow", "silent", True): "allow",
    ("ask", "gated", False): "ask", ("ask", "gated", True): "ask",
    ("ask", "silent", False): "ask", ("ask", "silent", True): "ask",
    ("deny", "gated", False): "deny", ("deny", "gated", True): "deny",
    ("deny", "silent", False): "deny", ("deny", "silent", True): "deny",
}


@pytest.mark.parametrize(("rule", "tier", "yolo"), list(MATRIX), ids=[f"{r}-{t}-yolo{y}" for r, t, y in MATRIX])
def test_yolo_tier_rule_matrix(tmp_path, rule, tier, yolo):
    decision = asyncio.run(Policy(yolo, rules_from(tmp_path, RULE[rule])).decide(document(tier=tier, yolo=yolo)))
    assert decision.effect == MATRIX[(rule, tier, yolo)]
    if rule in ("ask", "deny"):
        assert decision.rule_id == "r" and decision.source == "rules"


FRIDAY_NOON = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
MONDAY_NIGHT = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)


@pytest.mark.parametrize(("when", "doc", "matches"), [
    ("{tool: 'rel*'}", {}, True),
    ("{tool: [deploy_*, status]}", {}, False),
    ("{runner: wasm}", {}, False),
    ("{runner: wasm}", {"runner": "wasm"}, True),
    ("{tier: silent}", {"tier": "silent"}, True),
    ("{argv: {matches: '^--force$'}}", {"argv": ["git", "push", "--force"]}, True),
    ("{argv: {matches: '^--force$'}}", {"argv": ["git", "push", "--force-with-lease"]}, False),
    ("{argv: {contains: push}}", {"argv": ["git", "push"]}, True),
    ("{arguments: {channel: {equals: stable}}}", {"arguments": {"channel": "stable"}}, True),
    ("{arguments: {channel: {equals: stable}}}", {"arguments": {"channel": "beta"}}, False),
    ("{arguments: {channel: {in: [a, b]}}}", {"arguments": {"channel": "b"}}, True),
    ("{arguments: {channel: {not_equals: beta}}}", {"arguments": {"channel": "beta"}}, False),
    ("{arguments: {version: {matches: '^2\\.'}}}", {"arguments": {"version": "2.0.1"}}, True),
    ("{arguments: {count: {above: 100}}}", {"arguments": {"count": 101}}, True),
    ("{arguments: {count: {above: 100}}}", {"arguments": {"count": 100}}, False),
    ("{arguments: {count: {below: 0}}}", {"arguments": {"count": -1}}, True),
    ("{arguments: {count: {above: 1}}}", {"arguments": {"count": "5"}}, False),  # not a number: no match
    ("{arguments: {notes: {present: false}}}", {"arguments": {}}, True),
    ("{arguments: {notes: {present: true}}}", {"arguments": {}}, False),
    ("{agent: {ids: [abc]}}", {"agent_id": "abc"}, True),
    ("{agent: {header: {matches: '^team-payments/'}}}", {"header": "team-payments/bot"}, True),
    ("{agent: {header: {equals: x}}}", {}, False),
    ("{time: {weekdays: [fri]}}", {"at": FRIDAY_NOON}, True),
    ("{time: {weekdays: [fri]}}", {"at": MONDAY_NIGHT}, False),
    ("{time: {hours: '09-17'}}", {"at": FRIDAY_NOON}, True),
    ("{time: {hours: '22-06'}}", {"at": MONDAY_NIGHT}, True),
    ("{time: {hours: '22-06'}}", {"at": FRIDAY_NOON}, False),
])
def test_conditions(tmp_path, when, doc, matches):
    rules = rules_from(tmp_path, f"rules: [{{id: r, effect: ask, when: {when}}}]")
    assert bool(rules.matching(document(**doc))) == matches


def test_the_strictest_matching_rule_decides_and_names_itself(tmp_path):
    rules = rules_from(tmp_path, """
rules:
  - {id: allow-all, effect: allow}
  - {id: ask-stable, effect: ask, when: {arguments: {channel: {equals: stable}}}}
  - {id: freeze-friday, effect: deny, reason: Frozen on Fridays., when: {time: {weekdays: [fri]}}}
  - {id: deny-too, effect: deny, reason: Also no., when: {time: {weekdays: [fri]}}}
""")
    friday = rules.decide(document(arguments={"channel": "stable"}, at=FRIDAY_NOON))
    assert (friday.effect, friday.rule_id, friday.reason) == ("deny", "freeze-friday", "Frozen on Fridays.")
    assert friday.revision == rules.revision and len(rules.revision) == 12
    monday = rules.decide(document(arguments={"channel": "stable"}, at=MONDAY_NIGHT))
    assert (monday.effect, monday.rule_id) == ("ask", "ask-stable")


def test_a_policy_that_cannot_be_evaluated_denies(tmp_path):
    rules = rules_from(tmp_path, "rules: [{id: r, effect: allow, when: {tool: x}}]")
    decision = asyncio.run(Policy(True, rules).decide({"mode": {"yolo": True}}))  # a malformed input document
    assert decision.effect == "deny"
    assert decision.reason.startswith("the policy could not be evaluated")


@pytest.mark.parametrize(("text", "expected"), [
    ("rules: [{id: r, effect: deny}]", "rule 'r': a deny rule needs a reason"),
    ("rules: [{id: r, effect: block}]", "rule 'r': key 'effect'"),
    ("rules: [{id: r, effect: ask, when: {tools: x}}]", "rule 'r': key 'when.tools': unknown key"),
    ("rules: [{id: r, effect: ask, when: {argv: {matches: '(['}}}]", "rule 'r': key 'when.argv.matches'"),
    ("rules: [{id: r, effect: ask, when: {time: {hours: '9 to 5'}}}]", "rule 'r': key 'when.time.hours'"),
    ("rules: [{id: r, effect: ask}, {id: r, effect: allow}]", "rule id 'r' is used twice"),
    ("rules: [{effect: ask}]", "rule #1: key 'id': required key is missing"),
    ("rules: [", "not valid YAML"),
])
def test_broken_rules_name_the_file_rule_and_key(tmp_path, text, expected):
    with pytest.raises(RulesError) as caught:
        rules_from(tmp_path, text)
    assert str(caught.value).startswith(str(tmp_path / "rules.yaml"))
    assert expected in str(caught.value)


# -- through a real server -------------------------------------------------------------

RULES = """
rules:
  - id: freeze-stable
    effect: deny
    reason: Releases to stable are frozen this week.
    when: {tool: release, arguments: {channel: {equals: stable}}}
  - id: ask-before-counting-big
    effect: ask
    reason: Large counts need a person.
    when: {tool: count, arguments: {n: {above: 100}}}
"""


@pytest.fixture(scope="module")
def tk_rules_server(scripted, agent_dir, tmp_path_factory):
    rules = tmp_path_factory.mktemp("rules") / "rules.yaml"
    rules.write_text(RULES)
    with serving(scripted, agent_dir, "--policy", str(rules)) as running:  # the agent file says yolo: true
        yield running


@pytest.fixture
def tkr(tk_rules_server):
    yield from fresh(tk_rules_server)


def _results(body):
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def test_a_security_deny_beats_yolo(scripted, tkr):
    scripted.script({"tool_calls": [call("release", {"version": "1.0.0", "channel": "stable"}),
                                    call("release", {"version": "1.0.0", "channel": "beta"})]},
                    {"content": "ok"})
    tkr.client().chat.completions.create(model="m", messages=user())
    assert tkr.calls() == [["release", "1.0.0", "--channel=beta"]]
    denied = _results(scripted.bodies()[1])[0]
    assert denied.startswith("Not run: release was not allowed (Releases to stable are frozen this week.)")


def test_a_security_ask_holds_in_yolo(scripted, tkr):
    scripted.script({"tool_calls": [call("count", {"n": 500})]}, {"content": "ok"})
    tkr.client().chat.completions.create(model="m", messages=user())
    assert tkr.calls() == []  # no one could be asked: an ask without a channel is a deny
    answer = _results(scripted.bodies()[1])[0]
    # the model is told the rule's reason, and that no one could approve it (not "yolo is false": it is true)
    assert "Large counts need a person; it needs a person's approval" in answer and "no approver was available" in answer
    assert "yolo" not in answer


def test_the_default_policy_applies_when_serve_is_given_none(scripted, tk):
    scripted.script({"tool_calls": [call("lookup", {"word": "/home/me/.ssh/id_ed25519"})]}, {"content": "ok"})
    tk.client().chat.completions.create(model="m", messages=user())
    assert tk.calls() == []
    assert "credential file" in _results(scripted.bodies()[1])[0]


# -- the command line ------------------------------------------------------------------

def test_policy_test_runs_the_shipped_scenarios():
    run = run_cli("policy", "test", "policies/default_scenarios.yaml")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS [rules default.yaml] release notes naming an SSH key are denied, even in yolo: deny (rule credentials-never" in run.stdout
    assert "scenarios: 6 passed, 0 failed" in run.stdout


def test_policy_test_fails_on_a_wrong_expectation(tmp_path):
    (tmp_path / "scenarios.yaml").write_text(f"""
agent_file: {ROOT}/declared/example/agent.yaml
scenarios:
  - name: wrongly expected to run
    call: {{tool: read_note, arguments: {{name: .env}}}}
    expect: allow
""")
    run = run_cli("policy", "test", str(tmp_path / "scenarios.yaml"))
    assert run.returncode == 1
    assert "FAIL [rules default.yaml] wrongly expected to run: expected allow, got deny (rule credentials-never" in run.stdout


def test_policy_explain_names_the_rule(tmp_path):
    run = run_cli("policy", "explain", "declared/example/agent.yaml", "read_note", "name=.env")
    assert run.returncode == 0, run.stderr
    assert "MATCH credentials-never: deny" in run.stdout
    assert '"argv": [\n    "notes",\n    "read",\n    ".env"\n  ]' in run.stdout
    assert "decision: deny (rule credentials-never" in run.stdout


def test_serve_refuses_broken_rules(tmp_path):
    (tmp_path / "rules.yaml").write_text("rules: [{id: oops, effect: deny}]")
    agent = write_agent(tmp_path, "tools: []\n")
    run = run_cli("serve", str(agent), "--port", "0", "--policy", str(tmp_path / "rules.yaml"))
    assert run.returncode == 2
    assert "rule 'oops': a deny rule needs a reason" in run.stderr


MISTAKEN_RULES = """
rules:
  - id: guard-deploys
    effect: deny
    reason: No deploys.
    when: {tool: deploy_prod}
  - id: guard-channels
    effect: ask
    reason: Stable needs a person.
    when:
      tool: release
      arguments: {chanel: {equals: stable}}
"""


def test_rules_naming_what_the_agent_file_does_not_declare_are_warned_about(scripted, tmp_path):
    (tmp_path / "rules.yaml").write_text(MISTAKEN_RULES)
    (tmp_path / "scenarios.yaml").write_text(f"""
agent_file: {ROOT}/declared/example/agent.yaml
policy: rules.yaml
scenarios:
  - name: a beta release runs
    call: {{tool: release, arguments: {{version: 1.0.0, channel: beta}}}}
    expect: ask
""")
    run = run_cli("policy", "test", str(tmp_path / "scenarios.yaml"))
    assert "WARN" in run.stdout and "rule 'guard-deploys' names tool deploy_prod" in run.stdout
    assert "rule 'guard-channels' tests argument 'chanel'" in run.stdout
    process = start_toolkeeper(ROOT / "declared/example/agent.yaml", scripted.base_url, "--policy",
                               str(tmp_path / "rules.yaml"), "--store", str(tmp_path / "s.sqlite3"),
                               "--audit", str(tmp_path / "a.sqlite3"))
    log = process.stop()
    assert "names tool deploy_prod" in log and "tests argument 'chanel'" in log


def test_an_empty_rules_file_is_warned_about(scripted, tmp_path):
    (tmp_path / "rules.yaml").write_text("rules: []\n")
    process = start_toolkeeper(ROOT / "declared/example/agent.yaml", scripted.base_url, "--policy",
                               str(tmp_path / "rules.yaml"), "--store", str(tmp_path / "s.sqlite3"),
                               "--audit", str(tmp_path / "a.sqlite3"))
    assert "no rules: only yolo and the tiers decide" in process.stop()


def test_a_scenario_with_an_unknown_key_is_a_one_line_error(tmp_path):
    (tmp_path / "scenarios.yaml").write_text(f"""
agent_file: {ROOT}/declared/example/agent.yaml
scenarios:
  - name: typo
    call: {{tool: read_note, arguments: {{name: x}}}}
    expect: deny
    expected: allow
""")
    run = run_cli("policy", "test", str(tmp_path / "scenarios.yaml"))
    assert run.returncode == 2
    errors = [line for line in run.stdout.splitlines() if line.startswith("toolkeeper:")]
    assert errors == [f"toolkeeper: {tmp_path / 'scenarios.yaml'}: scenario 'typo': key 'expected': unknown key"]


# -- a `matches:` test reads a bounded text (issue 39, a second reader) -------------------------------------------

BOUNDED = """
rules:
  - id: no-cubic-copies
    effect: deny
    reason: No copies to the root.
    when: {tool: release, arguments: {notes: {matches: '(?:^|[;&|(`\\n]\\s*)cp\\s+.*/.*/.*\\s+/.*(?:\\s*$|\\s*[;&|)`\\n])'}}}
  - id: no-force-in-argv
    effect: ask
    when: {tool: release, argv: {matches: '^--force.*x.*x.*y$'}}
  - id: any-channel-allowed
    effect: allow
    when: {tool: release, arguments: {channel: {matches: '^.*$'}}}
"""


def test_a_text_longer_than_a_matches_test_reads_counts_for_a_deny_and_never_for_an_allow(tmp_path):
    """`cp */*/* /*` imported before the import wrote linear expressions searches 2,500 characters for 24 s with the
    whole server held; past the bound (64 KiB) a text is not searched: a deny or an ask matches it, saying why, and
    an allow does not."""
    import time

    from toolkeeper.policy.matching import MAX_MATCHED

    rules = rules_from(tmp_path, BOUNDED)
    long = "cp " + "/" * MAX_MATCHED + "!;"
    started = time.monotonic()
    denied = asyncio.run(Policy(True, rules).decide(document(arguments={"notes": long})))
    assert time.monotonic() - started < 1
    assert denied.effect == "deny" and denied.rule_id == "no-cubic-copies"
    assert f"longer than {MAX_MATCHED:,} characters, more than a `matches:` test reads" in denied.reason
    asked = asyncio.run(Policy(True, rules).decide(document(arguments={"notes": "fine"},
                                                            argv=["release", "--force" + "x" * MAX_MATCHED])))
    assert asked.effect == "ask" and asked.rule_id == "no-force-in-argv" and "longer than" in asked.reason
    allowed = asyncio.run(Policy(True, rules).decide(document(arguments={"channel": "x" * (MAX_MATCHED + 1)}, yolo=True)))
    assert allowed.rule_id is None  # the allow does not match a text it did not read: yolo decides
    within = asyncio.run(Policy(True, rules).decide(document(arguments={"channel": "x" * MAX_MATCHED}, yolo=True)))
    assert within.effect == "allow" and within.rule_id == "any-channel-allowed"
