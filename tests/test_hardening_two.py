"""Hardening, round two: what a second red team and the acceptance checks found, each with its test."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from conftest import STANDARD_AGENT, call, serving, user, write_agent
from test_governed import send


@pytest.fixture(scope="module")
def hardened(scripted, agent_dir):
    with serving(scripted, agent_dir, "--store", ":memory:", env={"TOOLKEEPER_INTERCEPT_SECRET": "s3cret"}) as tk:
        yield tk


# 1. A lone surrogate in a model's arguments is an invalid call, answered; never a 500.
@pytest.mark.parametrize("value", ["\\ud800", "\\ud800-5", "\\udfff tail"])
def test_a_lone_surrogate_in_the_arguments_is_answered_as_an_invalid_call(scripted, hardened, value):
    arguments = '{"word": "' + value + '"}'
    scripted.script({"tool_calls": [{"name": "lookup", "arguments": arguments, "id": "call_sur"}]},
                    {"content": "{tool_result}"})
    status, answer = send(hardened, "POST", "/v1/chat/completions", {"model": "m", "messages": user()})
    assert status == 200, answer
    said = answer["choices"][0]["message"]["content"]
    assert "not valid text" in said and "lookup" in said
    assert hardened.calls() == []  # nothing ran


# 2. A signed-header time that is no number toolkeeper can sign is refused, as a forged header is.
@pytest.mark.parametrize("stamp", ["inf", "1e400", "-inf", "nan"])
def test_an_intercept_header_with_an_impossible_time_is_refused_not_a_500(scripted, hardened, stamp):
    status, answer = send(hardened, "POST", "/v1/chat/completions", {"model": "m", "messages": user()},
                          {"X-Toolkeeper-Upstream": f"http://127.0.0.1:9/v1 {stamp} abc"})
    assert status == 400 and answer["error"]["code"] == "upstream_not_allowed"
    assert "malformed" in answer["error"]["message"]


# 3. A filter that does not parse is refused by the export and shown on the page, never left out.
ADMIN = "hardening-admin-token-0123456789abcdef"


@pytest.fixture(scope="module")
def audited(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("audited")
    write_agent(directory, STANDARD_AGENT)
    with serving(scripted, directory, "--store", ":memory:", "--audit", str(directory / "audit.sqlite3"),
                 env={"TOOLKEEPER_ADMIN_TOKEN": ADMIN}) as tk:
        yield tk


def admin_get(tk, path: str) -> tuple[int, str]:
    request = urllib.request.Request(tk.base_url[:-3] + path, headers={"Authorization": f"Bearer {ADMIN}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode()


@pytest.mark.parametrize("query", ["status=okk", "source=agnt", "since=yesterday-ish", "until=1e400", "last=2w"])
def test_a_filter_that_does_not_parse_is_refused_never_ignored(audited, query):
    status, text = admin_get(audited, f"/toolkeeper/audit/export?format=jsonl&{query}")
    assert status == 400 and query.split("=")[0] in text and "do not parse" in text
    status, text = admin_get(audited, f"/toolkeeper/audit?{query}")
    assert status == 400 and "id=problems" in text and query.split("=")[0] in text


def test_the_filters_that_parse_still_filter(scripted, audited):
    scripted.script({"tool_calls": [call("lookup", {"word": "ok"})]}, {"content": "done"})
    send(audited, "POST", "/v1/chat/completions", {"model": "m", "messages": user()})
    status, text = admin_get(audited, "/toolkeeper/audit/export?format=jsonl&status=ok&source=declared&last=1h")
    assert status == 200 and [json.loads(line)["tool"] for line in text.splitlines()] == ["lookup"]
