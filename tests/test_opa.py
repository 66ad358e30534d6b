"""The security team's Rego, through OPA's Data API: decisions followed, every fault a deny."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import LOOKUP, ROOT, Toolkeeper, call, fresh, start_toolkeeper, user, write_agent

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
""" + LOOKUP + """      - name: force_push
        description: Force-push a branch.
        parameters:
          branch: {type: string, description: "The branch."}
        command: ["{python}", "{tools}/record.py", "push", "--force", "{{branch}}"]
        env: {OUT: "{out}"}
"""


def set_mode(opa, mode: str) -> None:
    request = urllib.request.Request(opa.url + "/_mode", data=json.dumps({"mode": mode}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


@pytest.fixture(scope="module")
def tk_opa_server(scripted, opa, tmp_path_factory):
    directory = tmp_path_factory.mktemp("opa")
    write_agent(directory, AGENT)
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--opa-url", opa.url,
                               "--opa-timeout", "0.5")
    yield Toolkeeper(process, directory)
    process.stop()


@pytest.fixture
def tko(tk_opa_server, opa):
    set_mode(opa, "normal")
    yield from fresh(tk_opa_server)
    set_mode(opa, "normal")


def answer_to(scripted, tk, name: str, arguments: dict) -> str:
    scripted.script({"tool_calls": [call(name, arguments)]}, {"content": "ok"})
    tk.client().chat.completions.create(model="m", messages=user())
    return next(m["content"] for m in scripted.bodies()[1]["messages"] if m["role"] == "tool")


def test_opa_allow_lets_the_call_run(scripted, tko):
    assert answer_to(scripted, tko, "lookup", {"word": "fjord"}).startswith("ran")
    assert tko.calls() == [["lookup", "fjord"]]


def test_opa_deny_is_followed_with_its_reason(scripted, tko):
    answer = answer_to(scripted, tko, "lookup", {"word": "/root/.aws/credentials"})
    assert answer.startswith("Not run: lookup was not allowed (The call names a credential file")
    assert tko.calls() == []


def test_opa_ask_holds_in_yolo(scripted, tko):
    answer = answer_to(scripted, tko, "force_push", {"branch": "main"})
    assert "no approver was available" in answer  # OPA said ask; yolo cannot lift it; no one could be asked
    assert tko.calls() == []


@pytest.mark.parametrize(("mode", "cause"), [
    ("undefined", "OPA has no decision at data/toolkeeper/decision for this input (undefined)"),
    ("error", "OPA failed: status 500"),
    ("slow", "OPA did not answer within 0.5 s"),
    ("garbage", "OPA failed"),
])
def test_every_opa_fault_is_a_deny(scripted, tko, opa, mode, cause):
    set_mode(opa, mode)
    started = time.monotonic()
    answer = answer_to(scripted, tko, "lookup", {"word": "fjord"})
    assert answer.startswith(f"Not run: lookup was not allowed (the policy could not be evaluated: {cause}")
    assert tko.calls() == []
    assert time.monotonic() - started < 4  # a slow OPA costs its timeout, not a hung call


def test_policy_test_runs_the_shipped_scenarios_against_opa_too(opa):
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "policy", "test", "policies/default_scenarios.yaml",
                          "--opa-url", opa.url], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"PASS [OPA {opa.url}] release notes naming an SSH key are denied, even in yolo: deny " \
           "(rule credentials-never" in run.stdout
    assert "scenarios: 12 passed, 0 failed" in run.stdout


def test_policy_explain_against_opa_names_rule_decision_and_bundle(opa):
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "policy", "explain", "declared/example/agent.yaml",
                          "read_note", "name=.env", "--opa-url", opa.url], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "decision: deny (rule credentials-never" in run.stdout
    assert "decision id " in run.stdout and "bundles toolkeeper@" in run.stdout
