"""Hardening, round two: what a second red team and the acceptance checks found, each with its test."""

from __future__ import annotations

import json

import pytest
from conftest import call, serving, user
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
