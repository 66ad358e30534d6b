"""The audit page, in a real headless Chromium: the list, a filter, a detail, and no token, no page."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from conftest import LOOKUP, Toolkeeper, call, start_toolkeeper, user, write_agent

TOKEN = "audit-page-token-31c9"
CHROMIUM = "/usr/bin/chromium"  # Debian's; .ci/run installs it
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
""" + LOOKUP


@pytest.fixture(scope="module")
def audited(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("page")
    write_agent(directory, AGENT)
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    tk = Toolkeeper(process, directory)
    for word in ("fjord", "/home/me/.ssh/id_rsa"):  # one that runs, one the default policy denies
        scripted.script({"tool_calls": [call("lookup", {"word": word})]}, {"content": "ok"})
        tk.client().chat.completions.create(model="m", messages=user())
    tk.close_clients()
    yield tk
    process.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


def sign_in(page, root: str, token: str) -> int:
    response = page.goto(root + "/toolkeeper/audit")
    assert response.status == 401  # nothing without the token
    page.fill("input[name=token]", token)
    with page.expect_navigation() as navigation:
        page.click("button[type=submit]")
    return navigation.value.status


def test_the_page_shows_filters_and_opens_an_execution(audited, browser):
    root = audited.base_url[: -len("/v1")]
    context = browser.new_context()
    page = context.new_page()
    assert sign_in(page, root, TOKEN) == 200
    rows = page.locator("tr.record")
    assert rows.count() == 2
    assert sorted(rows.locator("td.status").all_inner_texts()) == ["denied", "ok"]

    page.select_option("select[name=status]", "denied")
    page.click("button[type=submit]")
    page.wait_for_url("**status=denied**")
    assert page.locator("tr.record").count() == 1
    assert page.locator("tr.record td.status").inner_text() == "denied"

    page.select_option("select[name=status]", "ok")
    page.click("button[type=submit]")
    page.wait_for_url("**status=ok**")
    page.locator("tr.record a").first.click()
    page.wait_for_url("**/toolkeeper/audit/*")
    argv = page.locator("dd[id=argv]").inner_text()
    assert '"lookup"' in argv and '"fjord"' in argv
    assert page.locator("dd[id='arguments as coerced']").inner_text().replace(" ", "").find('"word":"fjord"') >= 0
    assert page.locator("dd[id=decision]").inner_text() == "allow by yolo"
    assert page.locator("dd[id='exit status']").inner_text() == "0"
    assert "ran" in page.locator("dd[id='answer (excerpt)']").inner_text()
    context.close()


def test_no_token_no_page(audited, browser):
    root = audited.base_url[: -len("/v1")]
    context = browser.new_context()
    page = context.new_page()
    response = page.goto(root + "/toolkeeper/audit")
    assert response.status == 401
    assert page.locator("p.refused").inner_text() == "The audit page needs the admin token."
    assert page.locator("tr.record").count() == 0
    assert sign_in(page, root, "wrong-token") == 401
    assert page.locator("p.refused").inner_text() == "That is not the admin token."
    assert page.goto(root + "/toolkeeper/audit/anything").status == 401
    context.close()
    request = urllib.request.Request(root + "/toolkeeper/audit", headers={"Authorization": "Bearer wrong"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    refused.value.close()
    assert refused.value.code == 401
    request = urllib.request.Request(root + "/toolkeeper/audit", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert b"2 executions" in answer.read()


def test_control_and_bidi_characters_are_shown_escaped(scripted, audited):
    word = "safe\u202e.exe\x1b[2J"
    scripted.script({"tool_calls": [call("lookup", {"word": word})]}, {"content": "ok"})
    audited.client().chat.completions.create(model="m", messages=user())
    audited.close_clients()
    root = audited.base_url[: -len("/v1")]
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with urllib.request.urlopen(urllib.request.Request(root + "/toolkeeper/audit", headers=bearer)) as answer:
        listing = answer.read().decode()
    record_id = listing.split("/toolkeeper/audit/", 1)[1].split("'", 1)[0]
    with urllib.request.urlopen(urllib.request.Request(f"{root}/toolkeeper/audit/{record_id}",
                                                       headers=bearer)) as answer:
        detail = answer.read().decode()
    assert "\u202e" not in detail and "\x1b" not in detail
    assert "safe\\u202e.exe" in detail  # shown as an escape, never as the character
