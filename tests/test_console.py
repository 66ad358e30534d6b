"""The console in a real headless Chromium: approvers answer from the queue, auditors read the trail.

Each role signs in with its own named token. The screenshots in docs/images are taken here, so the how-tos
show what this code draws.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, Toolkeeper, call, start_toolkeeper, user, write_agent
from test_approvals import AGENT as APPROVALS_AGENT
from test_approvals import TOKEN, Asking, serve

from toolkeeper.audit import ExecutionRecord, open_audit
from toolkeeper.wire.admin.sessions import MAX_FAILURES, Sessions

IMAGES = ROOT / "docs" / "images"
SEEDED = 20_000
AGENT = APPROVALS_AGENT + """
      - name: rotate
        description: Rotate a service's credential.
        parameters:
          service: {type: string, description: "The service."}
          api_token: {type: string, description: "The new token."}
        command: ["{python}", "{tools}/record.py", "rotate", "{{service}}", "{{api_token}}"]
        env: {OUT: "{out}"}
"""


def add_token(directory: Path, name: str, role: str) -> str:
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "tokens", "add", name, "--role", role, "--store",
                          str(directory / "store.sqlite3")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    return run.stdout.split(": ", 1)[1].strip()


def get(url: str, token: str = TOKEN, timeout: float = 30) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode()


def api_post(url: str, token: str, payload: dict) -> int:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code


def waiting_ids(root: str) -> list[str]:
    return [a["id"] for a in json.loads(get(root + "/toolkeeper/approvals")[1])["approvals"]]


def wait_for_approval(root: str, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := waiting_ids(root):
            return found[0]
        time.sleep(0.1)
    raise AssertionError("no call came to wait for approval")


@pytest.fixture(scope="module")
def console(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("console")
    write_agent(directory, AGENT)
    tk = serve(scripted, directory, "--consent-timeout", "60")
    tk.tokens = {"ada": add_token(directory, "ada", "approver"), "eve": add_token(directory, "eve", "auditor")}
    tk.root = tk.base_url[: -len("/v1")]
    yield tk
    tk.process.stop()


def signed_in(browser, root: str, token: str, viewport=None):
    context = browser.new_context(viewport=viewport or {"width": 1280, "height": 860})
    page = context.new_page()
    page.goto(root + "/toolkeeper/sign-in")
    page.fill("input[name=token]", token)
    with page.expect_navigation():
        page.click("button[type=submit]")
    return context, page


def screenshot(page, name: str) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / name), full_page=True)


def test_an_approver_answers_from_the_queue_and_the_agent_gets_its_answer(scripted, console, browser):
    context, page = signed_in(browser, console.root, console.tokens["ada"])
    assert page.url.endswith("/toolkeeper/queue"), page.content()  # an approver's home
    page.wait_for_selector("body[data-live=on]")
    asking = Asking(console, scripted, "rotate", {"service": "billing", "api_token": "sk-secret-123456"}, word="q1")
    row = page.wait_for_selector("[data-approval]", timeout=15_000)  # live: no reload
    text = row.inner_text()
    assert "rotate" in text and "billing" in text and "record.py" in text and "left" in text
    assert "sk-secret-123456" not in page.content()  # redacted before anyone sees it
    screenshot(page, "console-queue.png")
    with page.expect_navigation():
        row.query_selector("button[value=approve]").click()
    assert "approved by ada" in page.locator("p.notice").inner_text()
    assert "ran" in asking.result()
    status, listing = get(console.root + "/toolkeeper/audit?approver=ada")
    assert status == 200 and listing.count("<tr class=record>") == 1 and ">ada<" in listing

    asking = Asking(console, scripted, "publish", {"page": "index"}, word="q2")
    row = page.wait_for_selector("[data-approval]", timeout=15_000)
    row.query_selector("input[name=reason]").fill("not on a Friday")
    with page.expect_navigation():
        row.query_selector("button[value=deny]").click()
    assert "denied by ada" in page.locator("p.notice").inner_text()
    assert "not on a Friday" in asking.result()
    context.close()


def test_approve_always_grants_the_tool_until_revoked_in_the_page(scripted, console, browser):
    context, page = signed_in(browser, console.root, TOKEN)
    asking = Asking(console, scripted, "publish", {"page": "always"}, word="q3")
    row = page.wait_for_selector("[data-approval]", timeout=15_000)
    with page.expect_navigation():
        row.query_selector("button[value=always]").click()
    assert "ran" in asking.result()
    grant = page.locator("tr.grant")
    assert grant.count() == 1 and "publish" in grant.inner_text() and "admin" in grant.inner_text()
    with page.expect_navigation():
        grant.locator("button").click()
    assert "revoked" in page.locator("p.notice").inner_text() and page.locator("tr.grant").count() == 0
    context.close()


def test_an_auditor_cannot_approve(scripted, console, browser):
    context, page = signed_in(browser, console.root, console.tokens["eve"])
    assert page.url.endswith("/toolkeeper/audit")  # an auditor's home
    assert page.locator("header a", has_text="Approvals").count() == 0
    assert page.goto(console.root + "/toolkeeper/queue").status == 403
    assert "may not reach /toolkeeper/queue: it needs the admin or approver role" in page.locator("p").first.inner_text()
    asking = Asking(console, scripted, "release", {"version": "3.0.0"}, word="q4")
    approval = wait_for_approval(console.root)
    assert api_post(f"{console.root}/toolkeeper/approvals/{approval}/approve", console.tokens["eve"], {}) == 403
    assert waiting_ids(console.root) == [approval]
    assert api_post(f"{console.root}/toolkeeper/approvals/{approval}/deny", TOKEN, {}) == 200
    asking.result()
    context.close()


def test_a_form_posted_from_another_site_or_origin_is_refused(scripted, console, browser):
    context, page = signed_in(browser, console.root, console.tokens["ada"])
    asking = Asking(console, scripted, "release", {"version": "4.0.0"}, word="q5")
    approval = wait_for_approval(console.root)
    target = f"{console.root}/toolkeeper/queue/{approval}/approve"
    attack = f"<form method=post action='{target}'><input name=verb value=approve></form>" \
             "<script>document.forms[0].submit()</script>"
    # another site (no cookie goes with it), and the same site on another port (the cookie goes, the key does not)
    for origin in ("http://attacker.test", "http://127.0.0.1:9"):
        page.route(origin + "/", lambda route: route.fulfill(status=200, content_type="text/html", body=attack))
        with page.expect_navigation(url=target):
            page.goto(origin + "/")
        assert page.locator("body").inner_text() != ""
        assert waiting_ids(console.root) == [approval], origin
    assert api_post(f"{console.root}/toolkeeper/approvals/{approval}/deny", TOKEN, {}) == 200
    asking.result()
    context.close()


def test_sessions_end_with_their_token_and_sign_in_is_rate_limited(scripted, tmp_path, browser):
    write_agent(tmp_path, AGENT)
    tk = serve(scripted, tmp_path)
    root = tk.base_url[: -len("/v1")]
    try:
        brief = add_token(tmp_path, "brief", "auditor")
        context, page = signed_in(browser, root, brief)
        assert page.url.endswith("/toolkeeper/audit")
        subprocess.run([sys.executable, "-m", "toolkeeper", "tokens", "revoke", "brief", "--store",
                        str(tmp_path / "store.sqlite3")], check=True, capture_output=True, cwd=ROOT)
        assert page.goto(root + "/toolkeeper/audit").status == 401  # the session died with its token
        add_token(tmp_path, "brief", "auditor")  # the same name again: a new token, and old sessions stay dead
        assert page.goto(root + "/toolkeeper/audit").status == 401
        for _ in range(MAX_FAILURES):
            page.goto(root + "/toolkeeper/sign-in")
            page.fill("input[name=token]", "wrong")
            with page.expect_navigation() as failed:
                page.click("button[type=submit]")
            assert failed.value.status == 401
        page.fill("input[name=token]", TOKEN)  # even the right token waits now
        with page.expect_navigation() as limited:
            page.click("button[type=submit]")
        assert limited.value.status == 429 and "Too many failed sign-ins" in page.content()
        context.close()
    finally:
        tk.process.stop()


def run(coroutine):
    """Its result, from a thread of its own: Playwright's loop runs in this one."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


def test_a_session_expires_and_a_forged_cookie_is_refused(monkeypatch):
    sessions = Sessions("admin-token", None)
    cookie, who = run(sessions.open("admin-token"))
    assert who == ("admin", "admin") and run(sessions.holder(cookie)) == who
    payload, signature = cookie.split(".")
    assert run(sessions.holder(payload + "." + signature[::-1])) is None
    assert run(Sessions("another-admin-token", None).holder(cookie)) is None  # a new admin token ends them
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)
    assert run(sessions.holder(cookie)) is None


# -- the trail, on 20,000 calls ------------------------------------------------------------------------------------

def seed(path: Path, now: float) -> dict[str, int]:
    """20,000 calls over the last 24 hours through the trail's own writer: what the filters should find."""
    audit = open_audit(path)
    audit.connection().execute("PRAGMA synchronous=OFF")  # seeding only: the test's disk need not survive a crash
    tools, counts = ("lookup", "release", "publish", "deploy", "word_count"), {"ada": 0, "team-blue": 0, "denied": 0}
    for i in range(SEEDED):
        tool = tools[i % 5]
        record = ExecutionRecord(tool=tool, runner="argv", call_id=f"c{i}", request_id=f"req{i // 3}",
                                 time=now - 86_000 + i * 4.3, agent="a1b2c3", arguments={"word": f"w{i}"},
                                 argv=[tool, f"w{i}"], decision="allow", decision_source="yolo", status="ok",
                                 policy_input={"agent": {"header": "team-blue" if i % 7 == 0 else None}})
        if i % 7 == 0:
            counts["team-blue"] += 1
        if i % 11 == 0:
            record.decision, record.decision_source, record.decision_rule = "deny", "rules", f"rule-{i % 3}"
            record.status = "denied"
            counts["denied"] += 1
        elif i % 13 == 0:
            record.approver, record.waited_ms, record.consent = "ada", 1000.0 + i % 5000, "approved"
            record.decision_source, record.decision_reason = "consent", "approved by ada"
            counts["ada"] += 1
        record.duration_ms = 3.0 + i % 40
        if record.status == "denied":
            audit.refused(record)
        else:
            audit.decided(record)
            audit.completed(record)
    audit.close()
    return counts


@pytest.fixture(scope="module")
def big(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("big")
    write_agent(directory, AGENT)
    now = time.time()
    counts = seed(directory / "audit.sqlite3", now)
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--audit", str(directory / "audit.sqlite3"),
                               env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    tk = Toolkeeper(process, directory)
    tk.root, tk.counts = tk.base_url[: -len("/v1")], counts
    yield tk
    process.stop()


def timed(url: str) -> tuple[float, str]:
    """The best of three, in seconds: the page's own cost, not the machine's other work."""
    took = []
    for _ in range(3):
        started = time.perf_counter()
        status, html = get(url)
        took.append(time.perf_counter() - started)
        assert status == 200
    return min(took), html


def test_paging_through_20000_calls_is_fast_and_healthz_stays_quick(big):
    listing = big.root + "/toolkeeper/audit"
    took, html = timed(listing)
    assert f"<span id=total>{SEEDED}</span>" in html
    timings, seen, url = [took], html.count("<tr class=record>"), listing
    for _ in range(20):
        url = big.root + html.split("rel=next href='", 1)[1].split("'", 1)[0].replace("&amp;", "&")
        took, html = timed(url)
        timings.append(took)
        seen += html.count("<tr class=record>")
    deep, html = timed(listing + "?before=120")  # the oldest pages cost what the newest do
    timings.append(deep)
    assert seen == 21 * 50 and html.count("<tr class=record>") == 50
    assert max(timings) <= 0.100, timings
    print(f"pages of 50 over {SEEDED} calls: median {statistics.median(timings) * 1000:.1f} ms, "
          f"max {max(timings) * 1000:.1f} ms")

    stop, slowest = threading.Event(), []

    def keep_paging() -> None:
        while not stop.is_set():
            get(listing + "?search=w1")

    pager = threading.Thread(target=keep_paging)
    pager.start()
    try:
        for _ in range(20):
            started = time.perf_counter()
            assert get(big.root + "/healthz")[0] == 200
            slowest.append(time.perf_counter() - started)
    finally:
        stop.set()
        pager.join(30)
    assert max(slowest) < 0.1, slowest


def test_filters_by_approver_header_rule_and_search(big, browser):
    counts = big.counts
    for query, expected in (("approver=ada", counts["ada"]), ("header=team-blue", counts["team-blue"]),
                            ("status=denied", counts["denied"]), ("search=w1999", 1 + 10), ("tool=deploy", SEEDED // 5)):
        status, html = get(f"{big.root}/toolkeeper/audit?{query}")
        assert status == 200 and f"<span id=total>{expected}</span>" in html, query
    context, page = signed_in(browser, big.root, TOKEN)
    page.goto(big.root + "/toolkeeper/audit")
    page.select_option("select[name=approver]", "ada")
    page.select_option("select[name=header]", "team-blue")
    with page.expect_navigation():
        page.click("form.filters button[type=submit]")
    rows = page.locator("tr.record")
    assert rows.count() > 0
    assert set(rows.locator("td.approver").all_inner_texts()) == {"ada"}
    assert set(rows.locator("td.header").all_inner_texts()) == {"team-blue"}
    screenshot(page, "console-trail.png")
    with page.expect_navigation():
        rows.first.locator("a").click()
    assert page.locator("dd[id=approver]").inner_text() == "ada"
    assert page.locator("li.sibling").count() == 2  # the other calls of its request
    screenshot(page, "console-detail.png")
    context.close()


def test_export_takes_the_current_filter(big):
    status, jsonl = get(f"{big.root}/toolkeeper/audit/export?format=jsonl&approver=ada")
    lines = [json.loads(line) for line in jsonl.splitlines()]
    assert status == 200 and len(lines) == big.counts["ada"] and {r["approver"] for r in lines} == {"ada"}
    status, csv = get(f"{big.root}/toolkeeper/audit/export?format=csv&status=denied")
    rows = csv.splitlines()
    assert len(rows) == big.counts["denied"] + 1 and rows[0].startswith("version,record_id,time")
    assert rows[1].split(",")[2][19:20] in ".+-Z"  # ISO 8601, with its zone


def test_charts_draw_a_point_per_bucket_and_bar_per_rule(big, browser):
    context, page = signed_in(browser, big.root, TOKEN)
    page.goto(big.root + "/toolkeeper/audit/charts?range=24h")
    statuses = set(page.locator("svg.calls circle.point").evaluate_all("els => els.map(e => e.dataset.status)"))
    assert statuses == {"ok", "denied"}
    assert page.locator("svg.calls circle.point").count() == 24 * 2
    assert page.locator("svg.denials rect.bar").count() == 3  # rule-0, rule-1, rule-2
    assert page.locator("svg.tools rect.bar").count() == 5
    assert page.locator("svg.waits circle.point").count() == 500  # the newest 500 of the answered approvals
    screenshot(page, "console-charts.png")
    context.close()


def test_verify_now_walks_the_chain(big, browser):
    context, page = signed_in(browser, big.root, TOKEN)
    page.goto(big.root + "/toolkeeper/audit")
    head = page.locator("code#head").inner_text()
    with page.expect_navigation():
        page.click("text=Verify now")
    verdict = page.locator("#verdict").inner_text()
    assert verdict.startswith("intact") and head in verdict and "events" in verdict
    context.close()


def test_control_and_bidi_characters_are_shown_escaped(scripted, tmp_path):
    write_agent(tmp_path, AGENT.replace("yolo: false", "yolo: true"))
    process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    tk = Toolkeeper(process, tmp_path)
    try:
        scripted.script({"tool_calls": [call("release", {"version": "safe\u202e.exe\x1b[2J"})]}, {"content": "ok"})
        tk.client().chat.completions.create(model="m", messages=user())
        tk.close_clients()
        root = tk.base_url[: -len("/v1")]
        listing = get(root + "/toolkeeper/audit")[1]
        assert "\u202e" not in listing and "\x1b" not in listing
        record_id = listing.split("<tr class=record><td><a href='/toolkeeper/audit/", 1)[1].split("'", 1)[0]
        detail = get(f"{root}/toolkeeper/audit/{record_id}")[1]
        assert "\u202e" not in detail and "\x1b" not in detail
        assert "safe\\u202e.exe" in detail  # shown as an escape, never as the character
    finally:
        process.stop()


def test_without_a_session_a_page_asks_to_sign_in(console, browser):
    context = browser.new_context()
    page = context.new_page()
    for path in ("/toolkeeper/audit", "/toolkeeper/queue", "/toolkeeper/audit/charts", "/toolkeeper/audit/x"):
        response = page.goto(console.root + path)
        assert response.status == 401 and page.locator("input[name=token]").count() == 1
    page.fill("input[name=token]", "wrong")
    with page.expect_navigation() as refused:
        page.click("button[type=submit]")
    assert refused.value.status == 401 and "not valid" in page.locator("p.refused").inner_text()
    context.close()
    status, body = get(console.root + "/toolkeeper/audit", token="wrong")
    assert status == 401 and "a valid token is required" in body


def test_odd_input_gets_a_page_or_a_4xx_never_a_500(console):
    for query in ("before=%C2%B2", "after=99999999999999999999999", "since=0001-01-01", "until=9999-12-31T23:59",
                  "before=-1", "last=forever", "status=nope"):
        status, _ = get(f"{console.root}/toolkeeper/audit?{query}")
        # a cursor that does not parse starts from the newest; a filter that does not parse is said (400)
        assert status == (400 if query.startswith(("since", "last", "status")) else 200), query
    status, _ = get(f"{console.root}/toolkeeper/audit/export?format=xml")
    assert status == 400
    assert get(f"{console.root}/toolkeeper/audit/export?since=0001-01-01")[0] == 400
    for header in ({"Cookie": "toolkeeper_session=\xff\xfe.\xff"}, {"Authorization": "Bearer \xff\xfe"}):
        request = urllib.request.Request(console.root + "/toolkeeper/audit", headers=header)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        refused.value.close()
        assert refused.value.code == 401, header


def test_a_live_queue_stream_opened_with_a_bearer_token_ends_when_the_token_is_revoked(scripted, tmp_path):
    """Every open stream is looked at again, bearer or session: a revoked token stops receiving approvals."""
    import http.client
    import urllib.parse

    write_agent(tmp_path, AGENT)
    tk = serve(scripted, tmp_path)
    try:
        token = add_token(tmp_path, "watcher", "approver")
        where = urllib.parse.urlsplit(tk.base_url)
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        connection.request("GET", "/toolkeeper/queue/live", headers={"Authorization": f"Bearer {token}"})
        stream = connection.getresponse()
        assert stream.status == 200 and stream.readline().startswith(b"event: queue")
        ended = threading.Event()

        def read_to_the_end():
            while stream.readline():
                pass
            ended.set()

        threading.Thread(target=read_to_the_end, daemon=True).start()
        assert not ended.wait(1.5)  # open while its token stands
        subprocess.run([sys.executable, "-m", "toolkeeper", "tokens", "revoke", "watcher", "--store",
                        str(tmp_path / "store.sqlite3")], check=True, capture_output=True, cwd=ROOT)
        assert ended.wait(15), "the stream outlived its revoked token"
        connection.close()
    finally:
        tk.process.stop()
