"""Asks that reach people where they are: a real `toolkeeper serve` sends each ask to the policy's `notify:`
channels, here a webhook receiver and a Slack stand-in served by the test (aiohttp), and a channel's link opens
the call in the console in Chromium.

The receiver checks what a real one would: the Standard Webhooks signature (with the `standardwebhooks` library
and by hand), the same webhook-id on a retry, the Slack message against Block Kit's documented limits and shapes.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import hmac
import json
import re
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web
from conftest import YOLO, Toolkeeper, free_port, start_toolkeeper, write_agent
from test_approvals import TOKEN, Asking

from toolkeeper.store import open_store

HOOK_KEY = b"a signing key of 32 bytes, test!"
HOOK_SECRET = "whsec_" + base64.b64encode(HOOK_KEY).decode()
RAW_SECRET = "a plain signing secret"
SLACK_SECRET_PATH = "/services/T0TEST/B0TEST/s3cr3tSlackPath"
LEAKED = "sk-live-4f9a8b7c6d5e"  # an argument the redactor hides by its name, and wherever its text appears
AWS_KEY = "AKIAZ7Q3TKLM4WXY2H5B"  # one it hides by what it looks like

AGENT = YOLO + """
      - name: release
        description: Publish a release.
        parameters:
          version: {type: string, description: "The version."}
          notes: {type: string, required: false, description: "Release notes."}
        command: ["{python}", "{tools}/record.py", "release", "{{version}}"]
        env: {OUT: "{out}"}
      - name: publish
        description: Publish a page.
        parameters:
          page: {type: string, description: "The page."}
        command: ["{python}", "{tools}/record.py", "publish", "{{page}}"]
        env: {OUT: "{out}"}
      - name: rotate
        description: Rotate a service's credential.
        parameters:
          service: {type: string, description: "The service."}
          api_token: {type: string, description: "The new token."}
          note: {type: string, description: "A note for the change log."}
        command: ["{python}", "{tools}/record.py", "rotate", "{{service}}", "{{api_token}}", "{{note}}"]
        env: {OUT: "{out}"}
"""

POLICY = """
channels:
  pager: {{type: webhook, url: "http://127.0.0.1:{receiver}/hook", secret_env: TK_TEST_HOOK_SECRET}}
  chat: {{type: slack, url_env: TK_TEST_SLACK_URL}}
  dead: {{type: webhook, url: "http://127.0.0.1:{closed}/refused", secret_env: TK_TEST_RAW_SECRET}}
  stuck: {{type: webhook, url: "http://127.0.0.1:{receiver}/hang", secret_env: TK_TEST_RAW_SECRET, timeout: 1}}
  deadchat: {{type: slack, url_env: TK_TEST_DEAD_SLACK_URL}}
  unset: {{type: slack, url_env: TK_TEST_NEVER_SET}}
notify: [pager]
rules:
  - id: releases
    effect: ask
    reason: A release goes to every customer.
    notify: [pager, chat]
    when: {{tool: release}}
  - id: pages
    effect: ask
    reason: Pages are public.
    notify: [dead, stuck, deadchat, unset]
    when: {{tool: publish}}
  - id: credentials
    effect: ask
    reason: Credentials change.
    when: {{tool: rotate}}
"""


class Receiver:
    """The channels' far end, in a thread: records each request; /hook answers 500 to the first message it sees
    and 200 after, /hang never answers, /slack answers as Slack does, /chat is a chat page with a link on it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[dict] = []
        self.ids_seen: set[str] = set()
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        app.router.add_post("/hang", self._hang)
        app.router.add_post(SLACK_SECRET_PATH, self._slack)
        app.router.add_get("/chat", self._chat)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)  # /hang's requests are dropped
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        started.set()
        self.loop.run_forever()

    async def _record(self, request: web.Request) -> dict:
        entry = {"path": request.path, "headers": dict(request.headers), "body": await request.read(),
                 "at": time.time()}
        self.requests.append(entry)
        return entry

    async def _hook(self, request: web.Request) -> web.Response:
        entry = await self._record(request)
        first = entry["headers"].get("webhook-id") not in self.ids_seen
        self.ids_seen.add(entry["headers"].get("webhook-id"))
        return web.Response(status=500, text="not yet") if first else web.Response(text="thanks")

    async def _hang(self, request: web.Request) -> web.Response:
        await self._record(request)
        await asyncio.sleep(3600)
        return web.Response()

    async def _slack(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(text="ok")

    async def _chat(self, request: web.Request) -> web.Response:
        link = request.query["link"]
        body = f"<!doctype html><title>chat</title><p>An approval waits: <a id=open href='{link}'>open it</a></p>"
        return web.Response(text=body, content_type="text/html")

    def about(self, path: str, approval_id: str, count: int = 1, timeout: float = 15) -> list[dict]:
        """The requests to `path` about one call, once `count` have come."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [r for r in list(self.requests) if r["path"] == path and approval_id.encode() in r["body"]]
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{path} received {len(found)} requests about {approval_id}, not {count}")

    async def _stop(self) -> None:
        await self.runner.cleanup()
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]  # /hang's handlers
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def receiver():
    running = Receiver()
    yield running
    running.close()


def serve(scripted, directory: Path, receiver: Receiver, timeout: float, extra: tuple[str, ...] = ()) -> Toolkeeper:
    write_agent(directory, AGENT)
    closed = free_port()  # nothing listens there: connection refused
    (directory / "policy.yaml").write_text(POLICY.format(receiver=receiver.port, closed=closed))
    port = free_port()
    env = {"TOOLKEEPER_ADMIN_TOKEN": TOKEN, "TK_TEST_HOOK_SECRET": HOOK_SECRET, "TK_TEST_RAW_SECRET": RAW_SECRET,
           "TK_TEST_SLACK_URL": f"http://127.0.0.1:{receiver.port}{SLACK_SECRET_PATH}",
           "TK_TEST_DEAD_SLACK_URL": f"http://127.0.0.1:{closed}{SLACK_SECRET_PATH}"}
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--consent", "approvals",
                               "--consent-timeout", str(timeout), "--policy", str(directory / "policy.yaml"),
                               "--store", str(directory / "store.sqlite3"), "--port", str(port),
                               "--public-url", f"http://127.0.0.1:{port}", "--keepalive", "0.2", *extra, env=env)
    tk = Toolkeeper(process, directory)
    tk.root = f"http://127.0.0.1:{port}"
    return tk


@pytest.fixture(scope="module")
def notifying(scripted, receiver, tmp_path_factory):
    tk = serve(scripted, tmp_path_factory.mktemp("notify"), receiver, timeout=60)
    yield tk
    tk.process.stop()


def get(url: str, token: str | None = TOKEN, accept: str = "text/html") -> tuple[int, str]:
    headers = {"Accept": accept, **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode()


def deny(tk: Toolkeeper, approval: str) -> None:
    request = urllib.request.Request(f"{tk.root}/toolkeeper/approvals/{approval}/deny", data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def waiting_for(tk: Toolkeeper, tool: str, timeout: float = 15) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [a for a in json.loads(get(tk.root + "/toolkeeper/approvals", accept="application/json")[1])
                 ["approvals"] if a["tool"] == tool]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {tool} call came to wait")


def metric(tk: Toolkeeper, channel: str, outcome: str) -> float:
    page = urllib.request.urlopen(tk.root + "/metrics", timeout=10).read().decode()
    line = f'toolkeeper_notify_deliveries_total{{channel="{channel}",outcome="{outcome}"}} '
    return float(next(row for row in page.splitlines() if row.startswith(line)).split()[-1])


def verify_by_hand(key: bytes, entry: dict) -> bool:
    headers = entry["headers"]
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + entry["body"]
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, given) for given in headers["webhook-signature"].split(" "))


def test_a_webhook_is_signed_and_tried_again_after_a_500_with_the_same_id(scripted, notifying, receiver):
    from standardwebhooks.webhooks import Webhook

    asking = Asking(notifying, scripted, "release", {"version": "2.0.0", "notes": "big one"}, word="n1")
    approval = waiting_for(notifying, "release")
    first, retry = receiver.about("/hook", approval["id"], 2)
    assert retry["headers"]["webhook-id"] == first["headers"]["webhook-id"]  # one message, tried twice
    assert retry["body"] == first["body"]
    assert int(retry["headers"]["webhook-timestamp"]) >= int(first["headers"]["webhook-timestamp"])
    assert retry["at"] - first["at"] >= 0.9  # backoff, not a hammering
    for entry in (first, retry):
        assert Webhook(HOOK_SECRET).verify(entry["body"], entry["headers"])["type"] == "approval.requested"
        assert verify_by_hand(HOOK_KEY, entry)
        assert entry["headers"]["Content-Type"] == "application/json"
    tampered = {**retry, "body": retry["body"].replace(b"2.0.0", b"2.0.1")}
    assert not verify_by_hand(HOOK_KEY, tampered)
    event = json.loads(retry["body"])
    data = event["data"]
    assert event["timestamp"].endswith("Z")
    assert data["id"] == approval["id"] and data["tool"] == "release" and data["rule"] == "releases"
    assert data["arguments"] == {"version": "2.0.0", "notes": "big one"}
    assert data["reason"] == "A release goes to every customer." and data["source"] == "rules"
    assert data["url"] == f"{notifying.root}/toolkeeper/queue/{approval['id']}"
    assert data["expires"] - data["created"] == pytest.approx(60, abs=1)

    status, page = get(data["url"])
    assert status == 200 and "pager: delivered (attempt 2)" in page and "chat: delivered (attempt 1)" in page
    assert metric(notifying, "pager", "error") >= 1 and metric(notifying, "pager", "delivered") >= 1
    deny(notifying, approval["id"])
    assert "not allowed" in asking.result()


def block_kit_problems(message: dict) -> list[str]:
    """What Slack would refuse (or show wrongly) in an incoming webhook's message: its documented limits (header
    text 150, section text 3000, a field 2000 and 10 fields, 50 blocks, a button's text 75 and URL 3000), the
    shapes of the blocks used here, and mrkdwn's own rules (&, <, > escaped; a code block closed by us)."""
    problems = []

    def text_object(where: str, obj: dict, most: int, kinds=("plain_text", "mrkdwn")) -> None:
        if not isinstance(obj, dict) or obj.get("type") not in kinds or not isinstance(obj.get("text"), str):
            problems.append(f"{where}: not a text object of {kinds}: {obj!r}")
            return
        text = obj["text"]
        if not 1 <= len(text) <= most:
            problems.append(f"{where}: {len(text)} characters, not 1..{most}")
        if any(ord(c) < 32 and c != "\n" for c in text):
            problems.append(f"{where}: a control character")
        if obj["type"] == "mrkdwn":
            bare = text.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "")
            if "&" in bare:
                problems.append(f"{where}: an unescaped &")
            for opening in [i for i, c in enumerate(text) if c == "<"]:
                if not text.startswith("<!date^", opening):
                    problems.append(f"{where}: a < that is not toolkeeper's own date: {text[opening:opening + 20]!r}")
            if text.count("```") % 2:
                problems.append(f"{where}: a code block opened or closed by a value")

    if not isinstance(message.get("text"), str) or not message["text"]:
        problems.append("no fallback text")
    blocks = message.get("blocks")
    if not isinstance(blocks, list) or not 1 <= len(blocks) <= 50:
        return [*problems, "blocks: not a list of 1..50"]
    allowed = {"header": {"type", "text", "block_id"}, "section": {"type", "text", "fields", "block_id"},
               "context": {"type", "elements", "block_id"}, "actions": {"type", "elements", "block_id"}}
    for at, block in enumerate(blocks):
        kind = block.get("type")
        if kind not in allowed or set(block) - allowed[kind]:
            problems.append(f"block {at}: {kind} with {sorted(block)}")
            continue
        if kind == "header":
            text_object(f"header {at}", block["text"], 150, ("plain_text",))
        elif kind == "section":
            if "text" not in block and "fields" not in block:
                problems.append(f"section {at}: neither text nor fields")
            if "text" in block:
                text_object(f"section {at}", block["text"], 3000)
            fields = block.get("fields", [])
            if len(fields) > 10:
                problems.append(f"section {at}: {len(fields)} fields")
            for number, item in enumerate(fields):
                text_object(f"section {at} field {number}", item, 2000)
        elif kind == "context":
            if not 1 <= len(block["elements"]) <= 10:
                problems.append(f"context {at}: {len(block['elements'])} elements")
            for element in block["elements"]:
                text_object(f"context {at}", element, 3000)
        else:
            if not 1 <= len(block["elements"]) <= 25:
                problems.append(f"actions {at}: {len(block['elements'])} elements")
            for button in block["elements"]:
                if button.get("type") != "button" or set(button) - {"type", "text", "action_id", "url", "style",
                                                                      "value"}:
                    problems.append(f"actions {at}: {button!r}")
                    continue
                text_object(f"button {at}", button["text"], 75, ("plain_text",))
                if not 1 <= len(button.get("url", "")) <= 3000 or len(button.get("action_id", "")) > 255:
                    problems.append(f"button {at}: url or action_id out of bounds")
                if button.get("style", "primary") not in ("primary", "danger"):
                    problems.append(f"button {at}: style {button['style']!r}")
    return problems


def test_the_slack_message_keeps_to_block_kit_and_no_value_escapes_its_place(scripted, notifying, receiver):
    nasty = "1.0```\n<!channel> & <https://evil.example|click> \x1b[31mred\u202e"
    long_notes = "word " * 2000  # past what a section holds
    asking = Asking(notifying, scripted, "release", {"version": nasty, "notes": long_notes}, word="n2")
    approval = waiting_for(notifying, "release")
    message = json.loads(receiver.about(SLACK_SECRET_PATH, approval["id"])[0]["body"])
    assert block_kit_problems(message) == []
    everything = json.dumps(message)
    assert "<!channel>" not in everything and "&lt;!channel&gt; &amp; &lt;https://evil.example|click&gt;" in everything
    arguments = message["blocks"][2]["text"]["text"]
    assert "\x1b" not in arguments and "\\u001b[31m" in arguments  # JSON's escape, as the console shows it
    assert "\\u202e" in everything and "\u202e" not in everything
    assert arguments.startswith("*Arguments*\n```\n") and arguments.endswith("… (cut)\n```")
    assert arguments.count("```") == 2  # the value's own backticks cannot close the block
    assert message["blocks"][0] == {"type": "header", "text": {"type": "plain_text", "text": "Approve release?",
                                                               "emoji": False}}
    fields = [field["text"] for field in message["blocks"][1]["fields"]]
    assert fields == ["*Tool*\nrelease", f"*Agent*\n{approval['agent']}", "*For whom*\nthe agent alone",
                      "*Rule*\nreleases"]
    button = message["blocks"][-1]["elements"][0]
    assert button["url"] == f"{notifying.root}/toolkeeper/queue/{approval['id']}"
    assert approval["id"] in message["text"]
    deny(notifying, approval["id"])
    asking.result()


def test_what_the_redactor_hides_never_reaches_a_channel(scripted, notifying, receiver):
    asking = Asking(notifying, scripted, "rotate", {"service": "billing", "api_token": LEAKED,
                                                    "note": f"was {LEAKED}, key {AWS_KEY}"}, word="n3")
    approval = waiting_for(notifying, "rotate")  # no notify: on its rule: the policy's default, the pager
    mine = receiver.about("/hook", approval["id"], 2)  # answered 500, then taken
    assert not [r for r in receiver.requests if r["path"] != "/hook" and approval["id"].encode() in r["body"]]
    for entry in mine:
        assert LEAKED.encode() not in entry["body"] and AWS_KEY.encode() not in entry["body"]
    arguments = json.loads(mine[-1]["body"])["data"]["arguments"]
    assert arguments["api_token"] == "[redacted]" and arguments["service"] == "billing"
    assert "[redacted]" in arguments["note"] and "[REDACTED: aws_access_key]" in arguments["note"]
    deny(notifying, approval["id"])
    asking.result()


def test_a_failing_channel_is_shown_on_the_queue_and_counted(scripted, notifying, receiver):
    asking = Asking(notifying, scripted, "publish", {"page": "pricing"}, word="n4")
    approval = waiting_for(notifying, "publish")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        status, page = get(notifying.root + "/toolkeeper/queue")
        if "dead: not delivered yet" in page and "stuck: not delivered yet" in page:
            break
        time.sleep(0.2)
    rows = {item.split(": ", 1)[0]: item.split(": ", 1)[1] for item in re.findall(r"<li class='delivery failed'"
                                                                                  r"[^>]*>([^<]*)</li>", page)}
    assert re.fullmatch(r"not delivered yet, attempt \d failed: cannot connect: Connection refused; trying again",
                        rows["dead"]), rows
    assert re.fullmatch(r"not delivered yet, attempt \d failed: no answer within 1 s; trying again", rows["stuck"])
    assert rows["deadchat"].startswith("not delivered yet") and "s3cr3tSlackPath" not in page
    assert "data-failing='dead'" in page and "dead is not being reached" in page
    assert metric(notifying, "dead", "error") >= 1 and metric(notifying, "stuck", "error") >= 1
    assert metric(notifying, "dead", "delivered") == 0
    deny(notifying, approval["id"])
    asking.result()
    status, page = get(f"{notifying.root}/toolkeeper/queue/{approval['id']}")
    assert status == 200 and "no longer waits: denied by admin" in page and "<form" not in page.split("<main>")[1]


def test_an_ask_whose_channels_are_dead_is_denied_on_time(scripted, receiver, tmp_path):
    """Connection refused (dead, deadchat) and a channel that never answers (stuck): the call waits its timeout,
    no more, and is denied; nothing of a channel's URL or secret is in the log or the store."""
    tk = serve(scripted, tmp_path, receiver, timeout=2)
    try:
        scripted.add({"when": "n5", "tool_calls": [{"name": "publish", "arguments": {"page": "home"}}]},
                     {"when": "n5", "content": "{tool_result}"})
        started = time.monotonic()
        answer = tk.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "n5"}])
        took = time.monotonic() - started
        assert "no one answered within 2 s" in answer.choices[0].message.content
        assert 2 <= took < 5, took  # the ask's 2 s and two model rounds, with the channels still trying
        assert tk.calls() == []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and metric(tk, "stuck", "given_up") < 1:
            time.sleep(0.2)
        for channel in ("dead", "stuck", "deadchat", "unset"):
            assert metric(tk, channel, "given_up") == 1, channel
        assert metric(tk, "unset", "error") == 0  # never tried: it cannot be
        _, page = get(tk.root + "/toolkeeper/queue")
        assert "deadchat is not being reached" in page and "given up: it expired" in page
    finally:
        log = tk.process.stop()
    store = sqlite3.connect(tmp_path / "store.sqlite3")
    ((body, status, settled),) = store.execute("SELECT body, status, updated FROM approvals").fetchall()
    assert status == "expired" and 2 <= settled - json.loads(body)["created"] < 2.4  # on time, to the tenth
    rows = store.execute("SELECT channel, status, error FROM notify_deliveries ORDER BY channel").fetchall()
    store.close()
    assert [(channel, status) for channel, status, _ in rows] == [("dead", "failed"), ("deadchat", "failed"),
                                                                  ("stuck", "failed"), ("unset", "failed")]
    assert rows[-1][2] == "the channel cannot be used: the variable TK_TEST_NEVER_SET that holds its URL is unset, or holds no http(s) URL"
    assert "approval" in log and "was never sent to deadchat" in log
    for kept in (log, json.dumps(rows)):
        assert "s3cr3tSlackPath" not in kept and RAW_SECRET not in kept and HOOK_SECRET not in kept


def test_the_link_lands_on_the_call_after_sign_in_and_opening_it_approves_nothing(scripted, notifying, receiver,
                                                                                  browser):
    from test_console import add_token

    ada = add_token(notifying.directory, "ada-notify", "approver")
    asking = Asking(notifying, scripted, "release", {"version": "9.9.9"}, word="n6")
    approval = waiting_for(notifying, "release")
    link = json.loads(receiver.about("/hook", approval["id"])[0]["body"])["data"]["url"]
    # the chat page is another site (localhost, not 127.0.0.1): a link from it is a cross-site navigation
    chat = f"http://localhost:{receiver.port}/chat?" + urllib.parse.urlencode({"link": link})
    context = browser.new_context()
    page = context.new_page()
    arrivals = []
    page.on("request", lambda request: arrivals.append(request) if request.url == link else None)
    page.goto(chat)
    page.click("#open")
    page.wait_for_selector("input[name=token]")  # not signed in: the sign-in form, on the call's own address
    assert page.url == link
    page.fill("input[name=token]", ada)
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert page.url == link
    assert approval["id"] in page.locator("section.approval").inner_text()
    assert "9.9.9" in page.locator("#arguments").inner_text()
    assert waiting_for(notifying, "release")["id"] == approval["id"]  # opened, read, not answered

    arrivals.clear()  # signed in now: a link from the chat opens the call, with no sign-in on the way
    page.goto(chat)
    page.click("#open")
    page.wait_for_selector("section.approval button[value=approve]")
    assert page.url == link and page.locator("input[name=token]").count() == 0
    # the browser held the cookie back from the chat's link, and sent it when the page opened itself again
    assert [request.all_headers().get("sec-fetch-site") for request in arrivals] == ["cross-site", "same-origin"]
    assert waiting_for(notifying, "release")["id"] == approval["id"]
    with page.expect_navigation():
        page.click("section.approval button[value=approve]")
    assert "approved by ada-notify" in page.locator("p.notice").inner_text()
    assert "ran" in asking.result()
    context.close()


def test_the_link_signs_a_person_in_through_the_provider_and_lands_on_the_call(scripted, receiver, oidc_provider,
                                                                               browser, tmp_path):
    from idp import CONSOLE
    from test_oidc_console import config, provider_login

    tk = serve(scripted, tmp_path, receiver, timeout=60, extra=(
        "--config", str(config(tmp_path, oidc_provider.issuer))))
    oidc_provider.set_redirects(CONSOLE, [tk.root + "/toolkeeper/oidc/callback",
                                          tk.root + "/toolkeeper/oidc/signed-out"])
    try:
        asking = Asking(tk, scripted, "release", {"version": "5.5.5"}, word="n7")
        approval = waiting_for(tk, "release")
        link = json.loads(receiver.about("/hook", approval["id"])[0]["body"])["data"]["url"]
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"http://localhost:{receiver.port}/chat?" + urllib.parse.urlencode({"link": link}))
        page.click("#open")
        page.click("#oidc")  # the sign-in form's way in through the provider
        provider_login(page, "ada")
        page.wait_for_url(link, timeout=15_000)  # the provider's callback, then the call
        page.wait_for_selector("section.approval")
        assert page.url == link and "5.5.5" in page.locator("#arguments").inner_text()
        assert page.locator("#who-email").inner_text() == "ada@example.com"
        assert waiting_for(tk, "release")["id"] == approval["id"]  # signed in and landed: nothing answered
        context.close()
        deny(tk, approval["id"])
        asking.result()
    finally:
        tk.process.stop()


def test_deliveries_are_kept_by_call_and_channel_and_read_by_every_replica(location):
    """The store's part, on SQLite and PostgreSQL: one row per call and channel, written by the replica that sends
    and read by any other; a channel is failing while its latest delivery failed."""
    async def scenario():
        sender, reader = open_store(location), open_store(location)  # two replicas' stores
        try:
            since = time.time() - 1
            await sender.note_delivery("ap_A", "pager", "sending", 1, "cannot connect: Connection refused")
            await sender.note_delivery("ap_A", "chat", "delivered", 1)
            assert [d["channel"] for d in (await reader.failing_channels(since))] == ["pager"]
            await asyncio.sleep(0.01)
            await sender.note_delivery("ap_A", "pager", "delivered", 2)  # the same row, moved on
            assert await reader.failing_channels(since) == []
            await asyncio.sleep(0.01)
            await sender.note_delivery("ap_B", "pager", "failed", 3, "no answer within 5 s; given up: it expired")
            found = await reader.deliveries(["ap_A", "ap_B", "ap_C"])
            assert {key: [(d["channel"], d["status"], d["attempts"], d["error"]) for d in rows]
                    for key, rows in found.items()} == {
                "ap_A": [("chat", "delivered", 1, None), ("pager", "delivered", 2, None)],
                "ap_B": [("pager", "failed", 3, "no answer within 5 s; given up: it expired")]}
            (failing,) = await reader.failing_channels(since)
            assert failing["channel"] == "pager" and failing["approval_id"] == "ap_B"
            assert await reader.failing_channels(time.time() + 1) == []  # nothing that recent
        finally:
            await sender.close()
            await reader.close()

    with concurrent.futures.ThreadPoolExecutor(1) as apart:  # the browser's loop runs in this thread (Playwright)
        apart.submit(asyncio.run, scenario()).result(60)
