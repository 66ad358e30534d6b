"""Who each call is for: rules on the principal decide, the trail finds a user's calls (SQLite and PostgreSQL, the
CLI and the console), /metrics counts calls by group and never by user, and `policy test` scenarios and OPA read
`principal` too.

The end-to-end path is a real `toolkeeper serve` behind which a front proxy on this host names the user in
`X-Forwarded-User` (`--identity-header`, believed from loopback by default). Agents' JWTs are tests/test_jwt_agents.py's.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import sqlite3
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from conftest import (
    LOOKUP,
    RELEASE,
    ROOT,
    YOLO,
    Process,
    Toolkeeper,
    audit_cli,
    call,
    postgres_schema,
    run_cli,
    start_toolkeeper,
    user,
    write_agent,
)
from prometheus_client.parser import text_string_to_metric_families
from test_doc_rules import example_folder, marked, place, run_scenarios

from toolkeeper.app import configured_groups
from toolkeeper.audit import ExecutionRecord, open_audit
from toolkeeper.audit.calls import CALLS_SCHEMA, FIRST_COLUMNS
from toolkeeper.cli import approvals as approvals_cli
from toolkeeper.metrics import NO_GROUP, OTHER, Metrics
from toolkeeper.policy import load_rules, policy_input
from toolkeeper.settings import Settings
from toolkeeper.wire.admin.console.queue import _approval_html

TOKEN = "test-admin-token-principal"
HEADER = "X-Forwarded-User"
AGENT = YOLO + LOOKUP + RELEASE
RULES = """
rules:
  - id: only-platform-deploys
    effect: deny
    reason: Only the platform group may deploy or release.
    when:
      tool: release
      principal: {groups: {none: [platform]}}
  - id: mallory-never
    effect: deny
    reason: Nothing runs for mallory.
    when:
      principal: {user: {equals: mallory}}
  - id: on-call-sre-asks
    effect: ask
    reason: On-call engineers confirm what they run.
    when:
      principal: {groups: {all: [sre, "oncall-*"]}}
  - id: outside-engineering-asks
    effect: ask
    reason: Calls for people outside engineering need a second look.
    when:
      tool: lookup
      # a token's user (an issuer vouched for them): a claim a token lacks reads as null, so it asks too
      principal: {issuer: {present: true}, claims: {department: {not_equals: engineering}}}
"""
# The security team's Rego: OPA reads the same principal, as `input.principal`.
REGO = """
package toolkeeper

import rego.v1

default decision := {"effect": "allow", "rule": null, "reason": "no rule matched"}

decision := {"effect": "deny", "rule": "contractors-never", "reason": "Contractors run nothing here."} if {
	"contractors" in input.principal.groups
}

decision := {"effect": "deny", "rule": "eve-never", "reason": "Nothing runs for eve."} if {
	not "contractors" in input.principal.groups
	input.principal.user == "eve"
}
"""


def rules_file(directory: Path, body: str = RULES) -> Path:
    path = directory / "rules.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def principal(user_name: str | None = None, groups: tuple[str, ...] = (), **claims: str) -> dict:
    return {"agent": "release-bot", "user": user_name, "groups": list(groups), "issuer": "https://login.example.com",
            "claims": claims}


# -- rules on the principal --------------------------------------------------------------------------------------


def test_rules_on_principal_groups_user_and_claims_decide(tmp_path):
    rules = load_rules(rules_file(tmp_path))

    def decided(tool: str, who: dict | None) -> tuple[str, str | None] | None:
        decision = rules.decide(policy_input(tool, {"word": "x"}, None, agent_id="a1b2", principal=who))
        return None if decision is None else (decision.effect, decision.rule_id)

    engineer = {"department": "engineering"}
    assert decided("release", principal("ada", ("platform", "sre"), **engineer)) is None
    assert decided("release", principal("bob", ("sales",), **engineer)) == ("deny", "only-platform-deploys")
    assert decided("release", None) == ("deny", "only-platform-deploys")  # no one vouched: it fails closed
    assert decided("lookup", principal("mallory", ("platform",), **engineer)) == ("deny", "mallory-never")
    assert decided("lookup", principal("carol", ("sre", "oncall-eu"), **engineer)) == ("ask", "on-call-sre-asks")
    assert decided("lookup", principal("carol", ("sre",), **engineer)) is None  # `all`: every glob must match
    assert decided("lookup", principal("dan", (), department="sales")) == ("ask", "outside-engineering-asks")
    assert decided("lookup", None) is None  # no user: `present: true` does not hold
    document = policy_input("lookup", {}, None, agent_id="a1b2")
    assert document["principal"] == {"agent": "a1b2", "user": None, "groups": [], "issuer": None, "claims": {}}
    assert rules.named_groups() == {"platform", "sre", "oncall-*"}


def test_a_scenario_sets_the_principal_and_explain_takes_user_and_group(tmp_path):
    rules_file(tmp_path)
    scenarios = tmp_path / "scenarios.yaml"
    scenarios.write_text(textwrap.dedent(f"""
        agent_file: {ROOT / "declared" / "example" / "agent.yaml"}
        policy: rules.yaml
        scenarios:
          - name: platform releases
            call: {{tool: release, arguments: {{version: 1.4.2, channel: beta}}}}
            yolo: true
            principal: {{user: ada, groups: [platform]}}
            expect: allow
          - name: sales does not
            call: {{tool: release, arguments: {{version: 1.4.2, channel: beta}}}}
            yolo: true
            principal: {{user: bob, groups: sales}}
            expect: deny
            rule: only-platform-deploys
          - name: mallory runs nothing, whatever her groups
            call: {{tool: check_service, arguments: {{service: billing}}}}
            principal: {{user: mallory, groups: [platform], issuer: "https://login.example.com"}}
            expect: deny
            rule: mallory-never
          - name: a claim decides
            call: {{tool: Bash, source: agent, arguments: {{command: ls}}}}
            principal: {{user: dan, claims: {{department: sales}}}}
            expect: allow
    """))
    run = run_cli("policy", "test", str(scenarios), cwd=tmp_path)
    assert run.returncode == 0 and "scenarios: 4 passed, 0 failed" in run.stdout, run.stdout + run.stderr

    scenarios.write_text(scenarios.read_text().replace("principal: {user: ada, groups: [platform]}",
                                                       "principal: {user: ada, team: platform}"))
    run = run_cli("policy", "test", str(scenarios), cwd=tmp_path)
    assert run.returncode == 2 and "team" in run.stdout, run.stdout  # an unknown key is an error, not ignored

    explained = run_cli("policy", "explain", str(ROOT / "declared/example/agent.yaml"), "release", "version=1.4.2",
                        "channel=beta", "--policy", str(tmp_path / "rules.yaml"), "--yolo", "--user", "ada",
                        "--group", "platform", "--group", "sre")
    assert explained.returncode == 0, explained.stderr
    shown = json.loads(explained.stdout.split("policy input:\n", 1)[1].split("\nrules ", 1)[0])
    assert shown["principal"] == {"agent": "", "user": "ada", "groups": ["platform", "sre"], "issuer": None,
                                  "claims": {}}
    assert "decision: allow" in explained.stdout
    refused = run_cli("policy", "explain", str(ROOT / "declared/example/agent.yaml"), "release", "version=1.4.2",
                      "channel=beta", "--policy", str(tmp_path / "rules.yaml"), "--yolo", "--user", "bob")
    assert "decision: deny (rule only-platform-deploys" in refused.stdout, refused.stdout + refused.stderr


def test_the_references_only_platform_deploys_example_runs_as_written(tmp_path):
    """docs/reference/policy-rules.md's principal example and its scenarios, as the page shows them."""
    page = "docs/reference/policy-rules.md"
    examples = [body for body in marked(page, "rules") if "principal:" in body]
    scenario_blocks = [body for body in marked(page, "scenarios") if "principal:" in body]
    assert examples and scenario_blocks
    folder = example_folder(tmp_path)
    for body in examples:
        place(folder, body, "rules.yaml")
    printed = run_scenarios(place(folder, scenario_blocks[0], "scenarios.yaml"))
    assert "3 passed, 0 failed" in printed


# -- OPA reads input.principal -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def opa(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rego")
    (folder / "principal.rego").write_text(REGO)
    process = Process([sys.executable, str(ROOT / "tests" / "opa_server.py"), "--policies", str(folder)],
                      "listening on")
    yield process
    process.stop()


def test_opa_denies_on_input_principal_groups(tmp_path, opa):
    """The same scenarios, against YAML rules and against the Rego: both read the principal alike."""
    rules_file(tmp_path, """
        rules:
          - id: contractors-never
            effect: deny
            reason: Contractors run nothing here.
            when:
              principal: {groups: [contractors]}
    """)
    scenarios = tmp_path / "scenarios.yaml"
    scenarios.write_text(textwrap.dedent(f"""
        agent_file: {ROOT / "declared" / "example" / "agent.yaml"}
        policy: rules.yaml
        scenarios:
          - name: a contractor's call is denied
            call: {{tool: check_service, arguments: {{service: billing}}}}
            principal: {{user: zed, groups: [vendors, contractors]}}
            expect: deny
            rule: contractors-never
          - name: an employee's goes ahead
            call: {{tool: check_service, arguments: {{service: billing}}}}
            principal: {{user: ada, groups: [platform]}}
            expect: allow
          - name: as does the agent's alone
            call: {{tool: check_service, arguments: {{service: billing}}}}
            expect: allow
    """))
    run = run_cli("policy", "test", str(scenarios), "--opa-url", opa.url, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"PASS [OPA {opa.url}] a contractor's call is denied: deny (rule contractors-never" in run.stdout
    assert "scenarios: 6 passed, 0 failed" in run.stdout


# -- end to end: serve, a front proxy naming the user ------------------------------------------------------------


class Served:
    """The module's serve and what each call for each user was answered."""

    def __init__(self, tk: Toolkeeper, root: str, trail: Path):
        self.tk, self.root, self.trail = tk, root, trail
        self.answers: dict[str, str] = {}


@pytest.fixture(scope="module")
def served(scripted, opa, tmp_path_factory):
    directory = tmp_path_factory.mktemp("principal")
    write_agent(directory, AGENT)
    rules_file(directory)
    trail = directory / "audit.sqlite3"
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--identity-header", HEADER,
                               "--policy", str(directory / "rules.yaml"), "--opa-url", opa.url, "--audit", str(trail),
                               "--consent", "none", env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    tk = Toolkeeper(process, directory)
    done = Served(tk, tk.base_url[: -len("/v1")], trail)
    try:
        for label, who, tool, arguments in (("ada", "ada", "lookup", {"word": "ada-1"}),
                                            ("ada again", "ada", "lookup", {"word": "ada-2"}),
                                            ("mallory", "mallory", "lookup", {"word": "m"}),
                                            ("eve", "eve", "lookup", {"word": "e"}),
                                            ("ada releases", "ada", "release", {"version": "1.0"}),
                                            ("no one", None, "lookup", {"word": "nobody"})):
            scripted.script({"tool_calls": [call(tool, arguments)]}, {"content": "ok"})
            headers = {HEADER: who} if who else {}
            tk.client().chat.completions.create(model="m", messages=user(), extra_headers=headers)
            done.answers[label] = next(m["content"] for m in scripted.bodies()[1]["messages"] if m["role"] == "tool")
        yield done
    finally:
        tk.close_clients()
        process.stop()


def test_rules_and_opa_decide_on_the_user_the_trusted_header_names(served):
    assert served.answers["mallory"].count("Nothing runs for mallory") == 1  # the YAML rule
    assert "Nothing runs for eve" in served.answers["eve"]  # the Rego, on input.principal.user
    assert "Only the platform group may deploy" in served.answers["ada releases"]  # a header names no group
    ran = [argv for argv in served.tk.calls()]
    assert [argv[-1] for argv in ran] == ["ada-1", "ada-2", "nobody"], ran


def test_audit_list_and_export_find_a_users_calls(served):
    listing = audit_cli(served.trail, "list", "--user", "ada")
    assert listing.returncode == 0 and "3 records" in listing.stdout, listing.stdout + listing.stderr
    assert listing.stdout.count(" for ada\n") == 3 and "mallory" not in listing.stdout
    exported = [json.loads(line) for line in audit_cli(served.trail, "export", "--user", "mallory").stdout.splitlines()]
    assert len(exported) == 1 and exported[0]["decision_rule"] == "mallory-never"
    assert exported[0]["policy_input"]["principal"] == {"agent": exported[0]["agent"], "user": "mallory",
                                                        "groups": [], "issuer": None, "claims": {}}
    assert audit_cli(served.trail, "list", "--user", "nobody").stdout.strip() == "0 records"
    assert audit_cli(served.trail, "verify").returncode == 0


def console_get(served: Served, path: str) -> str:
    request = urllib.request.Request(served.root + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read().decode()


def test_the_console_trail_filters_by_user_and_shows_whom_each_call_was_for(served):
    html = console_get(served, "/toolkeeper/audit?user=ada")
    assert "<span id=total>3</span>" in html
    assert html.count("<td class=user>ada</td>") == 3 and "<td class=user>mallory</td>" not in html
    assert "name=user value='ada'" in html  # the filter field keeps what was typed
    everyone = console_get(served, "/toolkeeper/audit")
    assert "<span id=total>6</span>" in everyone and "<td class=user>eve</td>" in everyone
    assert "<td class=user></td>" in everyone  # the call for no one
    record = next(line for line in audit_cli(served.trail, "export", "--user", "eve").stdout.splitlines())
    detail = console_get(served, "/toolkeeper/audit/" + json.loads(record)["record_id"])
    assert "<dd id='user'>eve</dd>" in detail
    exported = console_get(served, "/toolkeeper/audit/export?format=jsonl&user=ada").splitlines()
    assert len(exported) == 3


def scrape(root: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(root + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_count_the_calls_by_group_and_never_by_user(served):
    samples = scrape(served.root)
    groups = {dict(labels)["group"]: value for (name, labels), value in samples.items()
              if name == "toolkeeper_group_calls_total"}
    # the groups the rules name are there from the start; a header names no group, so every call is `none`
    assert groups == {"platform": 0, "sre": 0, OTHER: 0, NO_GROUP: 6}, groups  # `oncall-*` names no one group
    assert not any(value in ("ada", "mallory", "eve") for (_, labels) in samples for _, value in labels)


# -- the trail's user column, on both databases ------------------------------------------------------------------


@contextlib.contextmanager
def trail_on(kind: str, tmp_path: Path):
    if kind == "sqlite":
        yield str(tmp_path / "audit.sqlite3")
    else:
        with postgres_schema() as url:
            yield url


def execute(where: str, *statements: str) -> None:
    if where.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(where, autocommit=True) as db:
            for statement in statements:
                db.execute(statement)
    else:
        db = sqlite3.connect(where)
        for statement in statements:
            db.execute(statement)
        db.commit()
        db.close()


def write_calls(where: str, users: list[str | None]) -> None:
    audit = open_audit(where)
    for number, who in enumerate(users):
        who_document = principal(who, ("platform",)) if who else None
        record = ExecutionRecord(tool="lookup", runner="argv", call_id=f"c{number}", status="ok", decision="allow",
                                 decision_source="yolo", argv=["lookup", f"w{number}"],
                                 policy_input=policy_input("lookup", {"word": f"w{number}"}, None, agent_id="a1b2",
                                                           principal=who_document))
        audit.decided(record)
        audit.completed(record)
    audit.close()


STORES = pytest.mark.parametrize("kind", ["sqlite", "postgres"])


@STORES
def test_audit_user_filter_and_verify_on_both_databases(tmp_path, kind):
    with trail_on(kind, tmp_path) as where:
        write_calls(where, ["ada", "bob", None, "ada"])
        listing = audit_cli(where, "list", "--user", "ada")
        assert listing.returncode == 0 and "2 records" in listing.stdout, listing.stdout + listing.stderr
        exported = [json.loads(line) for line in audit_cli(where, "export", "--user", "bob").stdout.splitlines()]
        assert [entry["policy_input"]["principal"]["user"] for entry in exported] == ["bob"]
        csv_rows = audit_cli(where, "export", "--user", "ada", "--format", "csv").stdout.splitlines()
        assert len(csv_rows) == 3
        reader = open_audit(where)
        assert reader.count(user="ada") == 2 and reader.distinct("principal_user") == ["ada", "bob"]
        assert [entry.argv[-1] for entry in reader.page({"user": "ada"}).entries] == ["w3", "w0"]
        reader.close()
        assert audit_cli(where, "verify").returncode == 0
        # moving a call from one user to another in the index, to hide it from `--user`, is tampering
        execute(where, "UPDATE audit_calls SET principal_user = 'bob' WHERE principal_user = 'ada' "
                       "AND record_id = (SELECT MIN(record_id) FROM audit_calls WHERE principal_user = 'ada')")
        verify = audit_cli(where, "verify")
        assert verify.returncode == 1 and "its principal_user says 'bob'" in verify.stdout, verify.stdout


@STORES
def test_a_trail_from_before_the_user_column_gets_it(tmp_path, kind):
    with trail_on(kind, tmp_path) as where:
        write_calls(where, [None, None])
        if kind == "postgres":
            execute(where, "ALTER TABLE audit_calls DROP COLUMN principal_user")  # its index goes with it
        else:  # SQLite cannot drop a column after which the schema holds a comment: the table as it was, rebuilt
            old = re.sub(r",(.*)\n\s*principal_user TEXT.*", r"\1", CALLS_SCHEMA).format(key="INTEGER PRIMARY KEY",
                                                                                         real="REAL")
            assert "principal_user" not in old and "shadow TEXT " in old
            columns = ", ".join(column for column in FIRST_COLUMNS if column != "principal_user")
            db = sqlite3.connect(where)
            db.executescript(f"ALTER TABLE audit_calls RENAME TO audit_calls_now; {old} INSERT INTO audit_calls "
                             f"({columns}) SELECT {columns} FROM audit_calls_now; DROP TABLE audit_calls_now;")
            db.close()
        write_calls(where, ["ada"])  # opening it adds the column (and its index), empty for the calls before
        assert "1 record" in audit_cli(where, "list", "--user", "ada").stdout
        assert "3 records" in audit_cli(where, "list").stdout
        assert audit_cli(where, "verify").returncode == 0


# -- metrics, bounded --------------------------------------------------------------------------------------------


def group_series(metrics: Metrics) -> dict[str, float]:
    text = metrics.render().decode()
    return {sample.labels["group"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "toolkeeper_group_calls_total"}


def test_calls_count_by_the_groups_the_configuration_names_and_no_others():
    metrics = Metrics()
    metrics.named_groups({"platform", "security", "sre-*", ""})
    assert group_series(metrics) == {"platform": 0, "security": 0, OTHER: 0, NO_GROUP: 0}  # there from the start
    rng = random.Random(40)
    for number in range(2000):  # many people in many groups: the page does not grow with them
        groups = [f"team-{rng.randrange(10_000)}", *(["platform"] if number % 4 == 0 else [])]
        metrics.record(ExecutionRecord(tool="lookup", status="ok", policy_input=policy_input(
            "lookup", {}, None, principal=principal(f"person-{number}", tuple(groups)))))
    metrics.record(ExecutionRecord(tool="lookup", status="ok", policy_input=policy_input(
        "lookup", {}, None, principal=principal("sec", ("security", "platform", "platform")))))
    metrics.record(ExecutionRecord(tool="lookup", status="ok", policy_input=policy_input("lookup", {}, None)))
    metrics.record(ExecutionRecord(tool="lookup", status="ok"))  # a record with no policy input
    assert group_series(metrics) == {"platform": 501, "security": 1, OTHER: 1500, NO_GROUP: 2}
    assert "person-" not in metrics.render().decode() and "team-" not in metrics.render().decode()
    metrics.named_groups({"auditors"})  # a reload naming another group: its series, from then on
    assert group_series(metrics)["auditors"] == 0 and group_series(metrics)["platform"] == 501


def test_serve_counts_the_groups_of_the_rules_and_of_the_role_mapping(tmp_path):
    """What serve hands the metrics at start and on each reload (app.configured_groups): the groups the rules test,
    and those `auth.oidc.roles` maps to a role (`auth: {oidc: {roles: {security-admins: admin}}}`)."""
    rules = load_rules(rules_file(tmp_path))
    settings = Settings(auth_oidc_roles=("security-admins=admin", "platform=approver"))
    assert configured_groups(rules, settings) == {"platform", "sre", "oncall-*", "security-admins"}
    assert configured_groups(None, Settings()) == set()


# -- approvals show whom the call is for -------------------------------------------------------------------------


def test_approvals_show_whom_the_call_is_for(monkeypatch, capsys):
    waiting = {"id": "ap_ABC", "tool": "release", "arguments": {"version": "1.0"}, "argv": ["release", "1.0"],
               "agent": "release-bot", "why": "gated", "age": 3.0, "created": 1.0, "principal_user": "ada"}
    monkeypatch.setattr(approvals_cli, "_call", lambda at, path, *rest: {"approvals": [waiting]})
    assert approvals_cli.list_command(approvals_cli.Server("http://127.0.0.1:9", TOKEN)) == 0
    assert "agent release-bot for ada" in capsys.readouterr().out
    assert "<dd id='for user'>ada</dd>" in _approval_html(waiting, {})
    before = {key: value for key, value in waiting.items() if key != "principal_user"}
    assert "for user" not in _approval_html(before, {})  # an approval from before, or for no one: no line
    assert approvals_cli.approval_user(before) is None
    assert approvals_cli.approval_user({**before, "principal": {"user": "grace"}}) == "grace"
