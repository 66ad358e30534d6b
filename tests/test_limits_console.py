"""The limits' state, made visible and resettable: the admin API, `toolkeeper limits`, the console page and
/metrics, on a real server counting real declared calls (SQLite and PostgreSQL).

Calls come through the scripted model for users a trusted header names; a scope no header can carry (a user
name with control characters) is counted with the store's own `take()`. A reset is checked in the trail, as an
auditor reads it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    YOLO,
    Toolkeeper,
    audit_cli,
    call,
    postgres_schema,
    recording_tool,
    run_cli,
    start_toolkeeper,
    user,
    write_agent,
)
from prometheus_client.parser import text_string_to_metric_families

from toolkeeper.store import Count, open_store

TOKEN = "test-admin-token-limits"
IMAGES = ROOT / "docs" / "images"
HEADER = "X-Forwarded-User"
AGENT = YOLO + recording_tool("delete_ticket", "ticket", "Delete a ticket.", "The ticket's id.") + recording_tool(
    "export", "table", "Export a table.", "The table.")
RULES = """
limits:
  - id: ticket-deletes
    when: {tool: delete_ticket}
    max: 3
    per: 1h
    scope: user
    reason: At most 3 ticket deletions an hour per person.
  - id: exports
    when: {tool: export}
    max: 5
    per: 1d
    scope: [user, tool]
    effect: ask
  - id: run-time
    counts: run_time
    when: {tool: export}
    max: 2.5
    per: 15m
    scope: tool
  - id: tokens-per-agent
    counts: tokens
    when: {principal: {agent: {equals: nobody-calls-as-this}}}
    max: 1000
    per: 1d
    scope: agent
"""
HOSTILE_HTML = "<img src=x onerror=alert(1)>@example.com"
# what no header can carry: an escape sequence, a bidi override, a newline, and markup
HOSTILE_SCOPE = "user=eve\x1b[31m\u202e\n<script>alert(2)</script>"


class Served:
    def __init__(self, tk: Toolkeeper, location: str):
        self.tk = tk
        self.location = location
        self.root = tk.base_url[: -len("/v1")]
        self.tokens: dict[str, str] = {}

    @property
    def trail(self) -> Path:
        return self.tk.directory / "toolkeeper-audit.sqlite3"


def add_token(location: str, name: str, role: str) -> str:
    run = run_cli("tokens", "add", name, "--role", role, "--store", location, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.split(": ", 1)[1].strip()


def delete_tickets(scripted, served: Served, who: str | None, *tickets: str) -> list[str]:
    """One turn deleting `tickets` for `who` (the trusted header names them): what each call answered."""
    scripted.script({"tool_calls": [call("delete_ticket", {"ticket": ticket}) for ticket in tickets]},
                    {"content": "done"})
    headers = {HEADER: who} if who else {}
    served.tk.client().chat.completions.create(model="m", messages=user(), extra_headers=headers)
    return [m["content"] for m in scripted.bodies()[-1]["messages"] if m["role"] == "tool"]


def seed(location: str, limit_id: str, scope: str, window: float, most: int, amount: int) -> None:
    """A count made the way the engine makes one (`take`, forced past the maximum when asked to)."""
    async def main() -> None:
        store = open_store(location)
        try:
            await store.take([Count(limit_id, scope, window, most)], amount, force=True)
        finally:
            await store.close()

    on_its_own_loop(main)


def store_totals(location: str, limit_id: str, window: float) -> tuple[int, int, int]:
    async def main() -> tuple[int, int, int]:
        store = open_store(location)
        try:
            return await store.limit_totals(limit_id, window)
        finally:
            await store.close()

    return on_its_own_loop(main)


def on_its_own_loop(main):
    """`main()` run to its end in a thread of its own: Playwright's sync API holds this thread's event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result(60)


def api(served: Served, path: str, token: str = TOKEN, body: dict | None = None,
        accept: str | None = None) -> tuple[int, dict | str]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(served.root + path, headers=headers, method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            text, status = answer.read().decode(), answer.status
    except urllib.error.HTTPError as refused:
        with refused:
            text, status = refused.read().decode(), refused.code
    with contextlib.suppress(json.JSONDecodeError):
        return status, json.loads(text)
    return status, text


def scrape(served: Served) -> tuple[str, dict[tuple[str, frozenset], float]]:
    with urllib.request.urlopen(served.root + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples = {(sample.name, frozenset(sample.labels.items())): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}
    return text, samples


def cli(served: Served, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess:
    return run_cli(*args, "--url", served.root, env={"TOOLKEEPER_ADMIN_TOKEN": token}, timeout=60)


@contextlib.contextmanager
def limited_server(scripted, directory: Path, location: str):
    write_agent(directory, AGENT)
    (directory / "rules.yaml").write_text(RULES)
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--policy", str(directory / "rules.yaml"),
                               "--store", location, "--identity-header", HEADER, "--consent", "none",
                               env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    served = Served(Toolkeeper(process, directory), location)
    try:
        yield served
    finally:
        served.tk.close_clients()
        process.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request, scripted, tmp_path_factory):
    """A server whose limits have counted: ada's three deletions and a fourth denied, bob's one, and eve's
    (whose name no header can carry) seeded; the auditor's and the approver's tokens."""
    directory = tmp_path_factory.mktemp(f"limits-{request.param}")
    with contextlib.ExitStack() as stack:
        location = str(directory / "store.sqlite3") if request.param == "sqlite" else \
            stack.enter_context(postgres_schema())
        done = stack.enter_context(limited_server(scripted, directory, location))
        done.answers = delete_tickets(scripted, done, "ada@example.com", "T-1", "T-2", "T-3", "T-4")
        delete_tickets(scripted, done, "bob@example.com", "T-5")
        delete_tickets(scripted, done, HOSTILE_HTML, "T-6")
        seed(location, "ticket-deletes", HOSTILE_SCOPE, 3600, 3, 2)
        done.tokens = {"audra": add_token(location, "audra", "auditor"), "apu": add_token(location, "apu", "approver")}
        yield done


def test_the_api_lists_each_limit_with_its_scopes_most_used_first(served):
    assert sum("At most 3 ticket deletions an hour per person." in said for said in served.answers) == 1
    status, listing = api(served, "/toolkeeper/limits")
    assert status == 200
    limits = {limit["id"]: limit for limit in listing["limits"]}
    assert list(limits) == ["ticket-deletes", "exports", "run-time", "tokens-per-agent"]  # the policy file's order
    deletes = limits["ticket-deletes"]
    assert {key: deletes[key] for key in ("counts", "max", "per", "scope", "effect", "reason")} == {
        "counts": "calls", "max": 3, "per": "1h", "scope": ["user"], "effect": "deny",
        "reason": "At most 3 ticket deletions an hour per person."}
    assert deletes["used_total"] == 7 and deletes["used_highest"] == 3 and deletes["scopes_counted"] == 4
    assert deletes["scopes"] == [
        {"scope": "user=ada@example.com", "used": 3, "remaining": 0, "full": True},  # the fourth was denied
        {"scope": HOSTILE_SCOPE, "used": 2, "remaining": 1, "full": False},
        {"scope": f"user={HOSTILE_HTML}", "used": 1, "remaining": 2, "full": False},
        {"scope": "user=bob@example.com", "used": 1, "remaining": 2, "full": False}]
    assert limits["tokens-per-agent"]["scopes"] == [] and limits["tokens-per-agent"]["used_total"] == 0
    status, one = api(served, "/toolkeeper/limits/ticket-deletes")
    assert status == 200 and one == deletes
    status, said = api(served, "/toolkeeper/limits/no-such-limit")
    assert status == 404 and said == {"error": "no limit 'no-such-limit' in the policy in force"}


def test_run_time_is_shown_in_seconds_and_every_role_that_reads_may_read(served):
    seed(served.location, "run-time", "tool=export", 900, 2500, 1500)  # milliseconds, as the engine counts
    for token in (TOKEN, served.tokens["audra"], served.tokens["apu"]):
        status, listing = api(served, "/toolkeeper/limits/run-time", token=token)
        assert status == 200, listing
        assert (listing["max"], listing["used_total"], listing["per"]) == (2.5, 1.5, "15m")
        assert listing["scopes"] == [{"scope": "tool=export", "used": 1.5, "remaining": 1.0, "full": False}]
    request = urllib.request.Request(served.root + "/toolkeeper/limits")  # no token: the guard's 401
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    refused.value.close()


def test_metrics_read_the_store_by_limit_and_never_name_a_scope(served):
    text, samples = scrape(served)
    scopes, used, highest = store_totals(served.location, "ticket-deletes", 3600)
    mine = {"limit": "ticket-deletes"}
    for name, value in (("max", 3), ("used", used), ("used_highest", highest), ("scopes", scopes),
                        ("scopes_full", 1)):
        assert samples[(f"toolkeeper_limit_{name}", frozenset(mine.items()))] == value, name
    assert (used, scopes, highest) == (7, 4, 3)
    assert samples[("toolkeeper_limit_stopped_total", frozenset({**mine, "effect": "deny"}.items()))] == 1
    assert samples[("toolkeeper_limit_stopped_total",
                    frozenset({"limit": "exports", "effect": "ask"}.items()))] == 0  # there from the start
    assert samples[("toolkeeper_limit_max", frozenset({"limit": "run-time"}.items()))] == 2.5
    assert "# TYPE toolkeeper_limit_used gauge" in text and "# HELP toolkeeper_limit_used " in text
    for name in ("example.com", "user=", "onerror", "script"):
        assert name not in text, name


def test_a_reset_clears_one_scope_or_all_and_is_recorded_as_the_admin_did_it(scripted, served):
    seed(served.location, "exports", "user=zoe@example.com,tool=export", 86400, 5, 5)
    seed(served.location, "exports", "user=yan@example.com,tool=export", 86400, 5, 2)
    # an auditor and an approver read, and may not reset
    for name in ("audra", "apu"):
        status, said = api(served, "/toolkeeper/limits/exports/reset", token=served.tokens[name], body={})
        assert status == 403 and "needs the admin role" in said["error"], said
    status, said = api(served, "/toolkeeper/limits/nope/reset", body={"scope": "global"})
    assert status == 404 and "no limit 'nope'" in said["error"]
    status, said = api(served, "/toolkeeper/limits/exports/reset", body={"scope": ""})
    assert status == 400

    status, done = api(served, "/toolkeeper/limits/exports/reset",
                       body={"scope": "user=zoe@example.com,tool=export", "approver": "root"})
    assert status == 200 and done["cleared"] >= 1 and done["used"] == 5, done
    assert done["id"] == "exports" and done["scope"] == "user=zoe@example.com,tool=export"
    scopes = api(served, "/toolkeeper/limits/exports")[1]["scopes"]
    assert [scope["scope"] for scope in scopes] == ["user=yan@example.com,tool=export"]
    status, everything = api(served, "/toolkeeper/limits/exports/reset", body={})
    assert status == 200 and everything["scope"] is None and everything["used_total"] == 2
    assert api(served, "/toolkeeper/limits/exports")[1]["scopes"] == []

    exported = [json.loads(line) for line in audit_cli(served.trail, "export").stdout.splitlines()]
    resets = [record for record in exported if record["call_id"].startswith("limit-reset:")]
    assert len(resets) == 2
    one, every = resets
    assert (one["tool"], one["decision_source"], one["decision_rule"], one["approver"], one["status"]) == (
        "limit:exports", "limits", "exports", "root", "ok")
    assert one["arguments"] == {"limit": "exports", "scope": "user=zoe@example.com,tool=export", "used": 5}
    assert one["decision_reason"] == ("limit exports reset for user=zoe@example.com,tool=export (5 of 5 calls "
                                      "used) in the last 1d, by root")
    assert every["approver"] == "admin" and every["arguments"]["scope"] is None
    assert every["arguments"]["used_total"] == 2
    listing = audit_cli(served.trail, "list", "--decided-by", "limits", "--approver", "root").stdout
    assert listing.count("limit:exports (admin) allow/exports") == 1 and one["record_id"] in listing, listing
    assert audit_cli(served.trail, "verify").returncode == 0


def test_a_reset_lets_the_next_call_run(scripted, served):
    denied = delete_tickets(scripted, served, "ada@example.com", "T-7")
    assert "At most 3 ticket deletions" in denied[0]
    status, done = api(served, "/toolkeeper/limits/ticket-deletes/reset", body={"scope": "user=ada@example.com"})
    assert status == 200 and done["used"] == 3
    ran = delete_tickets(scripted, served, "ada@example.com", "T-8")
    assert ran[0].startswith("ran "), ran
    scopes = api(served, "/toolkeeper/limits/ticket-deletes")[1]["scopes"]
    assert {"scope": "user=ada@example.com", "used": 1, "remaining": 2, "full": False} in scopes


def test_the_cli_lists_the_limits_and_resets_a_count(served):
    seed(served.location, "exports", "user=quinn@example.com,tool=export", 86400, 5, 4)
    listing = cli(served, "limits")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["LIMIT", "SCOPE", "USED/MAX", "WINDOW", "EFFECT"]
    row = next(line for line in lines if "quinn" in line)
    assert row.split() == ["exports", "user=quinn@example.com,tool=export", "4/5", "1d", "(calls,", "by",
                           "user+tool)", "ask"]
    assert any(line.split()[:3] == ["tokens-per-agent", "-", "0/1000"] for line in lines)
    hostile = next(line for line in lines if "eve" in line)
    assert "\\x1b[31m" in hostile and "\x1b" not in listing.stdout and "\u202e" not in listing.stdout
    as_json = json.loads(cli(served, "limits", "--json").stdout)
    assert [limit["id"] for limit in as_json["limits"]][:2] == ["ticket-deletes", "exports"]

    reset = cli(served, "limits", "reset", "exports", "--scope", "user=quinn@example.com,tool=export", "--as", "carol")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.startswith("exports: the count of user=quinn@example.com,tool=export reset (it had used 4)")
    assert "quinn" not in cli(served, "limits").stdout
    refused = cli(served, "limits", "reset", "exports", token=served.tokens["audra"])
    assert refused.returncode == 1 and "403" in refused.stderr and "admin role" in refused.stderr
    unknown = cli(served, "limits", "reset", "nope")
    assert unknown.returncode == 1 and "404: no limit 'nope'" in unknown.stderr
    assert cli(served, "limits", "frobnicate").returncode == 2
    exported = [json.loads(line) for line in audit_cli(served.trail, "export").stdout.splitlines()]
    assert any(record["approver"] == "carol" and record["arguments"].get("scope", "").startswith("user=quinn")
               for record in exported if record["call_id"].startswith("limit-reset:"))


# -- the console page, in Chromium ------------------------------------------------------------------------------

def signed_in(browser, root: str, token: str):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(root + "/toolkeeper/sign-in?next=/toolkeeper/limits")
    page.fill("input[name=token]", token)
    with page.expect_navigation():
        page.click("button[type=submit]")
    return context, page


@pytest.fixture(scope="module")
def console(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("limits-console")
    location = str(directory / "store.sqlite3")
    with limited_server(scripted, directory, location) as done:
        delete_tickets(scripted, done, "ada@example.com", "T-1", "T-2", "T-3", "T-4")
        delete_tickets(scripted, done, HOSTILE_HTML, "T-5")
        seed(location, "ticket-deletes", HOSTILE_SCOPE, 3600, 3, 2)
        done.tokens = {"audra": add_token(location, "audra", "auditor")}
        yield done


def test_the_console_page_shows_each_limit_escaped_and_an_admin_resets_from_it(console, browser):
    alerts: list[str] = []
    context, page = signed_in(browser, console.root, TOKEN)
    page.on("dialog", lambda dialog: (alerts.append(dialog.message), dialog.dismiss()))
    assert page.url.endswith("/toolkeeper/limits"), page.url
    response = page.goto(console.root + "/toolkeeper/limits")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert page.locator("header a", has_text="Limits").count() == 1
    section = page.locator("section[data-limit='ticket-deletes']")
    assert "at most 3 calls per 1h, by user; past it: deny" in section.locator("h2").inner_text()
    rows = section.locator("tr.scope")
    assert rows.count() == 3
    full = section.locator("tr.full")
    assert full.count() == 1 and "user=ada@example.com" in full.inner_text() and "full" in full.inner_text()
    assert "3 / 3" in full.locator("td.used").inner_text()
    hostile = rows.nth(1).locator("code").inner_text()
    assert hostile == "user=eve\\x1b[31m\\u202e\\x0a<script>alert(2)</script>"  # as text, its escapes visible
    assert f"user={HOSTILE_HTML}" in rows.nth(2).inner_text()
    assert page.locator("img").count() == 0 and page.locator("main script").count() == 0 and not alerts
    assert page.locator("section[data-limit='tokens-per-agent'] p.empty").count() == 1
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "console-limits.png"), full_page=True)  # the how-to shows it

    with page.expect_navigation():
        full.locator("button", has_text="Reset").click()
    notice = page.locator("p.notice").inner_text()
    assert notice == ("limit ticket-deletes reset for user=ada@example.com (3 of 3 calls used) in the last 1h, "
                      "by admin"), notice
    assert page.locator("section[data-limit='ticket-deletes'] tr.full").count() == 0
    assert page.locator("section[data-limit='ticket-deletes'] tr.scope").count() == 2
    with page.expect_navigation():
        page.locator("section[data-limit='ticket-deletes'] form.all button").click()
    assert "reset for every scope (2 with a count" in page.locator("p.notice").inner_text()
    assert page.locator("section[data-limit='ticket-deletes'] p.empty").count() == 1
    # a link cannot make the page announce a reset the trail does not hold
    page.goto(console.root + "/toolkeeper/limits?reset=made-up")
    assert page.locator("p.notice").count() == 0
    context.close()


def test_an_auditor_sees_the_page_without_reset_forms_and_a_form_without_its_csrf_key_is_refused(console, browser):
    seed(console.location, "exports", "user=kim@example.com,tool=export", 86400, 5, 5)
    context, page = signed_in(browser, console.root, console.tokens["audra"])
    page.goto(console.root + "/toolkeeper/limits")
    assert page.locator("section[data-limit='exports'] tr.full").count() == 1
    assert page.locator("form[action*='/reset']").count() == 0 and page.locator("header a", has_text="Limits").count()
    status = page.evaluate("""async () => (await fetch('/toolkeeper/limits/exports/reset', {method: 'POST',
        headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: 'scope=global'})).status""")
    assert status == 403
    context.close()
    context, page = signed_in(browser, console.root, TOKEN)
    status = page.evaluate("""async () => (await fetch('/toolkeeper/limits/exports/reset', {method: 'POST',
        headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: 'scope=global'})).status""")
    assert status == 403  # an admin's session too: no CSRF key, no change
    assert api(console, "/toolkeeper/limits/exports")[1]["used_total"] == 5
    context.close()


# -- the policy in force, and a store that does not answer ------------------------------------------------------

def test_a_reload_shows_the_limits_of_the_new_policy_and_a_broken_store_leaves_metrics_up(scripted, tmp_path):
    location = str(tmp_path / "store.sqlite3")
    with limited_server(scripted, tmp_path, location) as served:
        # answered once the serve loop runs, so its SIGHUP handler is in place (it is added after the start line)
        assert "reports" not in str(api(served, "/toolkeeper/limits")[1])
        (tmp_path / "rules.yaml").write_text(RULES.replace("  - id: exports", "  - id: reports\n    max: 9\n"
                                                           "    per: 1h\n  - id: exports", 1))
        served.tk.process.popen.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reports" not in [limit["id"] for limit in api(served, "/toolkeeper/limits")[1]["limits"]]:
            assert time.monotonic() < deadline, "the reload did not show the new limit"
            time.sleep(0.1)
        assert ("toolkeeper_limit_max", frozenset({"limit": "reports"}.items())) in scrape(served)[1]

        with sqlite3.connect(location) as database:  # the store's counts are gone: every read of them fails
            database.execute("DROP TABLE limit_counts")
        text, samples = scrape(served)
        assert "toolkeeper_limit_used" not in text and ("toolkeeper_model_rounds_total", frozenset()) in samples
        status, said = api(served, "/toolkeeper/limits")
        assert status == 503 and "store" in said["error"]
        assert "left out of this scrape" in served.tk.process.stderr()

    # no YAML rules at all: an empty list, and no limit families
    write_agent(tmp_path, AGENT)
    process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--policy", "none", "--store", location
                               + "-2", env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    try:
        bare = Served(Toolkeeper(process, tmp_path), location)
        assert api(bare, "/toolkeeper/limits") == (200, {"limits": []})
        text = scrape(bare)[0]
        assert "toolkeeper_limit_max" not in text and "toolkeeper_limit_stopped_total{" not in text
        page = api(bare, "/toolkeeper/limits", accept="text/html")[1]
        assert "declares no limits" in page
    finally:
        process.stop()

