"""The proxy around the tool loop: pass-through, credentials, keep-alives, consent, tool_choice, demo."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import openai
import pytest
from conftest import GATED, LOOKUP, RELEASE, call, serving, start_toolkeeper, user, write_agent
from test_failures import raw_post


def test_other_endpoints_pass_through_untouched(scripted, tk):
    client = tk.client()
    models = client.models.list()
    assert [m.id for m in models.data] == ["scripted-model"]
    embedding = client.embeddings.create(model="e", input="hello")
    assert embedding.data[0].embedding == [0.25, -0.5, 0.125]
    # and an unknown path keeps the upstream's own 404
    with pytest.raises(openai.NotFoundError):
        client.files.list()


def test_the_agents_authorization_goes_upstream(scripted, tk):
    scripted.script({"content": "hi"})
    tk.client().chat.completions.create(model="m", messages=user())
    assert scripted.requests()[0]["headers"]["Authorization"] == "Bearer sk-test-agent"


def test_api_key_env_replaces_the_agents_key(scripted, tmp_path):
    path = write_agent(tmp_path, """
        upstream: http://127.0.0.1:9/v1
        api_key_env: TK_UPSTREAM_KEY
        yolo: true
        agents:
          - {name: the-agent, key_sha256: "{key}"}
        tools: []
    """, key=hashlib.sha256(b"sk-agent").hexdigest())
    process = start_toolkeeper(path, scripted.base_url, env={"TK_UPSTREAM_KEY": "sk-upstream-secret"})
    try:
        scripted.script({"content": "hi"})
        from openai import OpenAI

        with OpenAI(base_url=process.url, api_key="sk-agent", max_retries=0) as client:
            client.chat.completions.create(model="m", messages=user())
            client.models.list()
    finally:
        log = process.stop()
    first, = scripted.requests()
    assert first["headers"]["Authorization"] == "Bearer sk-upstream-secret"
    assert "sk-upstream-secret" not in log and "sk-agent" not in log


def _content(sse: str) -> str:
    chunks = [json.loads(e[len("data: "):]) for e in sse.split("\n\n") if e.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_keep_alive_comments_while_a_tool_runs(scripted, tk):
    scripted.script({"content": "Napping. ", "tool_calls": [call("nap", {"seconds": 1})]}, {"content": "Awake."})
    status, data = raw_post(tk, {"model": "m", "messages": user(), "stream": True})
    assert status == 200
    text = data.decode()
    before, after = text.split(": keep-alive\n\n", 1)
    # the comments sit between the text before the call and the answer after it
    assert _content(before) == "Napping. "
    assert _content(after) == "Awake."
    assert text.count(": keep-alive") >= 3  # every 0.2 s here
    assert text.endswith("data: [DONE]\n\n")


def test_a_rounds_last_text_reaches_the_agent_before_its_declared_call_runs(scripted, agent_dir):
    """The end of a round is held for the turn's next event only (one send with the answer's end): when that
    event is a declared call's start, the text goes out before the call runs, keep-alives or not."""
    with serving(scripted, agent_dir, "--keepalive", "60") as tk:
        scripted.script({"content": "Napping. ", "tool_calls": [call("nap", {"seconds": 2})]}, {"content": "Awake."})
        started, text, seen = time.monotonic(), "", {}
        for chunk in tk.client().chat.completions.create(model="m", messages=user(), stream=True):
            text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            for wanted in ("Napping. ", "Napping. Awake."):
                if text == wanted:
                    seen[wanted] = time.monotonic() - started
        tk.close_clients()
    assert seen["Napping. "] < 1.0 and seen["Napping. Awake."] > 2.0, seen


def test_tool_choice_none_injects_nothing(scripted, tk):
    scripted.script({"content": "plain"})
    answer = tk.client().chat.completions.create(model="m", messages=user(), tool_choice="none")
    assert answer.choices[0].message.content == "plain"
    assert "tools" not in scripted.bodies()[0]


def test_forced_declared_call_is_followed_by_auto(scripted, tk):
    scripted.script({"tool_calls": [call("lookup", {"word": "x"})]}, {"content": "done"})
    tk.client().chat.completions.create(model="m", messages=user(),
                                        tool_choice={"type": "function", "function": {"name": "lookup"}})
    first, second = scripted.bodies()
    assert first["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert second["tool_choice"] == "auto"


@pytest.fixture(scope="module")
def gated(scripted, tmp_path_factory):
    """A toolkeeper with yolo: false and no terminal: every ask is a deny."""
    directory = tmp_path_factory.mktemp("gated")
    path = write_agent(directory, GATED + RELEASE + LOOKUP + "        tier: silent\n")
    process = start_toolkeeper(path, scripted.base_url)
    yield process, directory
    process.stop()


def test_without_a_consent_channel_a_gated_tool_is_denied(scripted, gated):
    process, directory = gated
    scripted.script(
        {"tool_calls": [call("release", {"version": "9.9.9"}), call("lookup", {"word": "fine"})]},
        {"content": "I could not release it."},
    )
    from openai import OpenAI

    with OpenAI(base_url=process.url, api_key="k", max_retries=0) as client:
        answer = client.chat.completions.create(model="m", messages=user())
    assert answer.choices[0].message.content == "I could not release it."
    calls = (directory / "calls.jsonl").read_text().splitlines()
    assert calls == ['["lookup", "fine"]']  # the silent tool ran, the gated one did not
    results = [m["content"] for m in scripted.bodies()[1]["messages"] if m["role"] == "tool"]
    assert results[0].startswith("Not run: release was not allowed (a gated tool, and yolo: false; it needs a "
                                 "person's approval and no approver was available")
    assert "Do not call it again unless the user asks you to" in results[0]


def test_demo_runs_and_prints_the_argv(tmp_path):
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "demo"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert '"name": "release"' in out  # the schema the model received
    assert 'argv that ran:   ["./release.sh", "1.4.2", "--channel=beta", "--notes=Faster search"]' in out
    assert "release 1.4.2 published to beta" in out
    assert "tool calls the agent saw: 0" in out
