"""People sign in to the console through a real OpenID provider (oidc-provider, tests/idp/), in Chromium.

The login form is filled as a person fills it; toolkeeper is a real `serve` with `auth.oidc` in its config file
and no admin token. Users: ada (platform, approvers), grace (auditors), linus (approvers), bob (visitors).
The mapping: approvers give the approver role, auditors and platform the auditor role (so ada holds two).
A call is asked for on behalf of a user through the identity header serve believes from loopback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import Toolkeeper, call, free_port, run_cli, start_toolkeeper, write_agent
from idp import CONSOLE, CONSOLE_SECRET
from test_approvals import AGENT

from toolkeeper.identity import (
    Grant,
    Issuer,
    IssuerUnavailable,
    NoRole,
    OidcClient,
    Person,
    SignIn,
    SignInRefused,
    TokenRefused,
)
from toolkeeper.policy import four_eyes_refusal, same_person
from toolkeeper.store import open_store
from toolkeeper.wire.admin.people import PersonSessions

ADMIN_TOKEN = "oidc-admin-token-5b1e9d2c7a"
USER_HEADER = "X-User"
SIGNED_IN = re.compile(r".*/toolkeeper/(queue|audit)(\?.*)?$")


def config(directory: Path, issuer: str, *, refresh: float = 300, tokens: str = "people") -> Path:
    secret = directory / "client-secret"
    secret.write_text(CONSOLE_SECRET + "\n")
    path = directory / "toolkeeper.yaml"
    path.write_text(f"""
auth:
  tokens: {tokens}
  oidc:
    issuer: {issuer}
    client_id: {CONSOLE}
    client_secret_file: {secret}
    scopes: [openid, profile, email, groups]
    groups_claim: groups
    refresh: {refresh}
    roles:
      approvers: approver
      auditors: auditor
      platform: auditor
""")
    return path


class Console:
    """A toolkeeper serving the console, people signing in through `provider`."""

    def __init__(self, scripted, directory: Path, provider, *, refresh: float = 300, tokens: str = "people",
                 issuer: str | None = None, env: dict | None = None):
        directory.mkdir(parents=True, exist_ok=True)
        write_agent(directory, AGENT)
        port = free_port()
        self.root = f"http://127.0.0.1:{port}"
        self.provider = provider
        process = start_toolkeeper(
            directory / "agent.yaml", scripted.base_url, "--port", str(port), "--consent", "approvals",
            "--store", str(directory / "store.sqlite3"), "--keepalive", "0.2", "--consent-timeout", "60",
            "--identity-header", USER_HEADER,
            "--config", str(config(directory, issuer or provider.issuer, refresh=refresh, tokens=tokens)), env=env)
        self.tk = Toolkeeper(process, directory)
        self.audit = directory / "audit.sqlite3"
        self.allow_redirects()

    def allow_redirects(self) -> None:
        """The provider's client lists this console's callback (and so its signed-out page, on the same origin)."""
        if self.provider is not None:
            self.provider.set_redirects(CONSOLE, [self.root + "/toolkeeper/oidc/callback",
                                                  self.root + "/toolkeeper/oidc/signed-out"])

    def stop(self) -> None:
        self.tk.process.stop()


class Asking:
    """A conversation whose call waits for approval, on behalf of `user` when given, run in a thread."""

    def __init__(self, console: Console, scripted, tool: str, arguments: dict, word: str, user: str | None = None):
        scripted.add({"when": word, "tool_calls": [call(tool, arguments)]}, {"when": word, "content": "{tool_result}"})
        headers = {USER_HEADER: user} if user else {}
        client = console.tk.client(default_headers=headers, timeout=90)
        self.answer: str | None = None
        self.error: Exception | None = None

        def run() -> None:
            try:
                response = client.chat.completions.create(model="m", messages=[{"role": "user", "content": word}])
                self.answer = response.choices[0].message.content
            except Exception as exc:  # the server went away (a test that failed): kept for a look
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self) -> str | None:
        self.thread.join(60)
        assert not self.thread.is_alive(), "the call never finished"
        return self.answer


def api(url: str, token: str | None = None, body: dict | None = None, cookie: str | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if cookie:
        headers["Cookie"] = f"toolkeeper_session={cookie}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode()


@pytest.fixture(scope="module")
def console(scripted, oidc_provider, tmp_path_factory):
    running = Console(scripted, tmp_path_factory.mktemp("oidc-console"), oidc_provider)
    yield running
    running.stop()


@pytest.fixture
def people(console):
    console.allow_redirects()  # another test of the session may have set the provider's client otherwise
    return console


def provider_login(page, user: str, password: str | None = None) -> None:
    """The provider's login form, filled in as a person would."""
    page.wait_for_selector("input[name=login]")
    page.fill("input[name=login]", user)
    page.fill("input[name=password]", password or f"{user}-password")
    page.click("#submit")


def sign_in(browser, console: Console, user: str, *, arrive: bool = True):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.goto(console.root + "/toolkeeper/sign-in")
    page.click("#oidc")
    provider_login(page, user)
    if arrive:
        page.wait_for_url(SIGNED_IN, timeout=15_000)
    else:
        page.wait_for_url(re.compile(r".*/toolkeeper/oidc/callback.*"), timeout=15_000)
        page.wait_for_load_state()
    return context, page


def session_cookie(context) -> str:
    return next(c["value"] for c in context.cookies() if c["name"] == "toolkeeper_session")


def csrf(page) -> str:
    return page.locator("input[name=csrf]").first.get_attribute("value")


def waiting(console: Console, cookie: str, version: str, timeout: float = 15) -> dict:
    """The waiting approval of the release of `version`, as the approvals API lists it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = api(console.root + "/toolkeeper/approvals", cookie=cookie)
        assert status == 200, body
        found = [a for a in json.loads(body)["approvals"] if a["arguments"].get("version") == version]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no release of {version} came to wait for approval")


def record_page(page, console: Console, approver: str):
    """The console's page of the one call `approver` answered."""
    page.goto(console.root + "/toolkeeper/audit?" + urllib.parse.urlencode({"approver": approver}))
    rows = page.locator("tr.record a")
    assert rows.count() == 1, page.content()
    with page.expect_navigation():
        rows.first.click()


# -- signing in, roles, and the record of who approved ------------------------------------------------------------

def test_ada_signs_in_and_approves_a_call_recorded_with_her_name_and_groups(scripted, people, browser):
    context, page = sign_in(browser, people, "ada")
    assert page.url.endswith("/toolkeeper/queue")  # approver and auditor: the queue is home
    assert page.locator("#who-name").inner_text() == "Ada Lovelace"
    assert page.locator("#who-email").inner_text() == "ada@example.com"
    assert page.locator("#who-roles").inner_text() == "(approver and auditor)"
    assert page.locator("header a", has_text="Trail").count() == 1  # what either role allows
    page.wait_for_selector("body[data-live=on]")
    asking = Asking(people, scripted, "release", {"version": "7.0.0"}, word="oidc-1")
    row = page.wait_for_selector("[data-approval]", timeout=15_000)
    assert "7.0.0" in row.inner_text()
    with page.expect_navigation():
        row.query_selector("button[value=approve]").click()
    assert "approved by ada@example.com" in page.locator("p.notice").inner_text()
    assert "ran" in asking.result()
    record_page(page, people, "ada@example.com")
    who = page.locator("dd[id='approver identity']").inner_text()
    assert "Ada Lovelace <ada@example.com>" in who and "groups platform, approvers" in who
    assert f"subject ada at {people.provider.issuer}" in who
    context.close()


def test_a_person_with_no_mapped_group_is_told_which_groups_would_do(people, browser):
    context, page = sign_in(browser, people, "bob", arrive=False)
    assert page.title().startswith("No role in toolkeeper")
    assert page.locator("#groups").inner_text() == "visitors"
    wanted = page.locator("#wanted").inner_text()
    assert "approver: approvers" in wanted and "auditor: auditors, platform" in wanted
    assert not [c for c in context.cookies() if c["name"] == "toolkeeper_session"]
    assert page.goto(people.root + "/toolkeeper/queue").status == 401
    context.close()


def test_an_auditor_reads_the_trail_and_cannot_approve(scripted, people, browser):
    context, page = sign_in(browser, people, "grace")
    assert page.url.endswith("/toolkeeper/audit")
    assert page.locator("header a", has_text="Approvals").count() == 0
    assert page.goto(people.root + "/toolkeeper/queue").status == 403
    assert api(people.root + "/toolkeeper/approvals", cookie=session_cookie(context))[0] == 403
    asking = Asking(people, scripted, "release", {"version": "7.1.0"}, word="oidc-2")
    linus, linus_page = sign_in(browser, people, "linus")
    approval = waiting(people, session_cookie(linus), "7.1.0")
    page.goto(people.root + "/toolkeeper/audit")  # a page of grace's, with her session's CSRF key
    answer = page.request.post(f"{people.root}/toolkeeper/approvals/{approval['id']}/approve", data="{}",
                               headers={"X-CSRF-Token": csrf(page), "Content-Type": "application/json"})
    assert answer.status == 403 and "needs the admin or approver role" in answer.text()
    status, _ = api(f"{people.root}/toolkeeper/approvals/{approval['id']}/deny", body={},
                    cookie=session_cookie(linus))
    assert status == 403  # a cookie alone is no answer: the session's CSRF key must come with it
    denied = linus_page.request.post(f"{people.root}/toolkeeper/approvals/{approval['id']}/deny", data="{}",
                                     headers={"X-CSRF-Token": csrf(linus_page), "Content-Type": "application/json"})
    assert denied.status == 200 and json.loads(denied.text())["approver"] == "linus@example.com"
    assert "ran" not in (asking.result() or "")
    context.close()
    linus.close()


def test_four_eyes_a_call_for_ada_is_never_approved_by_ada(scripted, people, browser):
    context, page = sign_in(browser, people, "ada")
    page.wait_for_selector("body[data-live=on]")
    asking = Asking(people, scripted, "release", {"version": "8.0.0"}, word="oidc-3", user="ada")
    row = page.wait_for_selector("[data-approval]:has-text('8.0.0')", timeout=15_000)
    assert "for user" in row.inner_text() and "ada" in row.inner_text()
    assert row.query_selector("button[value=approve]").is_disabled()
    assert row.query_selector("button[value=always]").is_disabled()
    assert not row.query_selector("button[value=deny]").is_disabled()
    assert "four eyes" in row.query_selector("p.own").inner_text()
    approval = waiting(people, session_cookie(context), "8.0.0")
    assert approval["principal_user"] == "ada"
    answer = page.request.post(f"{people.root}/toolkeeper/approvals/{approval['id']}/approve", data="{}",
                               headers={"X-CSRF-Token": csrf(page), "Content-Type": "application/json"})
    assert answer.status == 403 and "four eyes" in answer.text()
    # the form, posted all the same: refused, and said so
    forced = page.request.post(f"{people.root}/toolkeeper/queue/{approval['id']}/always",
                               form={"csrf": csrf(page)})
    assert forced.status == 200 and "another approver must approve it (four eyes)" in forced.text()
    assert waiting(people, session_cookie(context), "8.0.0")["status"] == "waiting"

    linus, linus_page = sign_in(browser, people, "linus")
    row = linus_page.wait_for_selector("[data-approval]:has-text('8.0.0')", timeout=15_000)
    assert not row.query_selector("button[value=approve]").is_disabled()
    with linus_page.expect_navigation():
        row.query_selector("button[value=approve]").click()
    assert "approved by linus@example.com" in linus_page.locator("p.notice").inner_text()
    assert "ran" in asking.result()

    asking = Asking(people, scripted, "release", {"version": "8.0.1"}, word="oidc-4", user="ADA@example.com")
    # ada's own, by her email in other letters
    row = page.wait_for_selector("[data-approval]:has-text('8.0.1')", timeout=15_000)
    assert row.query_selector("button[value=approve]").is_disabled()
    with page.expect_navigation():
        row.query_selector("button[value=deny]").click()  # taking away is hers to do
    assert "denied by ada@example.com" in page.locator("p.notice").inner_text()
    assert "ran" not in (asking.result() or "")
    context.close()
    linus.close()


# -- signing out, and the session's life ---------------------------------------------------------------------------

def test_sign_out_ends_the_session_everywhere_and_at_the_provider(people, browser):
    context, page = sign_in(browser, people, "ada")
    cookie = session_cookie(context)
    assert api(people.root + "/toolkeeper/approvals", cookie=cookie)[0] == 200
    page.click("#sign-out")
    page.wait_for_url(re.compile(r".*/toolkeeper/oidc/signed-out$"), timeout=15_000)  # by way of the provider
    assert "You are signed out" in page.content()
    assert api(people.root + "/toolkeeper/approvals", cookie=cookie)[0] == 401  # the old cookie opens nothing
    other = browser.new_context()
    other.add_cookies([{"name": "toolkeeper_session", "value": cookie, "url": people.root + "/toolkeeper/"}])
    assert other.new_page().goto(people.root + "/toolkeeper/queue").status == 401
    # signed out at the provider too: signing in again asks for the password
    page.click("#oidc")
    provider_login(page, "ada")
    page.wait_for_url(SIGNED_IN, timeout=15_000)
    other.close()
    context.close()


def test_a_group_removed_at_the_provider_takes_the_role_within_the_refresh_window(scripted, fresh_oidc_provider,
                                                                                  browser, tmp_path):
    console = Console(scripted, tmp_path, fresh_oidc_provider, refresh=1)
    try:
        context, page = sign_in(browser, console, "ada")
        assert page.goto(console.root + "/toolkeeper/queue").status == 200
        fresh_oidc_provider.set_groups("ada", ["platform"])
        time.sleep(1.5)
        assert page.goto(console.root + "/toolkeeper/queue").status == 403  # auditor only, read again
        page.goto(console.root + "/toolkeeper/audit")
        assert page.locator("#who-roles").inner_text() == "(auditor)"
        fresh_oidc_provider.set_groups("ada", ["visitors"])
        time.sleep(1.5)
        assert page.goto(console.root + "/toolkeeper/audit").status == 401  # no role left: signed out
        context.close()
    finally:
        console.stop()


def test_signing_keys_rotated_at_the_provider_still_sign_people_in(scripted, fresh_oidc_provider, browser,
                                                                   tmp_path):
    console = Console(scripted, tmp_path, fresh_oidc_provider)
    try:
        context, _ = sign_in(browser, console, "ada")  # the provider's keys are cached now
        context.close()
        fresh_oidc_provider.rotate_keys(drop_old=True)
        time.sleep(10.5)  # an unknown key id refetches the keys at most every 10 s (identity/issuer.py)
        context, page = sign_in(browser, console, "linus")  # signed with a key id the cache does not hold
        assert page.locator("#who-name").inner_text() == "Linus Torvalds"
        context.close()
    finally:
        console.stop()


# -- refused sign-ins ------------------------------------------------------------------------------------------------

def test_a_state_mismatch_a_replayed_callback_and_a_replayed_code_are_refused(people, browser):
    context = browser.new_context()
    page = context.new_page()
    callbacks: list[str] = []
    page.on("request", lambda r: callbacks.append(r.url) if r.url.startswith(people.root + "/toolkeeper/oidc/callback")
            else None)
    page.goto(people.root + "/toolkeeper/sign-in")
    page.click("#oidc")
    provider_login(page, "ada")
    page.wait_for_url(SIGNED_IN, timeout=15_000)
    callback = callbacks[0]
    code = urllib.parse.parse_qs(urllib.parse.urlsplit(callback).query)["code"][0]

    replayed = page.goto(callback)  # the same callback again: its state is spent
    assert replayed.status == 400 and "already used" in page.locator("p.refused").inner_text()

    made_up = page.goto(f"{people.root}/toolkeeper/oidc/callback?code={code}&state=not-one-toolkeeper-sent")
    assert made_up.status == 400 and "unknown to toolkeeper" in page.locator("p.refused").inner_text()

    # a state toolkeeper did send, in this browser, with a code already redeemed: the provider refuses it
    def begin() -> str:
        """A sign-in begun in this browser, stopped before the provider: its state."""
        answer = page.request.get(people.root + "/toolkeeper/oidc/login", max_redirects=0)
        assert answer.status == 303 and answer.headers["location"].startswith(people.provider.issuer + "/auth?")
        return urllib.parse.parse_qs(urllib.parse.urlsplit(answer.headers["location"]).query)["state"][0]

    old_code = page.goto(f"{people.root}/toolkeeper/oidc/callback?code={code}&state={begin()}")
    assert old_code.status == 400 and "invalid_grant" in page.locator("p.refused").inner_text()

    # a state begun in this browser, brought back in another: refused
    state = begin()
    elsewhere = browser.new_context().new_page()
    other = elsewhere.goto(f"{people.root}/toolkeeper/oidc/callback?code=x&state={state}")
    assert other.status == 400 and "another browser" in elsewhere.locator("p.refused").inner_text()
    elsewhere.context.close()
    context.close()


def test_an_identity_provider_that_is_down_is_said_so(scripted, fresh_oidc_provider, browser, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    down = Console(scripted, tmp_path / "down", None, issuer=dead)
    try:
        page = browser.new_page()
        page.goto(down.root + "/toolkeeper/sign-in")
        with page.expect_navigation() as answer:
            page.click("#oidc")
        assert answer.value.status == 503
        assert page.title().startswith("The identity provider is unavailable")
        assert "did not answer" in page.locator("p.refused").inner_text()
        page.close()
    finally:
        down.stop()
    # and a session that must be checked again while the provider is away: said so, never served unchecked
    console = Console(scripted, tmp_path, fresh_oidc_provider, refresh=1)
    try:
        context, page = sign_in(browser, console, "ada")
        fresh_oidc_provider.stop()
        time.sleep(1.5)
        answer = page.goto(console.root + "/toolkeeper/queue")
        assert answer.status == 503 and "The identity provider is unavailable" in page.content()
        assert api(console.root + "/toolkeeper/approvals", cookie=session_cookie(context))[0] == 503
        context.close()
    finally:
        console.stop()


# -- tokens: for people, or for automation only ----------------------------------------------------------------------

def test_automation_only_refuses_the_token_form_and_keeps_bearer_tokens(scripted, oidc_provider, browser, tmp_path):
    console = Console(scripted, tmp_path, oidc_provider, tokens="automation-only",
                      env={"TOOLKEEPER_ADMIN_TOKEN": ADMIN_TOKEN})
    try:
        page = browser.new_page()
        page.goto(console.root + "/toolkeeper/sign-in")
        assert page.locator("input[name=token]").count() == 0 and page.locator("#oidc").count() == 1
        refused = page.request.post(console.root + "/toolkeeper/sign-in", form={"token": ADMIN_TOKEN},
                                    headers={"Origin": console.root})
        assert refused.status == 403 and "automation-only" in refused.text()
        assert not [c for c in page.context.cookies() if c["name"] == "toolkeeper_session"]
        page.close()
        listing = run_cli("approvals", "--url", console.root, env={"TOOLKEEPER_ADMIN_TOKEN": ADMIN_TOKEN})
        assert listing.returncode == 0 and "nothing waits for approval" in listing.stdout, listing.stderr
        added = run_cli("tokens", "add", "ci", "--role", "auditor", "--store", str(tmp_path / "store.sqlite3"))
        token = added.stdout.split(": ", 1)[1].strip()
        assert api(console.root + "/toolkeeper/audit/export?format=jsonl", token=token)[0] == 200
    finally:
        console.stop()


def test_the_admin_api_is_on_for_people_without_an_admin_token(people):
    status, body = api(people.root + "/toolkeeper/approvals")
    assert status == 401 and "valid token" in body  # on, and closed: not the 404 of an API that is off
    added = run_cli("tokens", "add", "robot", "--role", "approver", "--store",
                    str(people.tk.directory / "store.sqlite3"))
    token = added.stdout.split(": ", 1)[1].strip()
    assert api(people.root + "/toolkeeper/approvals", token=token)[0] == 200


# -- four eyes, as the approvals decide it ---------------------------------------------------------------------------

def test_same_person_compares_subject_issuer_email_and_username():
    ada = Person(subject="00u1ada", issuer="https://idp.example", name="Ada Lovelace", email="Ada@Example.com",
                 username="ada", groups=("approvers",), roles=("approver",)).document()
    assert same_person("00u1ada", "https://idp.example", "ada@example.com", ada)
    assert same_person("ada@example.com", None, "x", ada)  # a trusted header's email, any case
    assert same_person("ADA", None, "x", ada)
    assert not same_person("linus", None, "x", ada)
    assert not same_person(None, None, "ada", ada)  # a call for no one in particular
    assert same_person("ada", None, "ada", None)  # a named token, or the admin token's --as
    approval = {"id": "ap_X", "principal_user": "ada", "principal_issuer": None}
    assert "four eyes" in four_eyes_refusal(approval, "ada@example.com", ada)
    assert four_eyes_refusal({**approval, "principal_user": "linus"}, "ada@example.com", ada) is None


# -- sessions in the store: shared by replicas, refreshed once, ended everywhere -------------------------------------

class Provider:
    """An OidcClient's part PersonSessions uses, answering as a provider would, counting refreshes."""

    provider = "idp.example"
    refresh_every = 0.5

    def __init__(self) -> None:
        self.issuer = type("Issuer", (), {"url": "https://idp.example"})()
        self.refreshes: list[str] = []
        self.groups: tuple[str, ...] = ("approvers",)
        self.down = False
        self.revoked = False

    def person(self) -> Person:
        roles = ("approver",) if "approvers" in self.groups else ()
        return Person(subject="ada", issuer=self.issuer.url, name="Ada Lovelace", email="ada@example.com",
                      username="ada", groups=self.groups, roles=roles)

    async def start(self) -> SignIn:
        return SignIn("state-1", "nonce-1", "verifier-1", "https://idp.example/auth?state=state-1")

    async def redeem(self, code: str, sign_in: SignIn) -> Grant:
        assert (code, sign_in.nonce, sign_in.verifier) == ("code-1", "nonce-1", "verifier-1")
        return Grant(self.person(), "refresh-1", "id-token-1")

    async def refresh(self, refresh_token: str, person: Person) -> Grant:
        if self.down:
            raise IssuerUnavailable("the identity provider at https://idp.example did not answer")
        if self.revoked:
            raise SignInRefused("the identity provider refused: invalid_grant")
        self.refreshes.append(refresh_token)
        await asyncio.sleep(0.2)  # long enough for the other replica to find the lease held
        return Grant(self.person(), f"refresh-{len(self.refreshes) + 1}", None)


def test_people_sessions_are_shared_by_replicas_refreshed_once_and_ended_everywhere(location):
    async def scenario():
        one, two = open_store(location), open_store(location)  # two replicas' stores
        client = Provider()
        first, second = PersonSessions(client, one), PersonSessions(client, two)
        try:
            url, binding = await first.begin("/toolkeeper/queue")
            assert url.startswith("https://idp.example/auth")
            with pytest.raises(SignInRefused, match="another browser"):
                await second.finish("state-1", "code-1", "not-the-binding")
            url, binding = await first.begin("/toolkeeper/queue")
            cookie, person, goto = await second.finish("state-1", "code-1", binding)  # the callback, elsewhere
            assert person.roles == ("approver",) and goto == "/toolkeeper/queue"
            with pytest.raises(SignInRefused, match="already used"):
                await first.finish("state-1", "code-1", binding)
            assert (await first.person(cookie)).name == "Ada Lovelace"
            assert first.csrf(cookie) == second.csrf(cookie) and second.csrf_holds(cookie, first.csrf(cookie))
            (key, sealed), = await one._fetch("SELECT key_sha256, sealed FROM console_sessions")
            assert cookie not in key and b"refresh-1" not in bytes(sealed) and b"id-token-1" not in bytes(sealed)

            await asyncio.sleep(0.6)  # past the refresh window: both replicas serve a request at once
            client.groups = ("approvers", "auditors")
            both = await asyncio.gather(first.person(cookie), second.person(cookie))
            assert client.refreshes == ["refresh-1"]  # one refresh token redeemed once, not once per replica
            assert [p.groups for p in both] == [("approvers", "auditors")] * 2

            await asyncio.sleep(0.6)
            client.down = True
            with pytest.raises(IssuerUnavailable):
                await first.person(cookie)  # never served on groups that could not be read again
            client.down = False
            assert (await second.person(cookie)).roles == ("approver",)  # the lease was let go: tried again
            assert client.refreshes == ["refresh-1", "refresh-2"]  # the provider's new refresh token, kept sealed

            assert await first.end(cookie) == "id-token-1"  # for the provider's sign-out
            assert await second.person(cookie) is None and await first.end(cookie) is None

            url, binding = await first.begin("/toolkeeper/audit")
            cookie, _, _ = await first.finish("state-1", "code-1", binding)
            await asyncio.sleep(0.6)
            client.revoked = True  # the provider ended the grant: so does toolkeeper
            assert await second.person(cookie) is None and await first.person(cookie) is None
        finally:
            await one.close()
            await two.close()

    in_a_thread(scenario())


def in_a_thread(coroutine):
    with concurrent.futures.ThreadPoolExecutor(1) as thread:  # Playwright's loop may run in this one
        return thread.submit(asyncio.run, coroutine).result()


def test_the_client_checks_the_verifier_the_nonce_and_reads_the_person(oidc_provider):
    callback = "http://127.0.0.1:9/toolkeeper/oidc/callback"
    oidc_provider.set_redirects(CONSOLE, [callback])

    async def scenario():
        client = OidcClient(Issuer(oidc_provider.issuer), CONSOLE, CONSOLE_SECRET, redirect_uri=callback,
                            signed_out_uri="http://127.0.0.1:9/toolkeeper/oidc/signed-out",
                            roles={"approvers": {"approver"}, "platform": {"auditor"}},
                            scopes=("openid", "profile", "email", "groups"))
        try:
            async def code_for(user: str) -> tuple[SignIn, str]:
                sign_in = await client.start()
                assert "code_challenge_method=S256" in sign_in.url and sign_in.verifier not in sign_in.url
                final = await asyncio.to_thread(oidc_provider.follow_login, sign_in.url, user)
                answer = urllib.parse.parse_qs(urllib.parse.urlsplit(final).query)
                assert answer["state"] == [sign_in.state]
                return sign_in, answer["code"][0]

            sign_in, code = await code_for("ada")
            with pytest.raises(SignInRefused, match="invalid_grant"):  # PKCE: another verifier redeems nothing
                await client.redeem(code, SignIn(sign_in.state, sign_in.nonce, "x" * 64))
            sign_in, code = await code_for("ada")
            with pytest.raises(TokenRefused, match="nonce"):  # an ID token made for another sign-in
                await client.redeem(code, SignIn(sign_in.state, "another-nonce", sign_in.verifier))
            sign_in, code = await code_for("ada")
            grant = await client.redeem(code, sign_in)
            assert grant.person == Person(subject="ada", issuer=oidc_provider.issuer, name="Ada Lovelace",
                                          email="ada@example.com", username="ada", groups=("platform", "approvers"),
                                          roles=("approver", "auditor"))
            assert grant.refresh_token and grant.id_token
            renewed = await client.refresh(grant.refresh_token, grant.person)
            assert renewed.person == grant.person
            logout = await client.logout_url(grant.id_token)
            assert logout.startswith(oidc_provider.metadata()["end_session_endpoint"] + "?")
            sign_in, code = await code_for("bob")
            with pytest.raises(NoRole) as refused:
                await client.redeem(code, sign_in)
            assert refused.value.wanted == {"approver": ("approvers",), "auditor": ("platform",)}
        finally:
            await client.close()
            await client.issuer.close()

    in_a_thread(scenario())


def test_a_flood_of_sign_ins_begun_is_told_to_wait(scripted, oidc_provider, tmp_path):
    """Each sign-in begun is a row in the store until its callback: one address opening /oidc/login in a loop
    is answered 429 past its share, and fills nothing more."""
    flooded = Console(scripted, tmp_path / "flood", oidc_provider)

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(Stay)
    try:
        statuses = []
        for _ in range(35):
            try:
                with opener.open(flooded.root + "/toolkeeper/oidc/login", timeout=10) as answer:
                    statuses.append(answer.status)
            except urllib.error.HTTPError as refused:
                with refused:
                    statuses.append(refused.code)
                    body = refused.read().decode()
        assert statuses[:30] == [303] * 30 and set(statuses[30:]) == {429}
        assert "Too many sign-ins begun from this address" in body
    finally:
        flooded.stop()
